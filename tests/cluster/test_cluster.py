"""A real 3-node RabbitMQ 4.3 cluster: streams with three replicas, reads served by a replica at its
advertised address, a member stopped mid-read, publishing through a node that is not the leader."""

from __future__ import annotations

import logging
import re
import time
import uuid

import pytest

from streamledger.protocol.amqp10 import Management, StreamOptions
from streamledger.protocol.rabbitmq import StreamClient
from tests.cluster.conftest import Cluster

pytestmark = pytest.mark.rabbitmq
PAD = b"x" * 200


def _stream(cluster: Cluster, node: int = 1) -> str:
    """A 3-replica stream whose leader is on ``node`` (client-local, declared through that node)."""
    name = f"t-cluster-{uuid.uuid4().hex[:8]}"
    with Management.connect(cluster.amqp_url(node)) as m:
        info = m.declare_stream(name, StreamOptions(initial_cluster_size=3, leader_locator="client-local"))
    assert info.leader == f"rabbitc{node}@localhost"
    return name


def _delete(cluster: Cluster, name: str) -> None:
    with Management.connect(cluster.amqp_url(1)) as m:
        m.delete_queue(name)


def _served_by(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, str]]:
    found = re.findall(rf"reading stream '{re.escape(name)}' from 127\.0\.0\.1:(\d+) \((\w+)\)", caplog.text)
    return [(int(port), role) for port, role in found]


def test_metadata_and_amqp_agree_on_three_members(cluster: Cluster) -> None:
    name = _stream(cluster, node=2)
    try:
        with Management.connect(cluster.amqp_url(3)) as m:
            info = m.get_queue(name)
            assert m.connection.server_properties["cluster_name"] == "streamledger-cluster"
        assert info.leader == "rabbitc2@localhost"
        assert sorted(info.members) == ["rabbitc1@localhost", "rabbitc2@localhost", "rabbitc3@localhost"]
        with StreamClient.connect(cluster.stream_url(1)) as client:
            md = client.metadata([name])[name]
        assert md.leader == ("127.0.0.1", 5602)  # the advertised address of rabbitc2
        assert sorted(md.replicas) == [("127.0.0.1", 5601), ("127.0.0.1", 5603)]
    finally:
        _delete(cluster, name)


def test_exact_range_read_is_served_by_a_replica(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    name = _stream(cluster, node=1)
    caplog.set_level(logging.INFO, logger="streamledger.rabbitmq")
    try:
        with StreamClient.connect(cluster.stream_url(1)) as client:
            client.publish(name, (b"%06d" % i + PAD for i in range(20_000)), amqp=False, batch_size=200)
            tail = client.committed_tail(name)
            assert tail == 20_000
            batches = list(client.read_range(name, 123, 19_877, decode="raw"))
        offsets = [o for b in batches for o in b.offsets]
        assert offsets == list(range(123, 19_877))
        assert [x for b in batches for x in b.bodies] == [b"%06d" % i + PAD for i in range(123, 19_877)]
        served = _served_by(caplog, name)
        assert len(served) == 1 and served[0][1] == "replica" and served[0][0] in (5602, 5603)

        caplog.clear()
        with StreamClient.connect(cluster.stream_url(3)) as client:
            leader_read = list(client.read_range(name, 0, 10, decode="raw", prefer="leader"))
        assert [o for b in leader_read for o in b.offsets] == list(range(10))
        assert _served_by(caplog, name) == [(5601, "leader")]
    finally:
        _delete(cluster, name)


def test_node_stopped_mid_read_the_read_completes_exactly_from_another_member(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    name = _stream(cluster, node=1)
    caplog.set_level(logging.INFO, logger="streamledger.rabbitmq")
    stopped: int | None = None
    try:
        with StreamClient.connect(cluster.stream_url(1)) as client:
            client.publish(name, (b"%06d" % i + PAD for i in range(60_000)), amqp=False, batch_size=200)
            tail = client.committed_tail(name)
            it = client.read_range(name, 7, tail, decode="raw", credit=2, max_batch_records=1_000)
            batches = [next(it)]  # the read is under way on a replica
            (port, role), = _served_by(caplog, name)
            assert role == "replica"
            stopped = cluster.node_of_port(port)
            cluster.stop_node(stopped)  # the member serving the read goes away mid-read
            batches += list(it)
        offsets = [o for b in batches for o in b.offsets]
        assert offsets == list(range(7, 60_000))  # nothing lost, nothing repeated
        assert [x for b in batches for x in b.bodies] == [b"%06d" % i + PAD for i in range(7, 60_000)]
        assert "lost its connection at offset" in caplog.text
        served = _served_by(caplog, name)
        assert len(served) == 2 and served[1][0] != port  # resumed on another member
    finally:
        if stopped is not None:
            cluster.start_node(stopped)
        _delete(cluster, name)


def test_publishing_through_a_node_that_is_not_the_leader(cluster: Cluster) -> None:
    name = _stream(cluster, node=1)
    try:
        with StreamClient.connect(cluster.stream_url(3)) as client:  # rabbitc3 holds only a replica
            result = client.publish(name, [b"via-replica-%d" % i for i in range(500)])
            assert result.confirmed == 500
            # StreamStats comes from the member on the node asked: right after a member (re)starts it
            # can lag behind the confirms (a lower bound: safe, never past what is committed).
            deadline = time.monotonic() + 15
            while (tail := client.committed_tail(name)) < 500 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert tail == 500
            bodies = [x for b in client.read_range(name, 0, tail, prefer="leader") for x in b.bodies]
        assert bodies == [b"via-replica-%d" % i for i in range(500)]
    finally:
        _delete(cluster, name)


def test_a_url_whose_node_is_stopped_reads_through_the_nodes_it_names(cluster: Cluster) -> None:
    """The node a URL names is stopped: with ``nodes=`` naming the other two, the client connects
    through the next node, and a stream whose leader was on the stopped node is read in full from a
    remaining member (its replicas elect a new leader)."""
    name = _stream(cluster, node=1)
    with StreamClient.connect(cluster.stream_url(1)) as client:
        client.publish(name, (b"%05d" % i for i in range(500)), amqp=False, batch_size=100)
    url = cluster.stream_url(1) + "?nodes=" + ",".join(f"127.0.0.1:{cluster.stream_port(n)}" for n in (2, 3))
    cluster.stop_node(1)
    try:
        with StreamClient.connect(url) as client:
            assert client.connection.params.port == cluster.stream_port(2)
            deadline = time.monotonic() + 60
            while True:  # until the survivors have a leader for it
                try:
                    tail = client.committed_tail(name)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
            got = [x for b in client.read_range(name, 0, tail, decode="raw") for x in b.bodies]
        assert got == [b"%05d" % i for i in range(500)]
    finally:
        cluster.start_node(1)
        _delete(cluster, name)
