"""read_range edge cases on real brokers: chunk filtering at both ends, gaps from tracking chunks,
empty ranges, retention (DataLossError), ends beyond the tail, flow control and batching."""

from __future__ import annotations

import time

import pytest

from streamledger.protocol.rabbitmq import (
    BufferBatch,
    DataLossError,
    InvalidRequest,
    OffsetOutOfRange,
    RecordBatch,
    StreamClient,
)
from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.wire import declare_publisher_frame, publish_frame, store_offset_frame
from tests.support.balancer import DroppingProxy
from tests.support.rabbitmq import Broker, StreamNames

pytestmark = pytest.mark.rabbitmq


def offsets(batches: list[RecordBatch]) -> list[int]:
    return [o for b in batches for o in b.offsets]


def _layout(client: StreamClient, name: str) -> dict[int, bytes]:
    """Chunks 0..9, 10..19, a tracking chunk at 20, chunk 21..30, tracking chunks 31 and 32.

    One publish of 10 is one chunk on a broker with time for it; a busy broker may write it as two.
    The layout is checked, and made again on a fresh stream when the broker split a publish."""
    for _ in range(5):
        expected = _publish_layout(client, name)
        if all((h := client.chunk_at(name, o)) is not None and h.first_offset == first
               for o, first in ((0, 0), (9, 0), (10, 10), (19, 10), (21, 21), (30, 21))):
            return expected
        client.delete_stream(name)
    raise AssertionError(f"the broker split a publish into several chunks five times on {name}")


def _publish_layout(client: StreamClient, name: str) -> dict[int, bytes]:
    client.create_stream(name)
    expected: dict[int, bytes] = {}
    offset = 0
    for part in range(2):
        bodies = [b"p%d-%d" % (part, i) for i in range(10)]
        client.publish(name, bodies, batch_size=10)
        expected.update({offset + i: body for i, body in enumerate(bodies)})
        offset += 10
    client.store_offset_verified(name, "mid", 5)  # idle: a tracking chunk takes offset 20
    bodies = [b"p2-%d" % i for i in range(10)]
    client.publish(name, bodies, batch_size=10)
    expected.update({21 + i: body for i, body in enumerate(bodies)})
    client.store_offset_verified(name, "end", 30)  # tracking chunk 31
    client.store_offset_verified(name, "end", 31)  # tracking chunk 32
    return expected


def test_exact_ranges_with_gaps(any_broker: Broker, stream_name: StreamNames) -> None:
    name = stream_name("exact")
    with StreamClient.connect(any_broker.url) as client:
        expected = _layout(client, name)
        tail = client.committed_tail(name)
        if any_broker.version == "3.10":
            assert tail == 31  # without StreamStats: the end of the last user chunk
        else:
            assert tail == 33
        cases = [(0, tail), (3, 7), (5, 15), (9, 11), (10, 20), (19, 22), (20, 21), (20, 22), (25, 31),
                 (30, tail), (31, tail), (0, 1), (0, 20)]
        for start, end in cases:
            batches = list(client.read_range(name, start, end))
            want = [o for o in sorted(expected) if start <= o < end]
            assert offsets(batches) == want, (start, end)
            assert [body for b in batches for body in b.bodies] == [expected[o] for o in want]
            for b in batches:
                assert b.stream == name and len(b.chunk_timestamps) == len(b)
                assert b.properties is not None and len(b.properties) == len(b)


def test_empty_and_invalid_ranges(broker_43: Broker, stream_name: StreamNames) -> None:
    name = stream_name("empty")
    with StreamClient.connect(broker_43.url) as client:
        # An empty range needs no stream at all and returns at once.
        started = time.perf_counter()
        assert list(client.read_range("no-such-stream-for-sure", 5, 5)) == []
        assert time.perf_counter() - started < 0.5
        client.create_stream(name)
        client.publish(name, [b"a"] * 5)
        with pytest.raises(InvalidRequest, match="start 4 is after end 2"):
            client.read_range(name, 4, 2)
        with pytest.raises(InvalidRequest):
            client.read_range(name, -1, 2)
        started = time.perf_counter()
        with pytest.raises(OffsetOutOfRange, match=r"range end 6 is beyond the committed tail 5"):
            client.read_range(name, 0, 6)
        assert time.perf_counter() - started < 2.0


