"""Issue 24: many streams' stats, tails, stored offsets and StoreOffsets over one connection, with
the requests in flight together (``Connection.pipeline``), against the real 4.3 broker."""

from __future__ import annotations

import time
from typing import Any

import pytest

from streamledger.protocol.rabbitmq import OffsetOutOfRange, StreamClient, StreamNotFound
from tests.support.rabbitmq import Broker, StreamNames

pytestmark = pytest.mark.rabbitmq


def count_commands(client: StreamClient, asked: list[int]) -> None:
    """From now on, append the command key of every frame ``client`` sends to ``asked``."""
    conn = client.connection
    send = conn.send

    def counting(frame: Any) -> None:
        view, i = memoryview(bytes(frame)), 0
        while i + 6 <= len(view):
            asked.append(int.from_bytes(view[i + 4:i + 6], "big"))
            i += 4 + int.from_bytes(view[i:i + 4], "big")
        send(frame)

    conn.send = counting  # type: ignore[method-assign]


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


def test_chunk_headers_and_user_records_of_many_streams_at_once(broker_43: Broker,
                                                                 stream_name: StreamNames) -> None:
    """Issue 32: a batch asks every partition for one chunk header (the fingerprint check, the
    fingerprint taken at commit) and whether a range holds a user record (the probe of tracking-only
    ranges); asked of many streams together over one connection, the answers are those of one
    stream at a time, whatever the layout of user and tracking chunks."""
    from tests.integration.rabbitmq.test_read_range import _layout

    names = [stream_name(f"many-{i}") for i in range(3)]
    with StreamClient.connect(broker_43.url) as client:
        for name in names:
            _layout(client, name)  # user chunks 0..9, 10..19, 21..30; tracking chunks 20, 31, 32
        tail = client.committed_tail(names[0])
        assert tail == 33
        wanted = [(n, o) for n in names for o in (0, 5, 10, 19, 20, 21, 30, 31, 32, 33, 40)]
        heads = client.chunks_at(wanted)
        assert heads == {(n, o): client.chunk_at(n, o) for n, o in wanted}
        assert heads[(names[0], 20)] is None and heads[(names[1], 30)].first_offset == 21  # type: ignore[union-attr]
        cases = [(0, tail), (20, 21), (20, 22), (31, 33), (31, 32), (32, 33), (19, 20), (30, 33), (5, 5)]
        for need in (1, 3):
            for start, end in cases:
                ranges = {n: (start, end) for n in names}
                expected = {n: min(need, sum(len(b) for b in client.read_range(n, start, end, decode="raw")))
                            for n in names}
                assert client.user_records_many(ranges, need=need) == expected, (start, end, need)
        # one range per stream, different ones together; more streams than one window of subscriptions
        mixed = {names[0]: (20, 21), names[1]: (31, 33), names[2]: (19, 22)}
        assert client.user_records_many(mixed) == {names[0]: 0, names[1]: 0, names[2]: 1}
        assert client.user_records_many(mixed, window=1) == {names[0]: 0, names[1]: 0, names[2]: 1}
        assert client.chunks_at(wanted, window=2) == heads
        # an end past the tail is refused as read_range refuses it
        with pytest.raises(OffsetOutOfRange):
            client.user_records_many({names[0]: (0, tail + 1)})
        # the connection still serves one-at-a-time requests afterwards
        assert client.chunk_at(names[0], 0).first_offset == 0  # type: ignore[union-attr]


