"""Subscriptions: exact ``[start, end)`` range reads and single-chunk probes.

A range read uses its **own connection**, so the socket can be drained at full speed without
interleaving other traffic, and subscribes at offset ``start`` with ``chunk_selector=all``: then
every offset of the stream is covered by a delivered chunk (tracking chunks included, skipped by
the decoder), which makes both ends exact:

* data loss is detected from the first chunk itself (it starts *after* ``start`` only when
  retention removed ``start``), and
* the read stops as soon as a chunk reaches ``end``, even when the range ends in a run of
  tracking chunks that a ``user_data`` subscription would never deliver (it would wait forever).

Which node: a range read asks Metadata for the stream's leader and replicas and connects to their
**advertised** host and port (what the broker says clients should use), by default to a replica,
as the Java client does for consumers (``prefer="replica"``; ``"leader"``, or ``"url"`` for the URL's
own node). A member that cannot be reached is skipped for the next one, the URL's node last; when a
member fails mid-read, the read resumes exactly from the next chunk on another member.

Stream filtering (``filter_values``, RabbitMQ 3.13+): the subscription also carries ``filter.N`` and
``match-unfiltered=true``, so the broker skips every chunk whose Bloom filter rules out all of the
values and that holds no message published without a filter value. The records handed out are then
those of the chunks delivered: a superset of the matching ones (Bloom false positives, other values
in a matching chunk), which the caller filters exactly. A skipped chunk may be the one that reaches
``end``, so the end is found by a **barrier** instead: after each credit grant the read sends a
Metadata request; the broker handles a connection's frames in order and, on credit above its send
limit, sends until the credit or the log runs out, so when the barrier's answer finds more credit
outstanding than that limit, the member's log is exhausted - and ``end`` lies within it because a
filtered read is served by the stream's leader only (a replica's log may lag behind the committed
tail the range was planned against). Any other member, or a broker without filtering, gets the
plain subscription: the read is then complete, merely unpruned.

Flow control: credit is counted in chunks; the server resumes only when the available credit
exceeds half the initial credit (spec 7.9), so credit is returned in blocks of half the initial
credit. The hot loop hands chunk bytes to :func:`decode_chunk` as positions in the connection's
read buffer: no per-chunk copy.
"""

from __future__ import annotations

import logging
import random
import struct
import time
import weakref
from array import array
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from typing import Final, Literal, Protocol

from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.chunk import (
    ChunkHeader,
    decode_chunk,
    decode_chunk_buffers,
    parse_chunk_header,
)
from streamledger.protocol.rabbitmq.connection import Connection, raise_for_code
from streamledger.protocol.rabbitmq.errors import (
    ConnectionClosed,
    ConnectionFailed,
    DataLossError,
    InvalidRequest,
    OffsetOutOfRange,
    ProtocolError,
    ResponseError,
    StreamError,
    StreamTimeout,
    TlsError,
)
from streamledger.protocol.rabbitmq.offsets import OffsetSpec
from streamledger.protocol.rabbitmq.publisher import supports_filtering
from streamledger.protocol.rabbitmq.records import MAX_BUFFER_BYTES, BufferBatch, RecordBatch
from streamledger.protocol.rabbitmq.stats import StreamMetadata, StreamStats
from streamledger.protocol.rabbitmq.url import ConnectionParams
from streamledger.protocol.rabbitmq.wire import (
    Reader,
    credit_frame,
    metadata_frame,
    subscribe_frame,
    unsubscribe_frame,
)


class RangeSource(Protocol):
    """What a range read needs from the client that plans it (``StreamClient`` is one).

    A narrow interface instead of the client itself, so this module does not import the client
    (which imports this module): where to connect, how long to wait, and the stream's bounds.
    """

    @property
    def params(self) -> ConnectionParams: ...

    @property
    def timeout(self) -> float: ...

    def supports(self, key: int) -> bool: ...

    def stream_stats(self, name: str) -> StreamStats: ...

    def committed_tail(self, name: str, *, stats: StreamStats | None = None) -> int: ...

    def metadata(self, names: list[str]) -> dict[str, StreamMetadata]: ...


@dataclass(slots=True)
class ReadStats:
    """What a range read received (pass one to ``read_range(stats=...)``, it is added to): the chunks
    and chunk bytes the broker delivered, and whether the broker filtered them (``filtered``: the
    subscription carried the filter values). A pushed filter is measured against these."""

    chunks: int = 0
    chunk_bytes: int = 0
    records: int = 0  # records of the delivered chunks (some may lie outside the range)
    filtered: bool = False