def test_batching_and_small_credit(broker_43: Broker, stream_name: StreamNames) -> None:
    name = stream_name("batch")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        for i in range(20):  # 20 chunks of 50
            client.publish(name, [b"%d" % (i * 50 + j) for j in range(50)], amqp=False, batch_size=50)
        batches = list(client.read_range(name, 7, 993, decode="raw", credit=1, max_batch_records=64))
        assert all(0 < len(b) <= 64 for b in batches)
        assert offsets(batches) == list(range(7, 993))
        assert [int(body) for b in batches for body in b.bodies] == list(range(7, 993))
        assert all(b.properties is None for b in batches)  # raw: no decoded columns
        # Abandoning a read half-way closes its dedicated connection cleanly.
        it = client.read_range(name, 0, 1000, decode="raw", credit=2, max_batch_records=10)
        assert 0 < len(next(it)) <= 10  # fewer when the broker cut the first publish into small chunks
        it.close()  # type: ignore[attr-defined]
        assert client.stream_exists(name)


def test_first_batches_are_small_and_double_up_to_the_maximum(broker_43: Broker, stream_name: StreamNames
                                                                ) -> None:
    """Issue 44: a consumer that works on each batch as it comes (Spark's JVM) should not wait for a
    whole maximal batch before it gets anything: with ``first_batch_records`` the first batch is cut
    after about that many records (whole chunks) and each next one at twice the one before, up to
    ``max_batch_records``; every record still comes once, in order, in both layouts."""
    name = stream_name("ramp")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        for i in range(40):  # 40 chunks of 50
            client.publish(name, [b"%d" % (i * 50 + j) for j in range(50)], amqp=False, batch_size=50)
        for layout in ("lists", "buffers"):
            batches = list(client.read_range(name, 3, 2000, decode="raw", max_batch_records=800,
                                             first_batch_records=100, layout=layout))  # type: ignore[call-overload]
            got = [o for b in batches for o in (b.offsets() if layout == "buffers" else b.offsets)]
            assert got == list(range(3, 2000)), layout
            sizes = [len(b) for b in batches]
            limits = [min(100 * 2**i, 800) for i in range(len(sizes))]
            assert all(0 < n <= limit for n, limit in zip(sizes, limits, strict=True)), (layout, sizes)
            assert sizes[0] < 100 < max(sizes) <= 800, (layout, sizes)
        whole = [len(b) for b in client.read_range(name, 0, 2000, decode="raw", max_batch_records=800)]
        assert whole[0] == 800  # without it, the first batch is a whole maximal one
        with pytest.raises(InvalidRequest, match="first_batch_records"):
            client.read_range(name, 0, 10, first_batch_records=0)