def test_a_tracking_chunk_at_the_tail_is_told_without_a_subscription(broker_43: Broker,
                                                                     stream_name: StreamNames) -> None:
    """Issue 32: the first idle batch after a batch that stored its offsets asks every partition
    whether the tracking chunk that StoreOffset wrote holds a user record. On 4.3 the answer needs no
    subscription (a chunk begins there, the last user chunk begins before it), and a one-record user
    chunk in the same place is still counted: the answers are read_range's."""
    from streamledger.protocol.rabbitmq import constants as c

    names = [stream_name(f"tracking-{i}") for i in range(3)]
    with StreamClient.connect(broker_43.url) as client:
        for name in names:
            client.create_stream(name)
            client.publish(name, [b"r%d" % i for i in range(10)], batch_size=5)  # chunks 0..4, 5..9
            client.store_offset_verified(name, "p", 9)  # a tracking chunk at 10
        client.publish(names[2], [b"one"])  # a one-record user chunk at 11, after the tracking chunk
        asked: list[int] = []
        count_commands(client, asked)
        assert client.user_records_many({n: (10, 11) for n in names[:2]}) == dict.fromkeys(names[:2], 0)
        assert c.SUBSCRIBE not in asked, [c.command_name(k) for k in asked]
        del asked[:]
        # a range from inside the stream, a user chunk at the start, a tracking chunk that is not
        # the last chunk: subscribed to, as before
        cases = {names[0]: (10, 11), names[1]: (5, 11), names[2]: (11, 12)}
        want = {n: min(1, sum(len(b) for b in client.read_range(n, a, b, decode="raw")))
                for n, (a, b) in cases.items()}
        assert want == {names[0]: 0, names[1]: 1, names[2]: 1}
        del asked[:]
        assert client.user_records_many(cases) == want
        assert asked.count(c.SUBSCRIBE) == 2, [c.command_name(k) for k in asked]
        assert client.user_records_many({names[2]: (10, 11)}) == {names[2]: 0}
        assert client.user_records_many({names[2]: (10, 12)}) == {names[2]: 1}


def test_fingerprints_of_many_streams_at_once_tell_a_recreated_one(broker_43: Broker,
                                                                   stream_name: StreamNames) -> None:
    """The batch takes every partition's fingerprint at commit and checks them all in its plan
    together (``take_prints``/``same_streams``): the answers are those of one stream at a time,
    and a stream deleted and re-created with as many records is told apart."""
    from streamledger.offsets import same_stream, same_streams, take_print, take_prints

    names = [stream_name(f"print-{i}") for i in range(3)]
    with StreamClient.connect(broker_43.url) as client:
        for name in names:
            client.create_stream(name)
            client.publish(name, [b"a", b"b", b"c"], batch_size=3)
        prints = take_prints(client, {n: 2 for n in names})
        assert prints == {n: take_print(client, n, 2) for n in names}
        # no chunk holds offset 7: left out
        assert take_prints(client, {names[0]: 2, names[1]: 7}) == {names[0]: prints[names[0]]}
        client.delete_stream(names[1])
        client.create_stream(names[1])
        client.publish(names[1], [b"x", b"y", b"z"], batch_size=3)
        assert same_streams(client, prints) == {names[0]: True, names[1]: False, names[2]: True}
        assert same_streams(client, prints) == {n: same_stream(client, n, p) for n, p in prints.items()}


def test_a_probe_of_many_streams_ignores_a_deleted_streams_notice_for_another_stream(
    broker_43: Broker, stream_name: StreamNames
) -> None:
    """A long-lived client (the batch's) holds a publisher on a stream another client deletes: the
    broker's MetadataUpdate for that stream must not stop a later probe of other streams."""
    from streamledger.protocol.rabbitmq import constants as c
    from streamledger.protocol.rabbitmq.wire import declare_publisher_frame

    gone, kept = stream_name("gone"), stream_name("kept")
    with StreamClient.connect(broker_43.url) as client, StreamClient.connect(broker_43.url) as other:
        client.create_stream(gone)
        client.create_stream(kept)
        client.publish(kept, [b"a", b"b"])
        conn = client.connection
        corr = conn.next_corr()
        conn.call(c.DECLARE_PUBLISHER, corr, declare_publisher_frame(corr, 7, "", gone), timeout=10)
        other.delete_stream(gone)
        deadline = time.monotonic() + 10
        while not conn.metadata_updates and time.monotonic() < deadline:
            client.committed_tail(kept)  # a call reads the broker's notice off the socket
        assert [name for _code, name in conn.metadata_updates] == [gone]
        # the notice came before the probes and names another stream: not theirs to stop on
        assert client.user_records_many({kept: (0, 2)}) == {kept: 1}
        headers = client.chunks_at([(kept, 0)])
        assert headers[(kept, 0)] is not None and headers[(kept, 0)].first_offset == 0