Prefer = Literal["replica", "leader", "url"]
Layout = Literal["lists", "buffers"]
Batch = RecordBatch | BufferBatch


@dataclass(frozen=True, slots=True)
class RangeRead:
    """What one range read asks for, as :func:`read_range` checked it: the stream and ``[start, end)``,
    and how to read and decode it (``read_range``'s options, ``filter_values`` sorted and unique).
    It exists so that the resume loop and each attempt take the request whole instead of repeating
    its fourteen parameters."""

    stream: str
    start: int
    end: int
    decode: Literal["amqp", "raw"]
    verify_crc: bool
    credit: int
    max_batch_records: int
    prefer: Prefer = "replica"
    layout: Layout = "lists"
    maps: bool = True
    filter_values: tuple[str, ...] | None = None
    max_batch_bytes: int = MAX_BUFFER_BYTES
    first_batch_records: int | None = None

_CHUNK_HEADER_SIZE: Final = 48
_READ_RETRIES: Final = 3
log = logging.getLogger("streamledger.rabbitmq")
CHUNK_RECORDS: Final = struct.Struct(">I")  # NumRecords, at byte 4 of the chunk header
CHUNK_DATA_LENGTH: Final = struct.Struct(">I")  # DataLength, at byte 36


def chunk_position(version: int, buf: bytearray, pos: int, end: int) -> tuple[int, int]:
    """``(subscription id, chunk start)`` inside a Deliver frame body (v1 or v2)."""
    chunk = pos + (9 if version >= 2 else 1)
    if chunk + _CHUNK_HEADER_SIZE > end:
        raise ProtocolError(f"Deliver frame of {end - pos + 4} bytes is too short for a chunk header")
    return buf[pos], chunk


def subscribe(
    conn: Connection,
    sub_id: int,
    stream: str,
    spec: OffsetSpec,
    credit: int,
    properties: dict[str, str] | None = None,
) -> None:
    corr = conn.next_corr()
    frame = subscribe_frame(corr, sub_id, stream, spec, credit, properties)
    code, _ = conn.request(c.SUBSCRIBE, corr, frame, stream=stream)
    raise_for_code(code, c.SUBSCRIBE, stream)


def unsubscribe(conn: Connection, sub_id: int, stream: str) -> None:
    corr = conn.next_corr()
    code, _ = conn.request(c.UNSUBSCRIBE, corr, unsubscribe_frame(corr, sub_id))
    if code not in (c.OK, c.SUBSCRIPTION_ID_DOES_NOT_EXIST):
        raise_for_code(code, c.UNSUBSCRIBE, stream)


def probe_chunk(
    conn: Connection, sub_id: int, stream: str, spec: OffsetSpec, *, all_chunks: bool, wait: float = 0.05
) -> ChunkHeader | None:
    """Header of the first chunk a subscription at ``spec`` would get, or ``None`` if there is none.

    The server writes the chunks available at subscribe time right after the Subscribe response,
    before it reads our next request; a Metadata request is therefore a barrier: if no Deliver
    came before its response, no chunk exists at ``spec``. ``wait`` is a small extra grace period.
    """
    seen: list[ChunkHeader] = []

    def on_deliver(version: int, buf: bytearray, pos: int, end: int) -> None:
        sid, chunk = chunk_position(version, buf, pos, end)
        if sid == sub_id and not seen:
            seen.append(parse_chunk_header(memoryview(buf)[:end], chunk))

    previous = conn.on_deliver
    conn.on_deliver = on_deliver
    try:
        props = {"chunk_selector": "all"} if all_chunks else None
        subscribe(conn, sub_id, stream, spec, 1, props)
        try:
            corr = conn.next_corr()
            conn.call(c.METADATA, corr, metadata_frame(corr, [stream]))
            deadline = time.monotonic() + wait
            while not seen and time.monotonic() < deadline:
                try:
                    key, version, pos, end = conn.read_frame(deadline, "a Deliver frame")
                except StreamTimeout:
                    break
                conn.dispatch(key, version, pos, end, waiting_for="a Deliver frame")
        finally:
            unsubscribe(conn, sub_id, stream)
    finally:
        conn.on_deliver = previous
    return seen[0] if seen else None


