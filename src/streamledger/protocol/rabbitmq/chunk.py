"""Osiris chunks: the 48-byte header, entries, record offsets, CRC (osiris-chunk.md).

:func:`decode_chunk` is the read path's hot loop. Per-record Python work is what costs, so:

* records are cut out of the data section by one loop (``_split_entries``): the optional C
  accelerator (``_accel.c``) when built, else its pure-Python twin; without the accelerator,
  chunks whose entries are all simple and of one size (fixed-size payloads are common) are cut
  with a single list comprehension after checking every size prefix at once with strided slices;
* offsets and timestamps are appended as ``range``/repeated lists, never per record;
* AMQP bodies go through :func:`amqp.decode_columns`, whose common case (a lone data section) is
  a byte comparison;
* nothing outside ``[start, end)`` is decoded; the entry walk still covers the whole data section
  so that the header's entry and record counts are always checked;
* :func:`decode_chunk_buffers` fills the buffer layout (:class:`~.records.BufferBatch`) instead: the
  bodies are copied by one C pass (``append_bodies``) into a flat buffer with int32 end offsets, so
  no Python object is made per record (issue 11: this turned a Spark task's ~0.75 s of CPU per
  million records into ~0.15 s; docs/performance.md).

Measured with ``bench/decode.py`` (1,000,000 records of ~100 bytes, 500 per chunk, CRC on) on
the shared, heavily loaded 2-core machine, in records per CPU second over several runs, C
accelerator / pure Python: raw fixed-size 6.8-10 M / 3.2-3.5 M, raw varied-size 6.9-7.8 M /
1.9-2.4 M, AMQP lone data section 6.6-9.3 M / 2.5-3.7 M (split and body cut fused in one C
pass), AMQP varied-size 5.2-7.0 M / 1.1-1.7 M, AMQP with properties + application-properties
0.4-0.6 M / 0.07 M, gzip sub-batches 2.3-3.1 M / 1.0-1.5 M. CRC-32 is about a quarter of the
raw figure. End to end (``read_range`` from a local 4.3 broker) the reader spends about a fifth
of its CPU here and mostly waits for the broker.

Corrupt input raises :class:`ChunkFormatError` (or :class:`CrcMismatch`) naming the chunk's first
offset: every length is checked against the bytes actually present before it is used, so a bad
chunk fails fast and never triggers an allocation larger than the input.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from streamledger.protocol.rabbitmq.amqp import ACCEL, _data_bodies_py, decode_columns, decode_misses
from streamledger.protocol.rabbitmq.compression import CODEC_NONE, codec_name, compress, decompress
from streamledger.protocol.rabbitmq.errors import (
    ChunkFormatError,
    CodecUnavailable,
    CrcMismatch,
)
from streamledger.protocol.rabbitmq.records import MAX_BUFFER_BYTES, BufferBatch, RecordBatch

CHUNK_HEADER_SIZE = 48
CHUNK_MAGIC_VERSION = 0x50
CHUNK_TYPE_USER = 0
CHUNK_TYPE_TRACKING_DELTA = 1
CHUNK_TYPE_TRACKING_SNAPSHOT = 2

# A decompression bomb guard: publishers batch at most a few MiB of records per sub-batch.
MAX_SUB_BATCH_BYTES = 256 * 1024 * 1024

_HEADER = struct.Struct(">BBHIqQQIIIB3x")
_u32 = struct.Struct(">I").unpack_from
_SUB_HEADER = struct.Struct(">BHII")
_DATA8 = b"\x00\x53\x75\xa0"


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """The decoded 48-byte chunk header (osiris-chunk.md section 2)."""

    chunk_type: int
    num_entries: int
    num_records: int
    timestamp: int
    epoch: int
    first_offset: int
    crc: int
    data_length: int
    trailer_length: int
    bloom_size: int

    @property
    def next_offset(self) -> int:
        """Offset of the first record of the following chunk."""
        return self.first_offset + self.num_records


def parse_chunk_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> ChunkHeader:
    """Decode the header at ``buf[pos:]``; :class:`ChunkFormatError` if short or not a chunk."""
    have = len(buf) - pos
    if have < CHUNK_HEADER_SIZE:
        raise ChunkFormatError(f"truncated chunk header: {max(have, 0)} of {CHUNK_HEADER_SIZE} bytes")
    magic, ctype, n_entries, n_records, ts, epoch, first, crc, dlen, tlen, bloom = _HEADER.unpack_from(
        buf, pos)
    if magic != CHUNK_MAGIC_VERSION:
        raise ChunkFormatError(
            f"chunk at offset {first}: magic/version byte is 0x{magic:02x}, expected 0x50")
    return ChunkHeader(ctype, n_entries, n_records, ts, epoch, first, crc, dlen, tlen, bloom)


def _uniform(data: bytes, stride: int, count: int, width: int) -> bool:
    """Whether the first ``width`` bytes of each of ``count`` ``stride``-sized slots are identical."""
    for i in range(width):
        column = data[i::stride]
        if column.count(data[i]) != count:
            return False
    return True


def _bad(first: int, reason: str) -> ChunkFormatError:
    return ChunkFormatError(f"chunk at offset {first}: {reason}")


def _plain_records(ub: bytes, count: int, klo: int, khi: int, first: int) -> list[bytes]:
    """Records ``klo..khi-1`` of a decompressed sub-batch (``count`` records, plain uint32 sizes)."""
    n = len(ub)
    if not ACCELERATED and count and n >= 4:
        s = _u32(ub, 0)[0]
        stride = s + 4
        if stride * count == n and _uniform(ub, stride, count, 4):
            return [ub[p : p + s] for p in range(4 + klo * stride, 4 + khi * stride, stride)]
    try:
        records = _split_entries(ub, True)
    except ValueError as exc:
        raise _bad(first, f"sub-batch record list: {exc}") from None
    assert records is not None  # plain lists have no sub-batch flag
    if len(records) != count:
        raise _bad(first, f"sub-batch holds {len(records)} records, its header says {count}")
    return records[klo:khi] if klo or khi != count else records


def _records(data: bytes, header: ChunkHeader, klo: int, khi: int) -> list[bytes]:
    """The records with chunk-relative index ``klo <= k < khi``, as bytes.

    The whole data section is walked even past ``khi`` so that the entry and record counts of
    the header are always checked against what the entries hold.
    """
    dl = len(data)
    first = header.first_offset
    n_entries = header.num_entries
    # pure-Python fast path: all entries simple and of one size (the C loop is faster still)
    if not ACCELERATED and n_entries == header.num_records and n_entries and dl >= 4:
        s = _u32(data, 0)[0]
        stride = s + 4
        if s < 0x80000000 and stride * n_entries == dl and _uniform(data, stride, n_entries, 4):
            return [data[p : p + s] for p in range(4 + klo * stride, 4 + khi * stride, stride)]
    try:
        simple = _split_entries(data, False)
    except ValueError as exc:
        raise _bad(first, str(exc)) from None
    if simple is not None:
        if len(simple) != header.num_records or len(simple) != n_entries:
            raise _bad(first, f"data section holds {len(simple)} simple entries, the header says "
                              f"{n_entries} entries and {header.num_records} records")
        return simple[klo:khi] if klo or khi != len(simple) else simple
    out: list[bytes] = []
    append = out.append
    p = 0
    k = 0
    entries = 0
    u32 = _u32
    try:
        while p < dl:
            w = u32(data, p)[0]
            if w < 0x80000000:
                q = p + 4 + w
                if q > dl:
                    raise _bad(first, f"entry at data byte {p} ({w} bytes) runs past the data section")
                if klo <= k < khi:
                    append(data[p + 4 : q])
                k += 1
            else:
                flags, count, ulen, clen = _SUB_HEADER.unpack_from(data, p)
                q = p + 11 + clen
                if q > dl:
                    raise _bad(first, f"sub-batch at data byte {p} ({clen} bytes) runs past the data section")
                if k + count > klo and k < khi:
                    out.extend(_sub_batch(data, p + 11, q, flags, count, ulen, klo - k, khi - k, first))
                k += count
            p = q
            entries += 1
    except struct.error:
        raise _bad(first, f"entry header at data byte {p} is truncated") from None
    if k != header.num_records:
        raise _bad(first, f"entries hold {k} records, the header says {header.num_records}")
    if entries != n_entries:
        raise _bad(first, f"data section holds {entries} entries, the header says {n_entries}")
    return out


def _split_entries_py(data: bytes, plain: bool) -> list[bytes] | None:
    """Every record of a data section (``plain=False``) or of a sub-batch record list (``plain=True``).

    Returns ``None`` at the first sub-batch entry of a data section. The tightest loop of this
    module (one unpack, one slice, one append per record) and the pure-Python twin of
    ``_accel.split_entries``, with the same ``ValueError`` texts. A size running past the end
    only shortens the last slice (never an allocation beyond the input) and is then reported.
    """
    out: list[bytes] = []
    append = out.append
    u32 = _u32
    limit = 0x100000000 if plain else 0x80000000
    dl = len(data)
    p = 0
    try:
        while p < dl:
            w = u32(data, p)[0]
            if w >= limit:
                return None
            p += 4
            q = p + w
            append(data[p:q])
            p = q
    except struct.error:
        raise ValueError(f"entry header at data byte {p} is truncated") from None
    if p != dl:
        raise ValueError(f"last entry runs {p - dl} bytes past the data section")
    return out


_split_entries: Callable[[bytes, bool], list[bytes] | None] = (
    _split_entries_py if ACCEL is None else ACCEL.split_entries)

def _split_bodies_py(data: bytes) -> tuple[list[bytes], list[int]] | None:
    """Pure-Python twin of ``_accel.split_bodies``: records of a simple-entries data section with
    lone data sections already reduced to their bodies, and the indexes of the other records."""
    records = _split_entries_py(data, False)
    if records is None:
        return None
    found, n_misses = _data_bodies_py(records)
    if not n_misses:
        return found, []  # type: ignore[return-value]
    misses = [i for i, b in enumerate(found) if b is None]
    for i in misses:
        found[i] = records[i]
    return found, misses  # type: ignore[return-value]


_split_bodies: Callable[[bytes], tuple[list[bytes], list[int]] | None] = (
    _split_bodies_py if ACCEL is None else ACCEL.split_bodies)

ACCELERATED = _split_entries is not _split_entries_py
"""Whether the optional C loops (``_accel``) are in use (``STREAMLEDGER_PURE_PYTHON=1`` disables)."""


def _sub_batch(data: bytes, a: int, b: int, flags: int, count: int, ulen: int, klo: int, khi: int,
               first: int) -> list[bytes]:
    codec = (flags & 0x70) >> 4
    if ulen < 4 * count:
        raise _bad(first, f"sub-batch of {count} records declares only {ulen} uncompressed bytes")
    if ulen > MAX_SUB_BATCH_BYTES:
        raise _bad(first, f"sub-batch declares {ulen} uncompressed bytes, more than the "
                          f"{MAX_SUB_BATCH_BYTES} this reader accepts (MAX_SUB_BATCH_BYTES)")
    if codec == CODEC_NONE:
        ub = data[a:b]
        if len(ub) != ulen:
            raise _bad(first, f"uncompressed sub-batch is {len(ub)} bytes, its header says {ulen}")
    else:
        try:
            ub = decompress(codec, data[a:b], max_size=ulen)
        except CodecUnavailable as exc:
            raise CodecUnavailable(f"chunk at offset {first}: {exc}") from None
        except ChunkFormatError as exc:
            raise _bad(first, str(exc)) from None
        if len(ub) != ulen:
            raise _bad(first, f"{codec_name(codec)} sub-batch decompressed to {len(ub)} bytes, "
                              f"its header says {ulen}")
    return _plain_records(ub, count, max(klo, 0), min(khi, count), first)


def decode_chunk(
    buf: bytes | bytearray | memoryview,
    pos: int,
    *,
    start: int,
    end: int,
    decode: Literal["amqp", "raw"],
    verify_crc: bool,
    out: RecordBatch,
) -> ChunkHeader:
    """Append to ``out`` the user records of the chunk at ``buf[pos:]`` with ``start <= offset < end``.

    ``buf[pos:]`` is one chunk as a Deliver frame carries it: header, ``DataLength`` bytes of
    entries, then possibly a trailer (ignored). Non-user chunks append nothing.
    """
    h, data, lo, hi = _user_span(buf, pos, start, end, verify_crc)
    if h.chunk_type != CHUNK_TYPE_USER:
        return h
    if decode == "amqp":
        if out.properties is None or out.application_properties is None or out.message_annotations is None:
            raise ValueError("decode='amqp' needs a RecordBatch with dict columns (RecordBatch.empty)")
    elif decode != "raw":
        raise ValueError(f"decode must be 'amqp' or 'raw', not {decode!r}")
    elif out.properties is not None:
        raise ValueError("decode='raw' needs a RecordBatch without dict columns (RecordBatch.empty)")
    if data is None:
        return h
    first = h.first_offset
    klo = lo - first
    khi = hi - first
    ts = h.timestamp
    if decode == "amqp":
        bodies = None if ACCELERATED else _amqp_uniform(data, h, klo, khi)
        misses: list[int] = []
        if bodies is None:
            fused = _fused_bodies(data, h, klo, khi)
            if fused is not None:
                bodies, misses = fused
        if bodies is not None:
            m = len(bodies)
            if misses:
                props, apps, mas = decode_misses(bodies, misses)  # replaces those records by bodies
                out.bodies.extend(bodies)
                out.properties.extend(props)  # type: ignore[union-attr]
                out.application_properties.extend(apps)  # type: ignore[union-attr]
                out.message_annotations.extend(mas)  # type: ignore[union-attr]
            else:
                out.bodies.extend(bodies)
                nones: list[None] = [None] * m
                out.properties.extend(nones)  # type: ignore[union-attr]
                out.application_properties.extend(nones)  # type: ignore[union-attr]
                out.message_annotations.extend(nones)  # type: ignore[union-attr]
        else:
            recs = _records(data, h, klo, khi)
            m = len(recs)
            bodies, props, apps, mas = decode_columns(recs)
            out.bodies.extend(bodies)
            out.properties.extend(props)  # type: ignore[union-attr]
            out.application_properties.extend(apps)  # type: ignore[union-attr]
            out.message_annotations.extend(mas)  # type: ignore[union-attr]
    else:
        recs = _records(data, h, klo, khi)
        m = len(recs)
        out.bodies.extend(recs)
    if m != khi - klo:
        raise _bad(first, f"expected {khi - klo} records in range, found {m}")
    out.offsets.extend(range(lo, hi))
    out.chunk_timestamps.extend([ts] * m)
    return h


def _user_span(buf: bytes | bytearray | memoryview, pos: int, start: int, end: int,
               verify_crc: bool) -> tuple[ChunkHeader, bytes | None, int, int]:
    """What both decoders do first: the chunk's header, and for a user chunk with offsets in
    ``[start, end)`` its (CRC-checked) data section and the offsets ``lo..hi-1`` to decode; the data
    is ``None`` when there is nothing to decode (another chunk type, or no offset in range)."""
    h = parse_chunk_header(buf, pos)
    first = h.first_offset
    ds = pos + CHUNK_HEADER_SIZE
    de = ds + h.data_length
    if de > len(buf):
        raise _bad(first, f"data section truncated: {len(buf) - ds} of {h.data_length} bytes present")
    if h.chunk_type != CHUNK_TYPE_USER:
        return h, None, 0, 0
    data = buf[ds:de] if isinstance(buf, bytes) else bytes(memoryview(buf)[ds:de])
    if verify_crc:
        crc = zlib.crc32(data)
        if crc != h.crc:
            raise CrcMismatch(f"chunk at offset {first}: CRC-32 of the data section is 0x{crc:08x}, "
                              f"the header says 0x{h.crc:08x}")
    lo = max(start, first)
    hi = min(end, first + h.num_records)
    return (h, data, lo, hi) if lo < hi else (h, None, 0, 0)


# --------------------------------------------------------------------------------------------
# the buffer layout (records.BufferBatch): bodies appended to flat buffers, no object per record


def _buffers_tail(out_data: bytearray, out_offsets: bytearray) -> int:
    """Length of ``out_data`` after checking ``out_offsets`` ends there (twin of the C check)."""
    if type(out_data) is not bytearray or type(out_offsets) is not bytearray:
        raise TypeError("the body buffers must be two bytearrays")
    olen = len(out_offsets)
    if olen < 4 or olen % 4:
        raise ValueError("the body offsets buffer must hold whole int32s, starting with 0")
    last = int.from_bytes(out_offsets[-4:], sys.byteorder, signed=True)
    if last != len(out_data):
        raise ValueError(
            f"the body offsets buffer ends at {last}, the data buffer holds {len(out_data)} bytes")
    return last


def _extend_buffers(bodies: list[bytes], out_data: bytearray, out_offsets: bytearray, have: int) -> None:
    more = sum(map(len, bodies))
    if more > MAX_BUFFER_BYTES - have:
        raise ValueError(f"{more} more body bytes would take the batch past 2147483647 bytes (int32 offsets)")
    ends = array("i", [0] * len(bodies))
    pos = have
    for k, b in enumerate(bodies):
        pos += len(b)
        ends[k] = pos
    out_data += b"".join(bodies)
    out_offsets += ends.tobytes()


def _append_bodies_py(data: bytes, n_entries: int, n_records: int, klo: int, khi: int, amqp: bool,
                      out_data: bytearray, out_offsets: bytearray) -> bool:
    """Pure-Python twin of ``_accel.append_bodies``: append the bodies of records ``klo..khi-1`` of a
    simple-entries data section (lone data sections' bodies with ``amqp``); ``False``, appending
    nothing, at a sub-batch entry or (``amqp``) a record in range of another shape."""
    have = _buffers_tail(out_data, out_offsets)
    records = _split_entries_py(data, False)
    if records is None:
        return False
    count = len(records)
    if count != n_records or count != n_entries:
        raise ValueError(f"data section holds {count} simple entries, the header says {n_entries} entries "
                         f"and {n_records} records")
    if klo < 0 or klo > khi or khi > count:
        raise ValueError(f"record range {klo}..{khi} is outside the chunk's {count} records")
    wanted = records[klo:khi]
    if amqp:
        found, misses = _data_bodies_py(wanted)
        if misses:
            return False
        wanted = found  # type: ignore[assignment]
    _extend_buffers(wanted, out_data, out_offsets, have)
    return True


def _append_list_py(bodies: list[bytes], out_data: bytearray, out_offsets: bytearray) -> None:
    """Pure-Python twin of ``_accel.append_list``: ``bodies`` appended in the buffer layout."""
    have = _buffers_tail(out_data, out_offsets)
    if type(bodies) is not list or any(type(b) is not bytes for b in bodies):
        raise TypeError("append_list expects a list of bytes")
    _extend_buffers(bodies, out_data, out_offsets, have)


_append_bodies: Callable[[bytes, int, int, int, int, bool, bytearray, bytearray], bool] = (
    _append_bodies_py if ACCEL is None else ACCEL.append_bodies)
_append_list: Callable[[list[bytes], bytearray, bytearray], None] = (
    _append_list_py if ACCEL is None else ACCEL.append_list)


def decode_chunk_buffers(
    buf: bytes | bytearray | memoryview,
    pos: int,
    *,
    start: int,
    end: int,
    decode: Literal["amqp", "raw"],
    verify_crc: bool,
    maps: bool,
    out: BufferBatch,
) -> ChunkHeader:
    """:func:`decode_chunk` for the buffer layout: append to ``out`` the user records of the chunk
    at ``buf[pos:]`` with ``start <= offset < end``.

    A chunk of simple entries whose records in range are all lone data sections (or ``raw``) is cut
    in one C pass straight into ``out``'s buffers; any other chunk goes through the list decoder and
    its bodies are appended after. ``maps=False`` drops the map columns (they stay ``None``).
    Corrupt input raises what :func:`decode_chunk` raises, naming the chunk's first offset.
    """
    if decode not in ("amqp", "raw"):
        raise ValueError(f"decode must be 'amqp' or 'raw', not {decode!r}")
    h, data, lo, hi = _user_span(buf, pos, start, end, verify_crc)
    if data is None:
        return h
    first = h.first_offset
    klo = lo - first
    khi = hi - first
    amqp = decode == "amqp"
    try:
        done = _append_bodies(data, h.num_entries, h.num_records, klo, khi, amqp, out.body_data,
                              out.body_offsets)
    except ValueError as exc:
        raise _bad(first, str(exc)) from None
    if not done:
        recs = _records(data, h, klo, khi)
        if amqp:
            bodies, props, apps, mas = decode_columns(recs)
        else:
            bodies = recs
        if len(bodies) != khi - klo:
            raise _bad(first, f"expected {khi - klo} records in range, found {len(bodies)}")
        try:
            _append_list(bodies, out.body_data, out.body_offsets)
        except ValueError as exc:
            raise _bad(first, str(exc)) from None
        if amqp and maps:
            out.add_maps(props, apps, mas)
    out.add_run(lo, khi - klo, h.timestamp)
    return h


def _fused_bodies(data: bytes, h: ChunkHeader, klo: int, khi: int) -> tuple[list[bytes], list[int]] | None:
    """Bodies (and the indexes still to decode) of records ``klo..khi-1`` of a simple-entries chunk."""
    try:
        fused = _split_bodies(data)
    except ValueError as exc:
        raise _bad(h.first_offset, str(exc)) from None
    if fused is None:
        return None
    items, misses = fused
    n = len(items)
    if n != h.num_records or n != h.num_entries:
        raise _bad(h.first_offset, f"data section holds {n} simple entries, the header says "
                                   f"{h.num_entries} entries and {h.num_records} records")
    if klo or khi != n:
        items = items[klo:khi]
        misses = [i - klo for i in misses if klo <= i < khi]
    return items, misses


def _amqp_uniform(data: bytes, h: ChunkHeader, klo: int, khi: int) -> list[bytes] | None:
    """Bodies straight from the data section when every entry is ``size 00 53 75 a0 len body`` alike."""
    n = h.num_entries
    dl = len(data)
    if n != h.num_records or not n or dl < 9 or data[4:8] != _DATA8:
        return None
    s = _u32(data, 0)[0]
    stride = s + 4
    if stride * n != dl or data[8] + 5 != s or not _uniform(data, stride, n, 9):
        return None
    b = s - 5
    return [data[p : p + b] for p in range(9 + klo * stride, 9 + khi * stride, stride)]


# --------------------------------------------------------------------------------------------
# building chunks (what the server would send; for tests, benchmarks and publishing)


@dataclass(frozen=True, slots=True)
class SubBatch:
    """A sub-batch entry: several records, compressed together with ``codec`` (0 = none)."""

    records: Sequence[bytes]
    codec: int = CODEC_NONE


@dataclass(frozen=True, slots=True)
class EncodedEntry:
    """An entry already in wire form (e.g. built by another client) holding ``records`` records."""

    data: bytes
    records: int


def encode_entry(entry: bytes | SubBatch | EncodedEntry) -> bytes:
    """One entry of a chunk data section (also the entry format of a Publish frame)."""
    if isinstance(entry, EncodedEntry):
        return entry.data
    if isinstance(entry, SubBatch):
        plain = b"".join(len(r).to_bytes(4, "big") + bytes(r) for r in entry.records)
        packed = compress(entry.codec, plain)
        if len(entry.records) > 0xFFFF:
            raise ValueError("a sub-batch holds at most 65535 records")
        head = _SUB_HEADER.pack(0x80 | (entry.codec << 4), len(entry.records), len(plain), len(packed))
        return head + packed
    if len(entry) >= 0x80000000:
        raise ValueError("a simple entry holds at most 2**31-1 bytes")
    return len(entry).to_bytes(4, "big") + bytes(entry)


def build_chunk(
    entries: Iterable[bytes | SubBatch | EncodedEntry],
    *,
    first_offset: int = 0,
    timestamp: int = 0,
    epoch: int = 1,
    chunk_type: int = CHUNK_TYPE_USER,
    trailer: bytes = b"",
    trailer_length: int | None = None,
    bloom_size: int = 0,
) -> bytes:
    """A chunk as a Deliver frame carries it: header + data (+ ``trailer`` bytes if given).

    ``trailer_length`` overrides the header's TrailerLength (the server keeps it even when it
    does not send the trailer); ``bloom_size`` is only written to the header, like the server does.
    """
    n_entries = 0
    n_records = 0
    parts: list[bytes] = []
    for e in entries:
        parts.append(encode_entry(e))
        n_entries += 1
        if isinstance(e, SubBatch):
            n_records += len(e.records)
        elif isinstance(e, EncodedEntry):
            n_records += e.records
        else:
            n_records += 1
    data = b"".join(parts)
    header = _HEADER.pack(
        CHUNK_MAGIC_VERSION, chunk_type, n_entries, n_records, timestamp, epoch, first_offset,
        zlib.crc32(data), len(data), len(trailer) if trailer_length is None else trailer_length, bloom_size,
    )
    return header + data + trailer