def _records(batches: Any) -> list[tuple[int, bytes]]:
    return [(o, bytes(body)) for b in batches for o, body in zip(b.offsets, b.bodies, strict=True)]


def test_many_small_ranges_read_at_once_equal_read_range_of_each(broker_43: Broker,
                                                                 stream_name: StreamNames) -> None:
    """Issue 32: a Spark task holding many small ranges reads them through subscriptions in flight
    together on one connection; every range's records are those read_range yields (offsets and
    bodies), ranges starting and ending mid-chunk, across tracking chunks, and empty ones included,
    in either layout and with a window smaller than the ranges."""
    from tests.integration.rabbitmq.test_read_range import _layout

    names = [stream_name(f"rr-{i}") for i in range(4)]
    with StreamClient.connect(broker_43.url) as client:
        for name in names:
            _layout(client, name)  # user chunks 0..9, 10..19, 21..30; tracking chunks 20, 31, 32
        tail = client.committed_tail(names[0])
        spans = [(0, tail), (3, 7), (5, 15), (9, 11), (20, 21), (19, 22), (25, 31), (31, tail), (5, 5)]
        ranges = [(n, s, e) for n in names for s, e in spans]
        want = [_records(client.read_range(n, s, e)) for n, s, e in ranges]
        for window in (255, 5):
            got: list[list[tuple[int, bytes]]] = [[] for _ in ranges]
            order = []
            for i, batch in client.read_ranges(ranges, window=window):
                assert batch.stream == ranges[i][0]
                got[i] += _records([batch])
                order.append(i)
            assert got == want, window
            assert order == sorted(order)  # range by range, in the order asked
        buffers = [[] for _ in ranges]  # type: list[list[int]]
        for i, batch in client.read_ranges(ranges, layout="buffers", decode="raw", window=7):
            buffers[i] += [s + k for s, n in zip(batch.run_starts, batch.run_lengths, strict=True)
                           for k in range(n)]
        assert buffers == [[o for o, _ in w] for w in want]
        # max_batch_records holds as in read_range
        assert all(len(b) <= 4 for _i, b in client.read_ranges(ranges[:3], max_batch_records=4))
        # the client's connection still serves one-at-a-time requests afterwards
        assert client.committed_tail(names[0]) == tail


def test_many_ranges_refuse_retention_and_a_deleted_stream_as_read_range(broker_43: Broker,
                                                                         stream_name: StreamNames) -> None:
    """A range whose start retention removed raises the DataLossError read_range raises (naming the
    stream and offset); a deleted stream the error read_range raises; both before any record."""
    from streamledger.protocol.rabbitmq import DataLossError

    kept, trimmed, gone = stream_name("rr-kept"), stream_name("rr-trim"), stream_name("rr-gone")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(kept)
        client.publish(kept, [b"k%d" % i for i in range(10)], batch_size=5)
        client.create_stream(trimmed, max_length_bytes=3000, max_segment_size_bytes=1000)
        deadline = time.monotonic() + 30
        while client.first_offset(trimmed) == 0 and time.monotonic() < deadline:
            for _ in range(10):
                client.publish(trimmed, [b"r" * 100] * 5, batch_size=5)
        assert client.first_offset(trimmed) > 0, "retention never truncated the stream"
        tail = client.committed_tail(trimmed)
        with pytest.raises(DataLossError) as single:
            list(client.read_range(trimmed, 0, tail))
        with pytest.raises(DataLossError) as many:
            list(client.read_ranges([(kept, 0, 10), (trimmed, 0, tail)]))
        assert (many.value.stream, many.value.requested) == (trimmed, 0) == (single.value.stream,
                                                                             single.value.requested)
        text = str(many.value)
        assert f"stream {trimmed!r}" in text and "offset 0 is no longer retained" in text
        client.create_stream(gone)
        client.publish(gone, [b"g"] * 3)
        client.delete_stream(gone)
        with pytest.raises(StreamNotFound) as single_gone:
            list(client.read_range(gone, 0, 3))
        with pytest.raises(StreamNotFound) as many_gone:
            list(client.read_ranges([(kept, 0, 10), (gone, 0, 3)]))
        assert str(many_gone.value) == str(single_gone.value)
        assert _records(b for _i, b in client.read_ranges([(kept, 2, 8)])) == _records(
            client.read_range(kept, 2, 8))