def read_range(
    client: RangeSource,
    stream: str,
    start: int,
    end: int,
    *,
    decode: Literal["amqp", "raw"] = "amqp",
    verify_crc: bool = True,
    credit: int = 16,
    max_batch_records: int = 65_536,
    prefer: Prefer = "replica",
    layout: Layout = "lists",
    maps: bool = True,
    filter_values: Collection[str] | None = None,
    stats: ReadStats | None = None,
    max_batch_bytes: int = MAX_BUFFER_BYTES,
    first_batch_records: int | None = None,
) -> Iterator[Batch]:
    """Yield exactly the user records with ``start <= offset < end`` as :class:`RecordBatch` es.

    With ``filter_values`` (module docstring), only the records of the chunks the broker's stream
    filtering lets through: every record whose filter value is one of them, or that has none, is
    among them; the caller post-filters. ``stats`` counts what was delivered.

    ``prefer`` picks the node that serves the read (module docstring): ``replica`` (default),
    ``leader`` or ``url``. ``layout="buffers"`` yields :class:`BufferBatch` es instead (flat body
    buffers, offsets as runs: no Python object per record); with it, ``maps=False`` skips the map
    columns. Either way a batch holds at most ``max_batch_records`` records; a buffer batch also
    ends before a chunk would take its body bytes past ``max_batch_bytes`` (it holds one chunk at
    least): what a caller that writes as it reads keeps in memory at once, whatever the record size.
    ``first_batch_records``: the first batch holds at most this many records and each next one twice
    the one before, up to ``max_batch_records``: a consumer that works on each batch as it comes
    (Spark's JVM converting a task's Arrow batches) starts after a few chunks, not after a whole
    maximal batch (a range smaller than that would be one batch, read entirely before any of it is
    handed on). Towards the end of the range the batches shrink again (each at most half the offsets
    left, not below ``first_batch_records``), so the consumer's work on the last one, after the read
    is over, is short too. The last batch is handed out before the read lets go of its connection.

    Arguments and bounds are checked now (not on the first ``next()``): an empty range returns
    an empty iterator without touching the network, an ``end`` beyond the committed tail raises
    :class:`OffsetOutOfRange` (it would wait for data that does not exist yet), and a ``start``
    below the first retained offset raises :class:`DataLossError`.
    """
    check_range(stream, start, end)
    check_read_options(decode=decode, credit=credit, max_batch_records=max_batch_records, prefer=prefer,
                       layout=layout, max_batch_bytes=max_batch_bytes)
    if first_batch_records is not None and (
            not isinstance(first_batch_records, int) or isinstance(first_batch_records, bool)
            or first_batch_records < 1):
        raise InvalidRequest(f"first_batch_records must be a positive integer, not {first_batch_records!r}")
    values = _filter_values(stream, filter_values)
    if start == end:
        return iter(())
    known = client.stream_stats(stream) if client.supports(c.STREAM_STATS) else None
    check_bounds(client, stream, start, end, known)
    request = RangeRead(stream, start, end, decode=decode, verify_crc=verify_crc, credit=credit,
                        max_batch_records=max_batch_records, prefer=prefer, layout=layout, maps=maps,
                        filter_values=values, max_batch_bytes=max_batch_bytes,
                        first_batch_records=first_batch_records)
    return _read(client, request, stats if stats is not None else ReadStats())


def check_range(stream: str, start: int, end: int) -> None:
    """Both ends are offsets and ``start <= end`` (refused before anything is asked of the broker)."""
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise InvalidRequest(f"read_range on stream {stream!r}: {name}={value!r} is not an offset")
    if start > end:
        raise InvalidRequest(f"read_range on stream {stream!r}: start {start} is after end {end}")


def check_read_options(*, decode: str, credit: int, max_batch_records: int, prefer: str, layout: str,
                       max_batch_bytes: int = MAX_BUFFER_BYTES) -> None:
    if decode not in ("amqp", "raw"):
        raise InvalidRequest(f"decode must be 'amqp' or 'raw', not {decode!r}")
    if not isinstance(credit, int) or not 1 <= credit <= 32_767:
        raise InvalidRequest(f"credit must be in 1..32767 chunks, not {credit!r}")
    if not isinstance(max_batch_records, int) or max_batch_records < 1:
        raise InvalidRequest(f"max_batch_records must be a positive integer, not {max_batch_records!r}")
    if (not isinstance(max_batch_bytes, int) or isinstance(max_batch_bytes, bool)
            or not 1 <= max_batch_bytes <= MAX_BUFFER_BYTES):
        raise InvalidRequest(f"max_batch_bytes must be in 1..{MAX_BUFFER_BYTES} bytes, "
                             f"not {max_batch_bytes!r}")
    if prefer not in ("replica", "leader", "url"):
        raise InvalidRequest(f"prefer must be 'replica', 'leader' or 'url', not {prefer!r}")
    if layout not in ("lists", "buffers"):
        raise InvalidRequest(f"layout must be 'lists' or 'buffers', not {layout!r}")


