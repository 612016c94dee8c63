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
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from streamledger.protocol.rabbitmq.records import MAX_BUFFER_BYTES, BufferBatch, RecordBatch
from streamledger.protocol.rabbitmq.stats import StreamMetadata, StreamStats
from streamledger.protocol.rabbitmq.url import ConnectionParams
from streamledger.protocol.rabbitmq.wire import (
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


Prefer = Literal["replica", "leader", "url"]
Layout = Literal["lists", "buffers"]
Batch = RecordBatch | BufferBatch

_CHUNK_HEADER_SIZE: Final = 48
_READ_RETRIES: Final = 3
log = logging.getLogger("streamledger.rabbitmq")
_CHUNK_RECORDS: Final = struct.Struct(">I")  # NumRecords, at byte 4 of the chunk header
_CHUNK_DATA_LENGTH: Final = struct.Struct(">I")  # DataLength, at byte 36


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
) -> Iterator[Batch]:
    """Yield exactly the user records with ``start <= offset < end`` as :class:`RecordBatch` es.

    ``prefer`` picks the node that serves the read (module docstring): ``replica`` (default),
    ``leader`` or ``url``. ``layout="buffers"`` yields :class:`BufferBatch` es instead (flat body
    buffers, offsets as runs: no Python object per record); with it, ``maps=False`` skips the map
    columns. Either way a batch holds at most ``max_batch_records`` records.

    Arguments and bounds are checked now (not on the first ``next()``): an empty range returns
    an empty iterator without touching the network, an ``end`` beyond the committed tail raises
    :class:`OffsetOutOfRange` (it would wait for data that does not exist yet), and a ``start``
    below the first retained offset raises :class:`DataLossError`.
    """
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise InvalidRequest(f"read_range on stream {stream!r}: {name}={value!r} is not an offset")
    if start > end:
        raise InvalidRequest(f"read_range on stream {stream!r}: start {start} is after end {end}")
    if decode not in ("amqp", "raw"):
        raise InvalidRequest(f"decode must be 'amqp' or 'raw', not {decode!r}")
    if not isinstance(credit, int) or not 1 <= credit <= 32_767:
        raise InvalidRequest(f"credit must be in 1..32767 chunks, not {credit!r}")
    if not isinstance(max_batch_records, int) or max_batch_records < 1:
        raise InvalidRequest(f"max_batch_records must be a positive integer, not {max_batch_records!r}")
    if prefer not in ("replica", "leader", "url"):
        raise InvalidRequest(f"prefer must be 'replica', 'leader' or 'url', not {prefer!r}")
    if layout not in ("lists", "buffers"):
        raise InvalidRequest(f"layout must be 'lists' or 'buffers', not {layout!r}")
    if start == end:
        return iter(())
    stats = client.stream_stats(stream) if client.supports(c.STREAM_STATS) else None
    if stats is not None and stats.first_chunk_id is not None and start < stats.first_chunk_id:
        raise DataLossError(stream, start, stats.first_chunk_id)
    tail = client.committed_tail(stream, stats=stats)
    if end > tail:
        raise OffsetOutOfRange(stream, end, tail)
    return _read(client, stream, start, end, decode=decode, verify_crc=verify_crc, credit=credit,
                 max_batch_records=max_batch_records, prefer=prefer, layout=layout, maps=maps)


