"""Issue 24: many streams' stats, tails, stored offsets and StoreOffsets over one connection, with
the requests in flight together (``Connection.pipeline``), against the real 4.3 broker."""

from __future__ import annotations

import pytest

from streamledger.protocol.rabbitmq import StreamClient, StreamNotFound
from tests.support.rabbitmq import Broker, StreamNames

pytestmark = pytest.mark.rabbitmq


def test_many_streams_at_once_answer_as_one_at_a_time(broker_43: Broker, stream_name: StreamNames) -> None:
    name = stream_name.super_stream("many")
    with StreamClient.connect(broker_43.url) as client:
        client.create_super_stream(name, partitions=40)
        parts = client.partitions(name)
        for i, part in enumerate(parts):
            client.publish(part, [b"x"] * (i % 5))
        client.store_offset(parts[3], "ref", 2)
        client.store_offset_verified(parts[3], "ref", 2)
        # 40 streams x 2 questions in flight with a window of 256 (and answers out of any order)
        tails = client.committed_tails(parts)
        firsts = client.first_offsets(parts)
        stored = client.query_offsets(parts, "ref")
        assert tails == {p: client.committed_tail(p) for p in parts}
        assert firsts == {p: client.first_offset(p) for p in parts}
        assert stored == {p: (2 if p == parts[3] else None) for p in parts}
        assert client.stream_stats_many(parts[:2]).keys() == {parts[0], parts[1]}
        # StoreOffsets written together, read back together
        targets = {p: tails[p] - 1 for p in parts if tails[p] > 0}
        client.store_offsets_verified(targets, "ref", timeout=10)
        assert client.query_offsets(list(targets), "ref") == targets
        # the connection still serves one-at-a-time requests after the pipelined ones
        assert client.partitions(name) == parts
        # a missing stream raises the same error as the single request does
        with pytest.raises(StreamNotFound):
            client.query_offsets([parts[0], f"{name}-missing"], "ref")


def test_pooled_reads_share_one_member_connection_and_stay_exact(broker_43: Broker,
                                                                 stream_name: StreamNames) -> None:
    """Many small reads (a batch's probe, a packed Spark task) subscribe on one kept connection:
    each read still yields exactly its range, also after an earlier read was stopped early."""
    name = stream_name.super_stream("pool")
    with StreamClient.connect(broker_43.url) as client:
        client.create_super_stream(name, partitions=6)
        parts = client.partitions(name)
        for i, part in enumerate(parts):
            client.publish(part, [f"{part}:{j}".encode() for j in range(5 + i)])
        want = {p: [x for b in client.read_range(p, 0, client.committed_tail(p)) for x in b.bodies]
                for p in parts}
        with client.pooled_reads():
            seen: set[int] = set()
            for rnd in range(2):
                for part in parts:
                    # stop one read after its first batch of one record: the connection is still reused
                    early = client.read_range(part, 0, client.committed_tail(part), max_batch_records=1)
                    first = next(iter(early))
                    early.close()  # type: ignore[attr-defined]
                    assert first.bodies == want[part][:1]
                    got = [x for b in client.read_range(part, 1, client.committed_tail(part))
                           for x in b.bodies]
                    assert got == want[part][1:], (rnd, part)
                    assert client.member_pool is not None and len(client.member_pool) == 1
                    seen |= {id(c) for c in client.member_pool.values()}
            assert len(seen) == 1  # one connection served all 24 reads
            kept = next(iter(client.member_pool.values()))
        assert client.member_pool is None and kept.closed