def test_batches_shrink_towards_the_end_and_the_last_comes_before_the_goodbye(
        broker_43: Broker, stream_name: StreamNames, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44: what a consumer of each batch as it comes (Spark's JVM) still has to do once the
    read is over is its work on the last batch: with ``first_batch_records`` the batches shrink
    again towards the range's end, so the last holds at most that many records, and it is handed
    out before the read's goodbye to its member connection, which is a Close alone (no Unsubscribe
    first: closing ends the subscription). Every record still comes once, in order."""
    from streamledger.protocol.rabbitmq.connection import Connection

    name = stream_name("rampdown")
    events: list[object] = []
    real_close, real_request = Connection.close, Connection.request

    def close(conn: Connection) -> None:
        if not conn.closed:
            events.append(("close", id(conn)))
        real_close(conn)

    def request(conn: Connection, key: int, *args: object, **kwargs: object) -> object:
        events.append(("request", key))
        return real_request(conn, key, *args, **kwargs)

    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        for i in range(40):  # 40 chunks of 50
            client.publish(name, [b"%d" % (i * 50 + j) for j in range(50)], amqp=False, batch_size=50)
        own = id(client.connection)
        monkeypatch.setattr(Connection, "close", close)
        monkeypatch.setattr(Connection, "request", request)
        for layout in ("lists", "buffers"):
            events.clear()
            sizes, got = [], []
            for b in client.read_range(name, 3, 2000, decode="raw", max_batch_records=800,  # type: ignore[call-overload]
                                       first_batch_records=100, layout=layout):
                events.append(("batch", len(b)))
                sizes.append(len(b))
                got.extend(b.offsets() if layout == "buffers" else b.offsets)
            assert got == list(range(3, 2000)), layout
            assert sizes[-1] <= 100 < max(sizes) <= 800, (layout, sizes)
            last_batch = max(i for i, e in enumerate(events) if e[0] == "batch")
            goodbye = [i for i, e in enumerate(events) if e[0] == "close" and e[1] != own]
            assert len(goodbye) == 1 and goodbye[0] > last_batch, (layout, events[last_batch:])
            assert ("request", c.UNSUBSCRIBE) not in events, layout
        monkeypatch.undo()
        with client.pooled_reads():  # a pooled connection stays subscribed to nothing: Unsubscribe
            events.clear()
            monkeypatch.setattr(Connection, "request", request)
            assert sum(len(b) for b in client.read_range(name, 0, 2000, decode="raw")) == 2000
            assert ("request", c.UNSUBSCRIBE) in events
            monkeypatch.undo()


def test_large_range(broker_43: Broker, stream_name: StreamNames) -> None:
    name = stream_name("large")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        client.publish(name, (b"%08d" % i for i in range(60_000)), application_properties={"k": 1})
        tail = client.committed_tail(name)
        assert tail == 60_000
        n = 0
        for b in client.read_range(name, 0, tail):
            assert b.bodies == [b"%08d" % o for o in b.offsets]
            assert b.application_properties is not None and b.application_properties[0] == {"k": 1}
            n += len(b)
        assert n == 60_000


def test_start_below_retention_is_data_loss(any_broker: Broker, stream_name: StreamNames) -> None:
    name = stream_name("retention")
    with StreamClient.connect(any_broker.url) as client:
        client.create_stream(name, max_length_bytes=3000, max_segment_size_bytes=1000)
        deadline = time.monotonic() + 30
        first = 0
        while first == 0 and time.monotonic() < deadline:
            for _ in range(10):
                client.publish(name, [b"r" * 100] * 5, batch_size=5)
            first = client.first_offset(name)
        assert first > 0, "retention never truncated the stream"
        # Retention runs asynchronously after a segment rolls: wait until it settles.
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = client.first_offset(name)
            if now == first:
                break
            first = now
        tail = client.committed_tail(name)
        with pytest.raises(DataLossError) as info:
            list(client.read_range(name, 0, tail))
        err = info.value
        assert (err.stream, err.requested) == (name, 0)
        assert err.first_available >= first
        assert f"offset 0 is no longer retained (first available offset is {err.first_available})" in str(err)
        # Reading from the first retained offset works.
        first = client.first_offset(name)
        got = offsets(list(client.read_range(name, first, tail, decode="raw")))
        assert got and got[0] == first and got[-1] < tail


def _publish_three_with_store(client: StreamClient, name: str, publisher_id: int = 7) -> None:
    """Publish a, b, c and a StoreOffset(1) in ONE TCP write, wait for the confirm, then publish d, e.

    ``publisher_id`` must be new on the connection (a second declaration of one id is refused)."""
    client.create_stream(name)
    conn = client.connection
    corr = conn.next_corr()
    code, _ = conn.request(c.DECLARE_PUBLISHER, corr, declare_publisher_frame(corr, publisher_id, "", name))
    assert code == c.OK
    confirmed: list[int] = []
    conn.on_publish_confirm = lambda _v, _buf, _pos, _end: confirmed.append(1)
    records = [(1, b"a"), (2, b"b"), (3, b"c")]
    conn.send(publish_frame(publisher_id, records) + store_offset_frame("trl", name, 1))
    deadline = time.monotonic() + 10
    while not confirmed:
        conn.dispatch(*conn.read_frame(deadline, "the confirm"))
    conn.on_publish_confirm = None
    client.publish(name, [b"d", b"e"], amqp=False)


def test_chunk_with_tracking_trailer(any_broker: Broker, stream_name: StreamNames) -> None:
    """A StoreOffset in the same TCP write as a Publish is usually stored as the user chunk's
    trailer (spec 7.10). With chunk_selector=all the trailer bytes follow the data in the Deliver
    frame; the read must skip them and stay exact.

    Whether the broker folds the offset into the trailer or writes a tracking chunk of its own
    (which takes an offset) depends on timing inside the broker, so each attempt checks exactness
    either way, and the test insists that the trailer layout was met in at least one of 6 attempts.
    """
    layouts: list[int] = []
    with StreamClient.connect(any_broker.url) as client:
        for attempt in range(6):
            name = stream_name("trailer")
            _publish_three_with_store(client, name, publisher_id=100 + attempt)
            assert client.query_offset(name, "trl") == 1
            tail = client.committed_tail(name)
            # 5: the stored offset took no offset of its own (chunk 0's trailer); 6: a tracking chunk.
            assert tail in (5, 6)
            layouts.append(tail)
            batches = list(client.read_range(name, 0, tail, decode="raw"))
            assert [body for b in batches for body in b.bodies] == [b"a", b"b", b"c", b"d", b"e"]
            got = offsets(batches)
            assert got[:3] == [0, 1, 2]
            assert got[3:] == ([3, 4] if tail == 5 else [4, 5])
            middle = list(client.read_range(name, 1, 3, decode="raw"))
            assert [body for b in middle for body in b.bodies] == [b"b", b"c"]
            if tail == 5:
                break
    assert 5 in layouts, f"the broker never stored the offset as a trailer: tails {layouts}"


PAD = b"." * 94  # 100-byte records: about 3.4 MB, so the cut at 300 kB lands mid-read


def test_read_resumes_exactly_after_a_dropped_connection(
    broker_43: Broker, stream_name: StreamNames, caplog: pytest.LogCaptureFixture
) -> None:
    name = stream_name("resume")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        client.publish(name, (b"%06d" % i + PAD for i in range(30_000)), amqp=False, batch_size=100)
    proxy = DroppingProxy(broker_43.stream_port, limit=300_000)
    try:
        url = broker_43.url.replace(f":{broker_43.stream_port}/", f":{proxy.port}/")
        with StreamClient.connect(url) as client:
            tail = client.committed_tail(name)
            # prefer="url": through the proxy (the advertised address is the broker itself)
            batches = list(client.read_range(name, 5, tail, decode="raw", max_batch_records=1000,
                                             prefer="url"))
        assert proxy.dropped == 1  # the read really lost its connection once, mid-way:
        assert "lost its connection at offset" in caplog.text and "resuming (1/3)" in caplog.text
        got = [body for b in batches for body in b.bodies]
        assert offsets(batches) == list(range(5, 30_000))
        assert got == [b"%06d" % i + PAD for i in range(5, 30_000)]
    finally:
        proxy.close()


# ---------------------------------------------------------------- the buffer layout (issue 11)


def _as_lists(batches: list[BufferBatch]) -> tuple[list[int], list[bytes], list[int]]:
    return ([o for b in batches for o in b.offsets()], [x for b in batches for x in b.bodies()],
            [t for b in batches for t in b.chunk_timestamps()])


def test_buffer_layout_equals_list_layout(any_broker: Broker, stream_name: StreamNames) -> None:
    """Gaps from tracking chunks, both decodes, ranges cutting chunks: the same records either way."""
    name = stream_name("buffers")
    with StreamClient.connect(any_broker.url) as client:
        _layout(client, name)
        client.publish(name, [b"props-%d" % i for i in range(30)], application_properties={"k": "v"},
                       batch_size=30)
        tail = client.committed_tail(name)
        for decode in ("amqp", "raw"):
            for start, end in [(0, tail), (3, 27), (19, 22), (25, tail)]:
                lists = list(client.read_range(name, start, end, decode=decode))  # type: ignore[arg-type]
                bufs = list(client.read_range(name, start, end, decode=decode,  # type: ignore[arg-type]
                                              layout="buffers", max_batch_records=7))
                assert all(isinstance(b, BufferBatch) and 0 < len(b) <= 7 for b in bufs)
                assert _as_lists(bufs) == (offsets(lists), [x for b in lists for x in b.bodies],
                                           [t for b in lists for t in b.chunk_timestamps])
                if decode == "amqp":
                    want = [p for b in lists for p in b.application_properties or []]
                    got = [p for b in bufs for p in b.to_record_batch().application_properties or []]
                    assert got == want
                    no_maps = list(client.read_range(name, start, end, layout="buffers", maps=False))
                    assert all(b.application_properties is None for b in no_maps)


def test_buffer_batches_end_at_max_batch_bytes(broker_43: Broker, stream_name: StreamNames) -> None:
    """A reader that writes as it reads holds a batch at a time: ``max_batch_bytes`` cuts the buffer
    batches by body bytes (a batch holds one chunk at least), in ``read_range`` and ``read_ranges``
    alike, with the same records; a bound the int32 body offsets cannot hold is refused."""
    name = stream_name("batch-bytes")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        for at in range(0, 2_000, 100):  # 100 records of 100 B per chunk
            client.publish(name, [b"%06d" % i + PAD[:94] for i in range(at, at + 100)], amqp=False,
                           batch_size=100)
        tail = client.committed_tail(name)
        whole = list(client.read_range(name, 5, tail, decode="raw", layout="buffers"))
        cut = list(client.read_range(name, 5, tail, decode="raw", layout="buffers", max_batch_bytes=25_000))
        assert len(whole) == 1 and len(cut) > 7
        assert all(len(b.body_data) <= 25_000 or len(b.run_starts) == 1 for b in cut)
        assert _as_lists(cut) == _as_lists(whole)
        many = [b for _i, b in client.read_ranges([(name, 5, tail)], decode="raw", layout="buffers",
                                                  max_batch_bytes=25_000)]
        assert [len(b.body_data) for b in many] == [len(b.body_data) for b in cut]
        with pytest.raises(InvalidRequest, match=r"max_batch_bytes must be in 1\.\.2147483647 bytes, not 0"):
            client.read_range(name, 0, tail, layout="buffers", max_batch_bytes=0)


def test_buffer_layout_resumes_exactly_after_a_dropped_connection(
    broker_43: Broker, stream_name: StreamNames
) -> None:
    name = stream_name("resume-buffers")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        client.publish(name, (b"%06d" % i + PAD for i in range(30_000)), amqp=False, batch_size=100)
    proxy = DroppingProxy(broker_43.stream_port, limit=300_000)
    try:
        url = broker_43.url.replace(f":{broker_43.stream_port}/", f":{proxy.port}/")
        with StreamClient.connect(url) as client:
            tail = client.committed_tail(name)
            batches = list(client.read_range(name, 5, tail, decode="raw", max_batch_records=1000,
                                             prefer="url", layout="buffers"))
        assert proxy.dropped == 1
        got_offsets, got_bodies, _ = _as_lists(batches)
        assert got_offsets == list(range(5, 30_000))
        assert got_bodies == [b"%06d" % i + PAD for i in range(5, 30_000)]
    finally:
        proxy.close()


def test_a_connection_lost_around_the_last_batch_and_the_goodbye_neither_skips_nor_doubles_a_record(
    broker_43: Broker, stream_name: StreamNames
) -> None:
    """Issue 44 (red team): with ``first_batch_records`` the batches shrink towards the range's end
    and the last is handed out before the goodbye (a Close alone). The member connection is cut at
    many points of a read whose stream goes on past the range's end (the broker keeps delivering
    chunks past it, and records arrive meanwhile): in the ramp up, in the shrinking batches, after
    the last chunk of the range, during the Close. Each read hands out the range once, in order."""
    name = stream_name("cut-end")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        for i in range(60):  # 60 chunks of 50 records of 100 bytes
            client.publish(name, [b"%06d" % (i * 50 + j) + PAD for j in range(50)], amqp=False, batch_size=50)
    cut_after = []
    for limit in (20_000, 120_000, 160_000, 190_000, 200_000, 205_000, *range(210_000, 215_001, 500)):
        for layout in ("lists", "buffers"):
            proxy = DroppingProxy(broker_43.stream_port, limit=limit)
            try:
                url = broker_43.url.replace(f":{broker_43.stream_port}/", f":{proxy.port}/")
                with StreamClient.connect(url) as client, StreamClient.connect(broker_43.url) as writer:
                    got: list[int] = []
                    bodies: list[bytes] = []
                    for b in client.read_range(name, 5, 1990, decode="raw", max_batch_records=800,  # type: ignore[call-overload]
                                               first_batch_records=100, prefer="url", layout=layout):
                        writer.publish(name, [b"late" + PAD], amqp=False)  # arrives while the read goes on
                        got.extend(b.offsets() if layout == "buffers" else b.offsets)
                        bodies.extend(b.bodies() if layout == "buffers" else b.bodies)
                    assert got == list(range(5, 1990)), (limit, layout)
                    assert bodies == [b"%06d" % i + PAD for i in range(5, 1990)], (limit, layout)
                    cut_after.append((limit, layout, proxy.dropped))
            finally:
                proxy.close()
    # the cuts reach past the read's last byte (about 213.5 kB from the broker): up to the Close's answer
    assert all(dropped == 1 for limit, _, dropped in cut_after if limit <= 210_000), cut_after
    assert any(dropped == 0 for _, _, dropped in cut_after), cut_after