def _split(batch: Batch, size: int) -> Iterator[Batch]:
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
    there is no pool or the unsubscribe did not go through cleanly."""
    pool = _pool(client)
    member = progress.member
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


def _open_member(client: RangeSource, stream: str, prefer: Prefer, progress: _Progress) -> Connection:
    """A connection to the first reachable candidate that has not failed during this read (an
    idle pooled connection to a candidate first)."""
    found = candidates(client, stream, prefer)
    fresh = [(p, role) for p, role in found if (p.host, p.port) not in progress.failed] or found
    pool = _pool(client)
    if pool:
        for params, _role in fresh:
            conn = pool.pop((params.host, params.port), None)
            if conn is not None and not conn.closed:
                progress.member = (params.host, params.port)
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


def _read(
    client: RangeSource,
    stream: str,
    start: int,
    end: int,
    *,
    decode: Literal["amqp", "raw"],
    verify_crc: bool,
    credit: int,
    max_batch_records: int,
    prefer: Prefer = "replica",
    layout: Layout = "lists",
    maps: bool = True,
) -> Iterator[Batch]:
    """Read with resume: if the connection drops, reconnect and subscribe again at the first offset
    not yet decoded (always a chunk boundary), so no record is lost or repeated."""
    progress = _Progress(start, _empty(stream, decode, layout))
    retries = 0
    while True:
        try:
            yield from _read_once(client, stream, progress, end, decode=decode, verify_crc=verify_crc,
                                  credit=credit, max_batch_records=max_batch_records, prefer=prefer,
                                  layout=layout, maps=maps)
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
        yield from _split(progress.batch, max_batch_records)


def _empty(stream: str, decode: Literal["amqp", "raw"], layout: Layout) -> Batch:
    return BufferBatch.empty(stream) if layout == "buffers" else RecordBatch.empty(stream, decode)


def _read_once(
    client: RangeSource,
    stream: str,
    progress: _Progress,
    end: int,
    *,
    decode: Literal["amqp", "raw"],
    verify_crc: bool,
    credit: int,
    max_batch_records: int,
    prefer: Prefer = "replica",
    layout: Layout = "lists",
    maps: bool = True,
) -> Iterator[Batch]:
    buffers = layout == "buffers"
    conn = _open_member(client, stream, prefer, progress)
    sub_id = _next_sub.get(conn, 0)
    from_offset = progress.position
    try:
        credit_errors: list[int] = []
        conn.on_credit_error = lambda _sub, code: credit_errors.append(code)
        # chunk_selector=all: every offset is covered by a delivered chunk (module docstring).
        subscribe(conn, sub_id, stream, OffsetSpec.offset(from_offset), credit, {"chunk_selector": "all"})
        top_up = max(1, credit // 2)
        pending = 0
        first_chunk = True
        timeout = client.timeout
        send = conn.send
        read_frame = conn.read_frame
        waiting = f"chunks of stream {stream!r}"
        while True:
            key, version, pos, frame_end = read_frame(time.monotonic() + timeout, waiting)
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
            # Hand out the batch before it would outgrow max_batch_records (cheaper than slicing), or
            # (buffers) the int32 body offsets; then only a chunk decompressing past that can fail.
            if len(batch) and (
                len(batch) + _CHUNK_RECORDS.unpack_from(view, chunk + 4)[0] > max_batch_records
                or (buffers and len(batch.body_data)  # type: ignore[union-attr]
                    + _CHUNK_DATA_LENGTH.unpack_from(view, chunk + 36)[0] > MAX_BUFFER_BYTES)
            ):
                progress.batch = _empty(stream, decode, layout)
                yield batch
                batch = progress.batch
            if buffers:
                header = decode_chunk_buffers(view[:frame_end], chunk, start=progress.position, end=end,
                                              decode=decode, verify_crc=verify_crc, maps=maps,
                                              out=batch)  # type: ignore[arg-type]
            else:
                header = decode_chunk(view[:frame_end], chunk, start=progress.position, end=end,
                                      decode=decode, verify_crc=verify_crc, out=batch)  # type: ignore[arg-type]
            if first_chunk:
                first_chunk = False
                if header.first_offset > from_offset:
                    raise DataLossError(stream, from_offset, header.first_offset)
            progress.position = max(progress.position, header.first_offset + header.num_records)
            if progress.position >= end:
                break
            pending += 1
            if pending >= top_up:
                send(credit_frame(sub_id, pending))
                pending = 0
            if len(batch) >= max_batch_records:
                progress.batch = _empty(stream, decode, layout)
                yield from _split(batch, max_batch_records)
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