def check_bounds(client: RangeSource, stream: str, start: int, end: int, known: StreamStats | None) -> None:
    """A non-empty range's bounds against the stream (``known``: its StreamStats, None without them):
    a ``start`` retention removed is :class:`DataLossError`, an ``end`` past the committed tail
    :class:`OffsetOutOfRange` (the read would wait for data that does not exist yet)."""
    if known is not None and known.first_chunk_id is not None and start < known.first_chunk_id:
        raise DataLossError(stream, start, known.first_chunk_id)
    tail = client.committed_tail(stream, stats=known)
    if end > tail:
        raise OffsetOutOfRange(stream, end, tail)


def _filter_values(stream: str, values: Collection[str] | None) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, str) or not all(isinstance(v, str) and v for v in values) or not values:
        raise InvalidRequest(f"read_range on stream {stream!r}: filter_values must be a non-empty collection "
                             f"of non-empty strings, not {values!r}")
    return tuple(sorted(set(values)))


def _filter_properties(values: tuple[str, ...]) -> dict[str, str]:
    """The Subscribe properties of a filtering read (spec 7.7): ``filter.N`` per value, and the chunks
    holding unfiltered messages too (their filter value is unknown to the broker, not absent)."""
    props = {f"filter.{i}": v for i, v in enumerate(values)}
    props["match-unfiltered"] = "true"
    return props


def split_batch(batch: Batch, size: int) -> Iterator[Batch]:
    if len(batch) <= size:
        yield batch
        return
    if isinstance(batch, BufferBatch):
        yield from _split_buffers(batch, size)
        return
    for i in range(0, len(batch), size):
        j = i + size
        yield RecordBatch(
            batch.stream,
            batch.offsets[i:j],
            batch.chunk_timestamps[i:j],
            batch.bodies[i:j],
            None if batch.properties is None else batch.properties[i:j],
            None if batch.application_properties is None else batch.application_properties[i:j],
            None if batch.message_annotations is None else batch.message_annotations[i:j],
        )


def _split_buffers(batch: BufferBatch, size: int) -> Iterator[BufferBatch]:
    """Cut a buffer batch into batches of at most ``size`` records (only when one chunk alone holds
    more records than ``max_batch_records``)."""
    ends = memoryview(batch.body_offsets).cast("i")
    runs = list(zip(batch.run_starts, batch.run_lengths, batch.run_timestamps, strict=True))
    k = 0  # index of the first record of the piece
    while k < len(batch):
        j = min(k + size, len(batch))
        piece = BufferBatch.empty(batch.stream)
        base = ends[k]
        piece.body_data += batch.body_data[base : ends[j]]
        piece.body_offsets += array("i", [e - base for e in ends[k + 1 : j + 1]]).tobytes()
        for name in ("properties", "application_properties", "message_annotations"):
            column = getattr(batch, name)
            if column is not None and any(v is not None for v in column[k:j]):
                setattr(piece, name, column[k:j])
        at = 0
        for s, n, t in runs:  # the runs overlapping [k, j)
            a, b = max(at, k), min(at + n, j)
            if a < b:
                piece.add_run(s + a - at, b - a, t)
            at += n
        yield piece
        k = j


@dataclass(slots=True)
class _Progress:
    """Where a range read stands; survives a reconnect so a resumed read stays exact."""

    position: int  # next offset not yet decoded (a chunk boundary after the first chunk)
    batch: Batch
    member: tuple[str, int] | None = None  # the node being read from
    role: str = "url"  # what Metadata says the member is: replica, leader or url
    failed: set[tuple[str, int]] = field(default_factory=set)  # members that broke during this read