def test_a_range_holding_the_last_user_chunk_is_answered_without_a_subscription(
        broker_43: Broker, stream_name: StreamNames) -> None:
    """Issue 44: a first batch's probe of 1,000 partitions subscribed to each (a segment reader per
    Subscribe on the broker). With ``by_last_chunk`` a range the last user chunk begins in is told from
    one ResolveOffsetSpec round; the others are subscribed to (or told quiet) as without it; every
    answer is read_range's."""
    from streamledger.protocol.rabbitmq import constants as c
    from streamledger.protocol.rabbitmq.offsets import OffsetSpec

    names = [stream_name(f"lastchunk-{i}") for i in range(3)]
    with StreamClient.connect(broker_43.url) as client:
        for name in names:
            client.create_stream(name)
            client.publish(name, [b"a%d" % i for i in range(5)])  # confirmed: the next is a later chunk
            client.publish(name, [b"b%d" % i for i in range(5)])
        client.store_offset_verified(names[1], "p", 9)  # a tracking chunk at 10
        last = {n: client.resolve_offset(n, OffsetSpec.last()) for n in names}
        tail = {n: client.committed_tail(n) for n in names}
        assert all(0 < last[n] < 10 for n in names), last  # two user chunks each
        asked: list[int] = []
        # the last user chunk begins in each of these: no subscription
        cases = {names[0]: (0, tail[names[0]]), names[1]: (last[names[1]], tail[names[1]]),
                 names[2]: (last[names[2]], last[names[2]] + 1)}
        want = {n: min(1, sum(len(b) for b in client.read_range(n, a, b, decode="raw")))
                for n, (a, b) in cases.items()}
        assert want == dict.fromkeys(names, 1)
        count_commands(client, asked)
        assert client.user_records_many(cases, by_last_chunk=True) == want
        assert c.SUBSCRIBE not in asked, [c.command_name(k) for k in asked]
        # it begins after these, or before them: subscribed to (or told quiet), as without the flag
        others = {names[0]: (0, last[names[0]]), names[1]: (10, 11), names[2]: (last[names[2]] + 1, 10)}
        want = {n: min(1, sum(len(b) for b in client.read_range(n, a, b, decode="raw")))
                for n, (a, b) in others.items()}
        assert want == {names[0]: 1, names[1]: 0, names[2]: 1}
        del asked[:]
        assert client.user_records_many(others, by_last_chunk=True) == want
        assert asked.count(c.SUBSCRIBE) == 2, [c.command_name(k) for k in asked]
        assert client.user_records_many(others) == want


