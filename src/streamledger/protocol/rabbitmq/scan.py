"""Many small subscriptions at once over one connection: chunk headers, user-record probes, and
the records of many small ranges (:func:`read_ranges`).

A batch over N partitions asks each partition one small question: the header of the chunk at an
offset (its fingerprint check, and the fingerprint it takes at commit), or whether a range holds a
user record (the probe of ranges that hold only tracking chunks). Asked one stream at a time each
costs a Subscribe, a barrier and an Unsubscribe round trip; here the Subscribes of up to ``window``
streams are in flight together (``Connection.pipeline``), their deliveries are told apart by
subscription id, and the Unsubscribes go together too: a few round trips per window instead of a
few per stream. The answers are those of :func:`reader.probe_chunk` and :func:`reader.read_range`;
a data read keeps the records, checked, decoded and cut into batches as :func:`reader.read_range` does.

Runs on the client's own connection (a data read: on the connection to each stream's serving member,
the client's own or an idle pooled one when it is that node), where no subscription outlives a call,
so the ids 0..window-1 are free; every subscription is ended (or the connection fails) before the
call returns.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.chunk import (
    ChunkHeader,
    decode_chunk,
    decode_chunk_buffers,
    parse_chunk_header,
)
from streamledger.protocol.rabbitmq.connection import Connection, raise_for_code
from streamledger.protocol.rabbitmq.errors import (
    ConnectionFailed,
    DataLossError,
    ResponseError,
    StreamTimeout,
    TlsError,
)
from streamledger.protocol.rabbitmq.offsets import OffsetSpec
from streamledger.protocol.rabbitmq.reader import (
    CHUNK_DATA_LENGTH,
    CHUNK_RECORDS,
    Batch,
    Layout,
    Prefer,
    RangeSource,
    ReadStats,
    check_bounds,
    check_range,
    check_read_options,
    chunk_position,
    read_range,
    split_batch,
)
from streamledger.protocol.rabbitmq.records import MAX_BUFFER_BYTES, BufferBatch, RecordBatch
from streamledger.protocol.rabbitmq.stats import StreamMetadata, StreamStats
from streamledger.protocol.rabbitmq.wire import (
    credit_frame,
    metadata_frame,
    subscribe_frame,
    unsubscribe_frame,
)

MAX_WINDOW = 255
"""Subscription ids are one byte."""
log = logging.getLogger("streamledger.rabbitmq")


@dataclass(slots=True)
class _Sub:
    """One subscription's question and what its deliveries answered so far."""

    stream: str
    offset: int
    end: int | None  # None: the first chunk's header is the answer
    position: int
    header: ChunkHeader | None = None
    records: int = 0
    skipped: bool = False  # the first chunk began after ``offset``: retention removed it
    done: bool = False
    batches: list[Batch] = field(default_factory=list)  # a data read's records (``_Reading``)
    pending: int = 0  # chunks delivered since credit was last granted


@dataclass(frozen=True, slots=True)
class _Reading:
    """How a data read decodes its chunks and grants credit (as :func:`reader.read_range` does)."""

    decode: Literal["amqp", "raw"]
    verify_crc: bool
    layout: Layout
    maps: bool
    max_batch_records: int
    credit: int
    stats: ReadStats
    max_batch_bytes: int = MAX_BUFFER_BYTES


def _decode_into(s: _Sub, reading: _Reading, view: memoryview, chunk: int) -> ChunkHeader:
    """Decode one delivered chunk into the subscription's last batch, starting a new batch before
    the last would outgrow ``max_batch_records`` (or, buffers, ``max_batch_bytes`` of bodies)."""
    assert s.end is not None
    buffers = reading.layout == "buffers"
    batch = s.batches[-1] if s.batches else None
    if batch is None or (len(batch) and (
        len(batch) + CHUNK_RECORDS.unpack_from(view, chunk + 4)[0] > reading.max_batch_records
        or (buffers and len(batch.body_data)  # type: ignore[union-attr]
            + CHUNK_DATA_LENGTH.unpack_from(view, chunk + 36)[0] > reading.max_batch_bytes)
    )):
        batch = BufferBatch.empty(s.stream) if buffers else RecordBatch.empty(s.stream, reading.decode)
        s.batches.append(batch)
    if buffers:
        return decode_chunk_buffers(view, chunk, start=s.position, end=s.end, decode=reading.decode,
                                    verify_crc=reading.verify_crc, maps=reading.maps,
                                    out=batch)  # type: ignore[arg-type]
    return decode_chunk(view, chunk, start=s.position, end=s.end, decode=reading.decode,
                        verify_crc=reading.verify_crc, out=batch)  # type: ignore[arg-type]