def candidates(client: RangeSource, stream: str, prefer: Prefer) -> list[tuple[ConnectionParams, str]]:
    """Where to read ``stream`` from, in order, each with its role (``replica``, ``leader``, ``url``).

    Replicas are shuffled so that concurrent readers spread over them. The URL's own node comes
    last (first and only with ``prefer="url"``, or when Metadata has no answer).
    """
    params = client.params
    url = [(params, "url")]
    if prefer == "url":
        return url
    try:
        md = client.metadata([stream]).get(stream)
    except StreamError as exc:
        log.info("no Metadata for stream %r (%s); reading from %s", stream, exc, params.address)
        return url
    if md is None or not md.exists:
        return url
    replicas = list(md.replicas)
    random.shuffle(replicas)
    leader = [md.leader] if md.leader is not None else []
    ordered = [(r, "replica") for r in replicas] + [(m, "leader") for m in leader]
    if prefer == "leader":
        ordered = ordered[len(replicas):] + ordered[: len(replicas)]
    out = [(params.replace(host=host, port=port), role) for (host, port), role in ordered]
    if all((p.host, p.port) != (params.host, params.port) for p, _ in out):
        out += url
    return out


def _pool(client: RangeSource) -> dict[tuple[str, int], Connection] | None:
    """The client's idle member connections, when it keeps them between reads (``StreamClient.
    pooled_reads``): many small reads (a batch's probe, a task's packed slices) then cost a
    subscription each, not a connection each."""
    return getattr(client, "member_pool", None)


_next_sub: weakref.WeakKeyDictionary[Connection, int] = weakref.WeakKeyDictionary()
"""The subscription id the next read on a pooled connection uses: a new one per read, so a
delivery of an earlier read's subscription can never be taken for this read's."""


def _release(client: RangeSource, conn: Connection, sub_id: int, stream: str, progress: _Progress) -> None:
    """Unsubscribe and hand the connection to the client's pool (``pooled_reads``); close it when
    there is no pool or the unsubscribe did not go through cleanly. Without a pool the connection
    is closed right away: a Close ends its subscription too (one round trip, not two)."""
    pool = _pool(client)
    member = progress.member
    if pool is None:
        conn.close()
        return
    try:
        unsubscribe(conn, sub_id, stream)
    except Exception:  # the range is complete (or abandoned by the caller): only the goodbye failed
        conn.close()
        return
    if pool is None or conn.metadata_updates or member is None or member in pool or conn.closed:
        conn.close()
        return
    # Unsubscribed cleanly: the server sends nothing more for this subscription.
    conn.on_credit_error = None
    _next_sub[conn] = (sub_id + 1) % 256
    pool[member] = conn


