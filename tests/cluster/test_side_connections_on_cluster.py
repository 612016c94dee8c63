"""Issue 44 (red team): a ResolveOffsetSpec round spread over side connections when the URL names a
load balancer in front of the 3-node cluster, so each side connection lands on another member than
the main connection (and on nodes that hold no member of a one-member stream). The idle probe right
after a store, with records published behind the tracking chunk while the replicas catch up, must
count what a read counts."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from streamledger.protocol.amqp10 import Management, StreamOptions
from streamledger.protocol.rabbitmq import StreamClient
from tests.cluster.conftest import Cluster
from tests.support.balancer import RoundRobin

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def balancer(cluster: Cluster) -> Iterator[RoundRobin]:
    lb = RoundRobin([cluster.stream_port(n) for n in (1, 2, 3)])
    try:
        yield lb
    finally:
        lb.close()


def _streams(cluster: Cluster) -> list[str]:
    """Nine 3-member streams (leaders on each node) and three one-member streams (one per node)."""
    names = []
    for size in (3, 3, 3, 1):
        for node in (1, 2, 3):
            name = f"t-side-{size}-{uuid.uuid4().hex[:8]}"
            options = StreamOptions(initial_cluster_size=size, leader_locator="client-local")
            with Management.connect(cluster.amqp_url(node)) as m:
                m.declare_stream(name, options)
            names.append(name)
    return names


def test_a_spread_probe_through_a_load_balancer_counts_what_a_read_counts_on_every_member(
        cluster: Cluster, balancer: RoundRobin) -> None:
    names = _streams(cluster)
    try:
        with StreamClient.connect(cluster.stream_url(1)) as direct, \
                StreamClient.connect(f"rabbitmq-stream://guest:guest@127.0.0.1:{balancer.port}/") as client:
            client.spread_at, client.side_connections = 4, 3
            nxt = dict.fromkeys(names, 0)  # the next offset of each stream, as published
            reached: set[tuple[str, int] | None] = set()
            for rnd in range(6):
                for i, name in enumerate(names):
                    direct.publish(name, [b"r%d" % j for j in range(3)])
                    direct.store_offset(name, "p", nxt[name] + 2)  # a tracking chunk (not waited for)
                    if (i + rnd) % 2:
                        direct.publish(name, [b"late"])  # right behind it, replicas catching up
                starts = {n: nxt[n] + 3 for n in names}
                tails, stats = client.tails_with_stats(names)
                ranges = {n: (starts[n], max(starts[n], tails[n])) for n in names}
                got = client.user_records_many(ranges, by_last_chunk=True, stats=stats)
                reached |= {conn.advertised_address for conn in client.last_side}
                want = {n: min(1, sum(len(b) for b in direct.read_range(n, a, e, decode="raw",
                                                                        prefer="leader")))
                        if a < e else 0 for n, (a, e) in ranges.items()}
                assert got == want, rnd
                deadline = time.monotonic() + 10
                for name in names:  # the next round starts after this one's chunks (the late record may
                    while direct.committed_tail(name) < starts[name] + 1:  # carry the tracking entry)
                        assert time.monotonic() < deadline, name
                        time.sleep(0.05)
                time.sleep(0.3)
                nxt = direct.committed_tails(names)
            ports = {client.connection.advertised_address, *reached}
            assert len(ports) == 3, ports  # the rounds reached every node
    finally:
        with Management.connect(cluster.amqp_url(1)) as m:
            for name in names:
                m.delete_queue(name)