def test_many_resolutions_spread_over_side_connections_answer_as_one_connection(
        broker_43: Broker, stream_name: StreamNames) -> None:
    """Issue 44: the broker resolves one connection's ResolveOffsetSpec requests one after the other,
    about 0.3 ms of its CPU each, so a round over many streams is spread over side connections to the
    same address. Every answer is the one connection's (resolutions, a probe of tracking chunks and of
    user chunks); the side connections are closed with each round (a side connection whose part fails,
    or that cannot be opened: test_side_connections.py)."""
    from streamledger.protocol.rabbitmq import constants as c
    from streamledger.protocol.rabbitmq.offsets import OffsetSpec

    names = [stream_name(f"spread-{i}") for i in range(12)]
    with StreamClient.connect(broker_43.url) as client:
        for i, name in enumerate(names):
            client.create_stream(name)
            client.publish(name, [b"a%d" % j for j in range(1 + i % 3)])
            if i % 2:
                client.store_offset_verified(name, "p", i % 3)  # a tracking chunk after the records
        specs = [OffsetSpec.last(), OffsetSpec.timestamp(0)]
        want = {n: [client.resolve_offset(n, s) for s in specs] for n in names}
        tails = client.committed_tails(names)
        probe = {n: (1 + i % 3, tails[n]) for i, n in enumerate(names)}  # tracking chunk or nothing
        probe[names[4]] = (0, tails[names[4]])  # user records
        counts = {n: min(1, sum(len(b) for b in client.read_range(n, a, b, decode="raw"))) if a < b else 0
                  for n, (a, b) in probe.items()}
        assert counts == {n: int(n == names[4]) for n in names}
        assert client.resolve_offsets(names, specs) == want
        assert client.last_side == []  # below spread_at: the main connection alone

        client.spread_at, client.side_connections = 4, 3
        asked: list[int] = []
        count_commands(client, asked)
        assert client.resolve_offsets(names, specs) == want
        assert len(client.last_side) == 3 and all(conn.closed for conn in client.last_side)
        assert asked.count(c.RESOLVE_OFFSET_SPEC) == 3 * len(specs)  # a quarter on the main connection
        assert client.user_records_many(probe, by_last_chunk=True) == counts
        assert 1 <= len(client.last_side) <= 3  # opened again for the round (its streams), closed with it


def test_a_store_and_a_publish_together_leave_a_user_chunk_the_stats_cannot_tell_from_a_tracking_chunk(
        broker_43: Broker, stream_name: StreamNames) -> None:
    """Why the first idle batch after a store must ask for the last user chunk (issue 44): osiris
    writes a StoreOffset's tracking entry as a chunk of its own only when no record arrives in the
    same writer batch; with one, the entry rides in the user chunk's trailer. A StoreOffset sent
    together with a one-record publish then leaves, past the stored records, exactly what a lone
    tracking chunk leaves (one chunk at T, committed, the tail at T + 1, the offset stored and read
    back), yet it is a user record. The probe counts it and read_range reads it."""
    from streamledger.protocol.rabbitmq import constants as c
    from streamledger.protocol.rabbitmq.connection import Connection
    from streamledger.protocol.rabbitmq.wire import declare_publisher_frame, publish_frame, store_offset_frame

    together = []
    with StreamClient.connect(broker_43.url) as client:
        for i in range(12):
            name = stream_name(f"trailer-{i}")
            client.create_stream(name)
            client.publish(name, [b"r%d" % j for j in range(10)])
            conn = Connection.open(client.params)
            try:
                corr = conn.next_corr()
                declare = declare_publisher_frame(corr, 1, "", name)
                conn.request(c.DECLARE_PUBLISHER, corr, declare, stream=name)
                conn.send(store_offset_frame("p", name, 9) + publish_frame(1, [(0, b"late")]))
                deadline = time.monotonic() + 10
                while client.committed_tail(name) < 11 or client.query_offset(name, "p") != 9:
                    assert time.monotonic() < deadline, name
                    time.sleep(0.05)
            finally:
                conn.close()
            stats = client.stream_stats(name)
            if stats.committed_chunk_id == stats.last_chunk_id == 10 and client.committed_tail(name) == 11:
                together.append(name)  # what a lone tracking chunk at 10 would show
        assert together, "no StoreOffset and publish landed in one writer batch in 12 tries"
        for name in together:
            assert [bytes(b) for batch in client.read_range(name, 10, 11, decode="raw")
                    for b in batch.bodies] == [b"late"]
        assert client.user_records_many({n: (10, 11) for n in together}, by_last_chunk=True) == dict.fromkeys(
            together, 1)
        assert client.user_records_many({n: (10, 11) for n in together}) == dict.fromkeys(together, 1)