def _batch_bound(limit: int, first_batch: int | None, left: int) -> int:
    """How many records the batch starting now may hold: ``limit`` (the ramp of
    ``first_batch_records``, doubling up to ``max_batch_records``); with ``first_batch_records``, also
    at most half the ``left`` offsets of the range, never fewer than ``first_batch_records``: the
    batches shrink again towards the end, so the last one, which the consumer works on after the
    read is over, is small too (it holds at most ``first_batch_records`` records, or one chunk)."""
    if first_batch is None:
        return limit
    return min(limit, max(first_batch, left // 2))


def _open_member(client: RangeSource, stream: str, prefer: Prefer, progress: _Progress) -> Connection:
    """A connection to the first reachable candidate that has not failed during this read (an
    idle pooled connection to a candidate first)."""
    found = candidates(client, stream, prefer)
    fresh = [(p, role) for p, role in found if (p.host, p.port) not in progress.failed] or found
    pool = _pool(client)
    if pool:
        for params, role in fresh:
            conn = pool.pop((params.host, params.port), None)
            if conn is not None and not conn.closed:
                progress.member = (params.host, params.port)
                progress.role = role
                return conn
    last: ConnectionFailed | None = None
    for params, role in fresh:
        try:
            conn = Connection.open(params, timeout=client.timeout)
        except ConnectionFailed as exc:
            if isinstance(exc, TlsError):
                raise
            log.warning("cannot reach %s (%s of stream %r): %s; trying the next member", params.address, role,
                        stream, exc)
            progress.failed.add((params.host, params.port))
            last = exc
            continue
        progress.member = (params.host, params.port)
        progress.role = role
        log.info("reading stream %r from %s (%s) at offset %d", stream, params.address, role,
                 progress.position)
        return conn
    assert last is not None
    raise last


def _transient(exc: ConnectionFailed) -> bool:
    """A dropped connection is worth one more try; a TLS failure or a server Close is not."""
    if isinstance(exc, TlsError):
        return False
    return not (isinstance(exc, ConnectionClosed) and exc.code is not None)


def _read(client: RangeSource, request: RangeRead, stats: ReadStats | None = None) -> Iterator[Batch]:
    """Read with resume: if the connection drops, reconnect and subscribe again at the first offset
    not yet decoded (always a chunk boundary), so no record is lost or repeated."""
    stream, start, end = request.stream, request.start, request.end
    progress = _Progress(start, _empty(stream, request.decode, request.layout))
    stats = stats if stats is not None else ReadStats()
    if request.filter_values is not None and request.prefer == "replica":
        # a filtered read is exact only on the leader (module docstring)
        request = replace(request, prefer="leader")
    retries = 0
    while True:
        try:
            yield from _read_once(client, request, progress, stats)
            break
        except ConnectionFailed as exc:
            if progress.position >= end:
                break  # every record was decoded; only the goodbye failed
            if progress.member is not None:
                progress.failed.add(progress.member)
            if not _transient(exc) or retries >= _READ_RETRIES:
                raise
            retries += 1
            log.warning("read of stream %r [%d, %d) lost its connection at offset %d (%s); resuming (%d/%d)",
                        stream, start, end, progress.position, exc, retries, _READ_RETRIES)
            time.sleep(min(2.0, 0.2 * 2**retries))
    if len(progress.batch):
        yield from split_batch(progress.batch, request.max_batch_records)


def _barrier(conn: Connection, stream: str) -> int:
    """Send a Metadata request whose answer marks where the broker's answers to everything sent
    before it end (the filtered read's end test); returns its correlation id."""
    corr = conn.next_corr()
    conn.send(metadata_frame(corr, [stream]))
    return corr


def _check_skipped(client: RangeSource, stream: str, wanted: int, first: int, filtering: bool) -> None:
    """The first chunk delivered starts after the subscription's offset: retention removed what lay
    between, unless the broker's filtering skipped it (then the stream's first offset tells)."""
    if not filtering:
        raise DataLossError(stream, wanted, first)
    stats = client.stream_stats(stream) if client.supports(c.STREAM_STATS) else None
    retained = stats.first_chunk_id if stats is not None else None
    if retained is not None and retained > wanted:
        raise DataLossError(stream, wanted, retained)


def _empty(stream: str, decode: Literal["amqp", "raw"], layout: Layout) -> Batch:
    return BufferBatch.empty(stream) if layout == "buffers" else RecordBatch.empty(stream, decode)


def _read_once(
    client: RangeSource, request: RangeRead, progress: _Progress, stats: ReadStats | None = None
) -> Iterator[Batch]:
    """One attempt of ``request`` on one member, from ``progress.position``; a dropped connection
    leaves ``progress`` where the next attempt resumes."""
    stream, end, decode, layout = request.stream, request.end, request.decode, request.layout
    verify_crc, credit, maps = request.verify_crc, request.credit, request.maps
    max_batch_records, max_batch_bytes = request.max_batch_records, request.max_batch_bytes
    first_batch = request.first_batch_records
    limit = min(first_batch or max_batch_records, max_batch_records)  # grows to the max
    filter_values = request.filter_values
    buffers = layout == "buffers"
    stats = stats if stats is not None else ReadStats()
    conn = _open_member(client, stream, request.prefer, progress)
    sub_id = _next_sub.get(conn, 0)
    from_offset = progress.position
    filtering = filter_values is not None and progress.role == "leader" and supports_filtering(conn)
    if filter_values is not None and not filtering:
        log.info("read of stream %r from %s (%s, RabbitMQ %s): no broker-side filtering, reading every chunk",
                 stream, progress.member, progress.role, conn.server_version)
    try:
        credit_errors: list[int] = []
        conn.on_credit_error = lambda _sub, code: credit_errors.append(code)
        # chunk_selector=all: every offset is covered by a delivered chunk (module docstring).
        props = {"chunk_selector": "all"}
        if filtering:
            assert filter_values is not None
            props.update(_filter_properties(filter_values))
            stats.filtered = True
        subscribe(conn, sub_id, stream, OffsetSpec.offset(from_offset), credit, props)
        top_up = max(1, credit // 2)
        send_limit = credit // 2  # the broker sends only on more credit than this (spec 7.9)
        outstanding = credit  # credit granted and not yet used by a delivered chunk
        barrier = _barrier(conn, stream) if filtering else None
        pending = 0
        first_chunk = True
        bound = _batch_bound(limit, first_batch, end - progress.position)  # the batch being filled
        timeout = client.timeout
        send = conn.send
        read_frame = conn.read_frame
        waiting = f"chunks of stream {stream!r}"
        while True:
            key, version, pos, frame_end = read_frame(time.monotonic() + timeout, waiting)
            if barrier is not None and key == c.METADATA | c.RESPONSE_BIT:
                if Reader(conn.buffer, pos, frame_end, "Metadata response").u32() != barrier:
                    continue  # an earlier barrier's answer; a later one is on its way
                if outstanding > send_limit:  # the broker stopped with credit to spare: its log ends
                    progress.position = end
                    break
                send(credit_frame(sub_id, pending))  # pending > 0 here: nothing else lowers the credit
                outstanding += pending
                pending = 0
                barrier = _barrier(conn, stream)
                continue
            if key != c.DELIVER:
                conn.dispatch(key, version, pos, frame_end, waiting_for=waiting)
                if conn.metadata_updates:
                    code, name = conn.metadata_updates[-1]
                    raise ResponseError(f"read up to offset {end} stopped at offset {progress.position}",
                                        code, c.code_name(code), name)
                if credit_errors:
                    raise ResponseError("Credit", credit_errors[0], c.code_name(credit_errors[0]), stream)
                continue
            view = conn.view
            if view[pos] != sub_id:
                continue
            chunk = pos + (9 if version >= 2 else 1)
            batch = progress.batch
            # Hand out the batch before it would outgrow limit (at most max_batch_records; cheaper than
            # slicing), or (buffers) max_batch_bytes, at most the int32 body offsets; then only a chunk
            # decompressing past those can fail.
            if len(batch) and (
                len(batch) + CHUNK_RECORDS.unpack_from(view, chunk + 4)[0] > bound
                or (buffers and len(batch.body_data)  # type: ignore[union-attr]
                    + CHUNK_DATA_LENGTH.unpack_from(view, chunk + 36)[0] > max_batch_bytes)
            ):
                progress.batch = _empty(stream, decode, layout)
                limit = min(2 * limit, max_batch_records)
                bound = _batch_bound(limit, first_batch, end - progress.position)
                yield batch
                batch = progress.batch
            if buffers:
                header = decode_chunk_buffers(view[:frame_end], chunk, start=progress.position, end=end,
                                              decode=decode, verify_crc=verify_crc, maps=maps,
                                              out=batch)  # type: ignore[arg-type]
            else:
                header = decode_chunk(view[:frame_end], chunk, start=progress.position, end=end,
                                      decode=decode, verify_crc=verify_crc, out=batch)  # type: ignore[arg-type]
            stats.chunks += 1
            stats.chunk_bytes += frame_end - chunk
            stats.records += header.num_records
            if first_chunk:
                first_chunk = False
                if header.first_offset > from_offset:
                    _check_skipped(client, stream, from_offset, header.first_offset, filtering)
            progress.position = max(progress.position, header.first_offset + header.num_records)
            if progress.position >= end:
                break
            pending += 1
            outstanding -= 1
            if pending >= top_up:
                send(credit_frame(sub_id, pending))
                outstanding += pending
                pending = 0
                if barrier is not None:
                    barrier = _barrier(conn, stream)
            if len(batch) >= bound:
                progress.batch = _empty(stream, decode, layout)
                limit = min(2 * limit, max_batch_records)
                bound = _batch_bound(limit, first_batch, end - progress.position)
                yield from split_batch(batch, max_batch_records)
        # The range is complete: hand out its last batch before the goodbye (Unsubscribe or Close
        # round trips), so the consumer works on it meanwhile.
        rest, progress.batch = progress.batch, _empty(stream, decode, layout)
        if len(rest):
            yield from split_batch(rest, max_batch_records)
        _release(client, conn, sub_id, stream, progress)
        return
    except GeneratorExit:  # the caller stopped early (it has what it needed)
        _release(client, conn, sub_id, stream, progress)
        raise
    except StreamTimeout:
        raise StreamTimeout(
            f"read of stream {stream!r} up to offset {end}: no chunk after offset {progress.position} "
            f"within {client.timeout:g}s"
        ) from None
    except BaseException:
        conn.close()
        raise
    conn.close()