def _run(conn: Connection, subs: list[_Sub], *, all_chunks: bool, need: int, barrier: bool,
         timeout: float, grace: float = 0.05, reading: _Reading | None = None,
         what: str = "probe") -> None:
    """Subscribe all of ``subs`` (ids 0..len-1) together, feed their deliveries to them until each is
    done (``barrier``: or the broker has sent what it had at subscribe time, plus ``grace``), then
    unsubscribe them together. ``reading``: keep the records (a data read), not just count them."""
    credit_errors: list[int] = []
    credit = reading.credit if reading is not None else 1
    top_up = max(1, credit // 2)  # the broker resumes on more than half the initial credit (spec 7.9)

    def on_deliver(version: int, buf: bytearray, pos: int, end: int) -> None:
        sid, chunk = chunk_position(version, buf, pos, end)
        if sid >= len(subs) or subs[sid].done:
            return
        s = subs[sid]
        view = memoryview(buf)[:end]
        if s.end is None:  # a header probe: the first chunk delivered is the answer
            s.header, s.done = parse_chunk_header(view, chunk), True
            return
        if reading is not None:
            head = _decode_into(s, reading, view, chunk)
            reading.stats.chunks += 1
            reading.stats.chunk_bytes += end - chunk
            reading.stats.records += head.num_records
            added = 0
        else:
            batch = RecordBatch.empty(s.stream, "raw")
            head = decode_chunk(view, chunk, start=s.position, end=s.end, decode="raw", verify_crc=True,
                                out=batch)
            added = len(batch)
        if s.header is None:
            s.header = head
            if head.first_offset > s.offset:
                s.skipped, s.done = True, True
                return
        s.records += added
        s.position = max(s.position, head.next_offset)
        if s.records >= need or s.position >= s.end:
            s.done = True
            return
        s.pending += 1
        if s.pending >= top_up:
            conn.send(credit_frame(sid, s.pending))
            s.pending = 0

    previous, conn.on_deliver = conn.on_deliver, on_deliver
    previous_credit = conn.on_credit_error
    conn.on_credit_error = lambda _sid, code: credit_errors.append(code)
    props = {"chunk_selector": "all"} if all_chunks else None
    subscribed: list[int] = []
    ours = {s.stream for s in subs}
    # A connection that lives long (the batch's client) may hold updates of streams it used before.
    known = len(conn.metadata_updates)
    try:
        asks = []
        for sid, s in enumerate(subs):
            corr = conn.next_corr()
            spec = OffsetSpec.offset(s.offset)
            asks.append((c.SUBSCRIBE, corr, subscribe_frame(corr, sid, s.stream, spec, credit, props)))
        codes = conn.pipeline(asks, lambda _i, r: r.u16(), timeout=timeout)
        subscribed = [sid for sid, code in enumerate(codes) if code == c.OK]
        for sid, code in enumerate(codes):
            raise_for_code(code, c.SUBSCRIBE, subs[sid].stream)
        deadline = time.monotonic() + timeout
        if barrier:
            # The broker writes the chunks it has at subscribe time before it reads our next request.
            corr = conn.next_corr()
            conn.call(c.METADATA, corr, metadata_frame(corr, [subs[0].stream]), timeout=timeout)
            deadline = time.monotonic() + grace
        while not all(s.done for s in subs):
            mine = [(code, name) for code, name in conn.metadata_updates[known:] if name in ours]
            if mine:
                code, name = mine[-1]
                raise ResponseError(f"a {what} of many streams stopped", code, c.code_name(code), name)
            if credit_errors:
                raise ResponseError("Credit", credit_errors[0], c.code_name(credit_errors[0]),
                                    subs[0].stream)
            try:
                key, version, pos, end = conn.read_frame(deadline, "Deliver frames")
            except StreamTimeout:
                if barrier:
                    break
                waiting = [s for s in subs if not s.done]
                raise StreamTimeout(
                    f"{what} of stream {waiting[0].stream!r} up to offset {waiting[0].end}: no chunk after "
                    f"offset {waiting[0].position} within {timeout:g}s ({len(waiting)} stream(s) waiting)"
                ) from None
            progress = sum(s.done for s in subs)
            conn.dispatch(key, version, pos, end, waiting_for="Deliver frames")
            if not barrier and sum(s.done for s in subs) > progress:
                deadline = time.monotonic() + timeout
    finally:
        try:
            if subscribed and not conn.closed:
                done = []
                for sid in subscribed:
                    corr = conn.next_corr()
                    done.append((c.UNSUBSCRIBE, corr, unsubscribe_frame(corr, sid)))
                codes = conn.pipeline(done, lambda _i, r: r.u16(), timeout=timeout)
                for sid, code in zip(subscribed, codes, strict=True):
                    if code not in (c.OK, c.SUBSCRIPTION_ID_DOES_NOT_EXIST):
                        raise_for_code(code, c.UNSUBSCRIBE, subs[sid].stream)
        finally:
            conn.on_deliver, conn.on_credit_error = previous, previous_credit


def _windows(subs: list[_Sub], window: int, run: Callable[[list[_Sub]], None]) -> None:
    size = max(1, min(window, MAX_WINDOW))
    for i in range(0, len(subs), size):
        run(subs[i:i + size])


def chunk_headers(conn: Connection, asks: Sequence[tuple[str, int]], *, window: int = MAX_WINDOW,
                  timeout: float = 10.0, all_chunks: bool = False) -> list[ChunkHeader | None]:
    """The header of the first user chunk a subscription at each ``(stream, offset)`` gets (the
    chunk holding the offset, or the next user chunk), None when there is none yet; ``all_chunks``:
    of any chunk type (a tracking chunk holding the offset too)."""
    subs = [_Sub(stream, offset, None, offset) for stream, offset in asks]
    _windows(subs, window, lambda part: _run(conn, part, all_chunks=all_chunks, need=1, barrier=True,
                                                   timeout=timeout))
    return [s.header for s in subs]


def user_records(conn: Connection, ranges: Sequence[tuple[str, int, int]], *, need: int = 1,
                 window: int = MAX_WINDOW, timeout: float = 10.0) -> list[int | None]:
    """User records in each ``(stream, start, end)``, counting no further than ``need``; None when
    the first chunk delivered begins after ``start`` (retention removed it). Every ``end`` must lie
    at or below the stream's committed tail (the chunks are waited for)."""
    subs = [_Sub(stream, start, end, start) for stream, start, end in ranges if start < end]
    _windows(subs, window, lambda part: _run(conn, part, all_chunks=True, need=need, barrier=False,
                                                   timeout=timeout))
    found = iter(subs)
    out: list[int | None] = []
    for _stream, start, end in ranges:
        if start >= end:
            out.append(0)
            continue
        s = next(found)
        out.append(None if s.skipped else min(s.records, need))
    return out


class ManySource(RangeSource, Protocol):
    """What a read of many ranges needs from its client (``StreamClient`` is one): a range read's
    needs, many streams' stats at once, and the client's own connection."""

    @property
    def connection(self) -> Connection: ...

    def stream_stats_many(self, names: Sequence[str]) -> dict[str, StreamStats]: ...


def _member(md: StreamMetadata | None, prefer: Prefer, taken: set[tuple[str, int]]) -> tuple[str, int] | None:
    """The node that serves a stream's ranges (None: the URL's own node), chosen as
    :func:`reader.candidates` orders them, but a replica already serving another stream of this call
    first: fewer connections, more subscriptions in flight on each."""
    if prefer == "url" or md is None or not md.exists:
        return None
    leader = [md.leader] if md.leader is not None else []
    replicas = list(md.replicas)
    tiers = [leader, replicas] if prefer == "leader" else [replicas, leader]
    for tier in tiers:
        if tier:
            used = [m for m in tier if m in taken]
            return used[0] if used else random.choice(tier)
    return None


def read_ranges(client: ManySource, ranges: Sequence[tuple[str, int, int]], *, decode: Literal["amqp", "raw"],
                verify_crc: bool, credit: int, max_batch_records: int, prefer: Prefer, layout: Layout,
                maps: bool, window: int, stats: ReadStats | None,
                max_batch_bytes: int = MAX_BUFFER_BYTES) -> Iterator[tuple[int, Batch]]:
    """:meth:`StreamClient.read_ranges`: the bounds are checked now (one pipelined StreamStats round,
    one Metadata), the records read when the iterator is."""
    for stream, start, end in ranges:
        check_range(stream, start, end)
    check_read_options(decode=decode, credit=credit, max_batch_records=max_batch_records, prefer=prefer,
                       layout=layout, max_batch_bytes=max_batch_bytes)
    live = [i for i, (_s, start, end) in enumerate(ranges) if start < end]
    names = list(dict.fromkeys(ranges[i][0] for i in live))
    if not names:
        return iter(())
    known = client.stream_stats_many(names) if client.supports(c.STREAM_STATS) else {}
    for i in live:
        stream, start, end = ranges[i]
        check_bounds(client, stream, start, end, known.get(stream))
    found = client.metadata(names) if prefer != "url" else {}
    taken: set[tuple[str, int]] = set()
    members: dict[str, tuple[str, int] | None] = {}
    for name in names:
        members[name] = _member(found.get(name), prefer, taken)
        if members[name] is not None:
            taken.add(members[name])  # type: ignore[arg-type]
    reading = _Reading(decode, verify_crc, layout, maps, max_batch_records, credit,
                       stats if stats is not None else ReadStats(), max_batch_bytes)
    return _read_windows(client, ranges, live, members, reading, max(1, min(window, MAX_WINDOW)), prefer)


def _read_windows(client: ManySource, ranges: Sequence[tuple[str, int, int]], live: list[int],
                  members: dict[str, tuple[str, int] | None], reading: _Reading, size: int,
                  prefer: Prefer) -> Iterator[tuple[int, Batch]]:
    """A window of ranges at a time, in the order asked: each member's share of the window in flight
    together on that member's connection; then the window's records, range by range. A member that
    cannot be reached or drops its connection has its share read by :func:`reader.read_range` (which
    fails over and resumes); nothing of a window is handed out before the window is complete."""
    conns: dict[tuple[str, int] | None, Connection] = {}
    broken: set[tuple[str, int] | None] = set()
    own = (client.params.host, client.params.port)
    try:
        for w in range(0, len(live), size):
            part = live[w:w + size]
            subs = {i: _Sub(ranges[i][0], ranges[i][1], ranges[i][2], ranges[i][1]) for i in part}
            share: dict[tuple[str, int] | None, list[int]] = {}
            for i in part:
                share.setdefault(members[ranges[i][0]], []).append(i)
            alone: list[int] = []
            for member, indices in share.items():
                conn = None if member in broken else _connection(client, conns, member, own)
                if conn is None:
                    broken.add(member)
                    alone += indices
                    continue
                try:
                    _run(conn, [subs[i] for i in indices], all_chunks=True, need=sys.maxsize, barrier=False,
                         timeout=client.timeout, reading=reading, what="read")
                except ConnectionFailed as exc:
                    log.warning("a read of %d ranges from %s lost its connection (%s); reading them one "
                                "by one", len(indices), member or "the URL's node", exc)
                    conns.pop(member, None)
                    if conn is not client.connection:
                        conn.close()
                    broken.add(member)
                    alone += indices
                    continue
                for i in indices:
                    s = subs[i]
                    if s.skipped:
                        assert s.header is not None
                        raise DataLossError(s.stream, s.offset, s.header.first_offset)
            for i in part:
                if i in alone:
                    stream, start, end = ranges[i]
                    batches: list[Batch] = list(read_range(
                        client, stream, start, end, decode=reading.decode, verify_crc=reading.verify_crc,
                        credit=reading.credit, max_batch_records=reading.max_batch_records, prefer=prefer,
                        layout=reading.layout, maps=reading.maps, stats=reading.stats,
                        max_batch_bytes=reading.max_batch_bytes))
                else:
                    batches = subs[i].batches
                    subs[i].batches = []
                for batch in batches:
                    if len(batch):
                        for piece in split_batch(batch, reading.max_batch_records):
                            yield i, piece
    finally:
        pool = getattr(client, "member_pool", None)
        for member, conn in conns.items():
            if conn is client.connection:
                continue
            if pool is not None and member is not None and member not in pool and not conn.closed \
                    and not conn.metadata_updates:
                pool[member] = conn
            else:
                conn.close()


def _connection(client: ManySource, conns: dict[tuple[str, int] | None, Connection],
                member: tuple[str, int] | None, own: tuple[str, int]) -> Connection | None:
    """The connection serving ``member``: the client's own for its node, an idle pooled one
    (``pooled_reads``), else a new one; None when it cannot be reached."""
    if member in conns:
        return conns[member]
    if member is None or member == own:
        conns[member] = client.connection
        return client.connection
    pool: dict[tuple[str, int], Connection] | None = getattr(client, "member_pool", None)
    conn = pool.pop(member, None) if pool else None
    if conn is None or conn.closed:
        try:
            conn = Connection.open(client.params.replace(host=member[0], port=member[1]),
                                   timeout=client.timeout)
        except ConnectionFailed as exc:
            if isinstance(exc, TlsError):
                raise
            log.warning("cannot reach %s:%d (%s); reading its ranges one by one", member[0], member[1], exc)
            return None
    conns[member] = conn
    return conn
