"""Sub-batch compression codecs of Osiris entries (osiris-chunk.md section 5.2).

The server stores sub-batches exactly as the publisher compressed them, so the formats are the
Java client's: gzip (RFC 1952), Snappy *framing* format, LZ4 *frame* format and Zstandard frames.
gzip ships with Python; the others import their library lazily and raise
:class:`CodecUnavailable` naming the pip package when it is missing, so a reader that never meets
such a sub-batch needs nothing extra.

Every decompressor is bounded by ``max_size`` (the sub-batch's declared uncompressed length) so
that a hostile or corrupt entry cannot make the reader allocate more than the header promised.
"""

from __future__ import annotations

import importlib
import zlib
from types import ModuleType
from typing import Any

from streamledger.protocol.rabbitmq.errors import ChunkFormatError, CodecUnavailable

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4

CODEC_NAMES: dict[int, str] = {
    CODEC_NONE: "none",
    CODEC_GZIP: "gzip",
    CODEC_SNAPPY: "snappy",
    CODEC_LZ4: "lz4",
    CODEC_ZSTD: "zstd",
}

# codec -> (module to import, pip package to name in the error)
_LIBRARIES: dict[int, tuple[str, str]] = {
    CODEC_SNAPPY: ("cramjam", "cramjam"),
    CODEC_LZ4: ("lz4.frame", "lz4"),
    CODEC_ZSTD: ("zstandard", "zstandard"),
}

_modules: dict[int, ModuleType] = {}

_SNAPPY_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"
_SNAPPY_MAX_BLOCK = 65536
_ZSTD_STEP = 4096  # input bytes per decompress call: bounds how far output can overshoot the limit


def codec_name(codec: int) -> str:
    """Human name of a compression code (``"code 5"`` for unknown ones)."""
    return CODEC_NAMES.get(codec, f"code {codec}")


def _library(codec: int) -> Any:
    mod = _modules.get(codec)
    if mod is not None:
        return mod
    module_name, package = _LIBRARIES[codec]
    try:
        mod = importlib.import_module(module_name)
    except ImportError:
        raise CodecUnavailable(
            f"sub-batch compression {codec_name(codec)} (code {codec}) needs the '{package}' package "
            f"(pip install {package}, or the streamledger[compression] extra)"
        ) from None
    _modules[codec] = mod
    return mod


def codec_available(codec: int) -> bool:
    """Whether :func:`decompress` can handle ``codec`` in this environment."""
    if codec in (CODEC_NONE, CODEC_GZIP):
        return True
    if codec not in _LIBRARIES:
        return False
    try:
        _library(codec)
    except CodecUnavailable:
        return False
    return True


def _check_codec(codec: int) -> None:
    if codec not in CODEC_NAMES:
        raise ChunkFormatError(f"unknown sub-batch compression code {codec} (0..4 are defined)")


def _too_large(codec: int, max_size: int) -> ChunkFormatError:
    return ChunkFormatError(
        f"{codec_name(codec)} sub-batch decompresses to more than its declared {max_size} bytes"
    )


def decompress(codec: int, data: bytes | memoryview, *, max_size: int | None = None) -> bytes:
    """Decompress one sub-batch payload; never produce more than ``max_size`` bytes.

    Raises :class:`ChunkFormatError` for corrupt input, an unknown code or output beyond
    ``max_size``, and :class:`CodecUnavailable` when the codec's library is not installed.
    """
    _check_codec(codec)
    if codec == CODEC_NONE:
        out = bytes(data)
        if max_size is not None and len(out) > max_size:
            raise _too_large(codec, max_size)
        return out
    limit = -1 if max_size is None else max_size
    try:
        if codec == CODEC_GZIP:
            return _gunzip(data, limit)
        if codec == CODEC_SNAPPY:
            return _unsnappy(data, limit)
        if codec == CODEC_LZ4:
            return _unlz4(data, limit)
        return _unzstd(data, limit)
    except (ChunkFormatError, CodecUnavailable):
        raise
    except Exception as exc:  # each library has its own error types; all mean "corrupt input"
        raise ChunkFormatError(f"corrupt {codec_name(codec)} sub-batch: {exc}") from None


def _gunzip(data: bytes | memoryview, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest: bytes | memoryview = data
    while True:  # a gzip stream may hold several members; Java writes one
        d = zlib.decompressobj(wbits=31)
        chunk = d.decompress(rest) if limit < 0 else d.decompress(rest, limit - total + 1)
        total += len(chunk)
        parts.append(chunk)
        if 0 <= limit < total:
            raise _too_large(CODEC_GZIP, limit)
        if not d.eof:
            raise ChunkFormatError("corrupt gzip sub-batch: stream ends before the gzip trailer")
        rest = d.unused_data
        if not rest:
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _unsnappy(data: bytes | memoryview, limit: int) -> bytes:
    """Snappy framing format, parsed here so each block's size is checked before decompressing.

    Block checksums (masked CRC-32C) are not verified: the chunk CRC already covers these bytes.
    """
    cramjam = _library(CODEC_SNAPPY)
    raw = cramjam.snappy.decompress_raw
    buf = bytes(data)
    n = len(buf)
    pos = 0
    parts: list[bytes] = []
    total = 0
    seen_id = False
    while pos < n:
        if pos + 4 > n:
            raise ChunkFormatError("corrupt snappy sub-batch: truncated frame header")
        kind = buf[pos]
        length = buf[pos + 1] | (buf[pos + 2] << 8) | (buf[pos + 3] << 16)
        body_start = pos + 4
        body_end = body_start + length
        if body_end > n:
            raise ChunkFormatError("corrupt snappy sub-batch: frame runs past the end of the data")
        if kind == 0xFF:
            if buf[pos:body_end] != _SNAPPY_STREAM_ID:
                raise ChunkFormatError("corrupt snappy sub-batch: bad stream identifier")
            seen_id = True
        elif not seen_id:
            raise ChunkFormatError("corrupt snappy sub-batch: missing stream identifier")
        elif kind in (0x00, 0x01):
            if length < 4:
                raise ChunkFormatError("corrupt snappy sub-batch: block shorter than its checksum")
            block = buf[body_start + 4 : body_end]
            if kind == 0x00:
                size = _varint_prefix(block)
                if size > _SNAPPY_MAX_BLOCK:
                    raise ChunkFormatError("corrupt snappy sub-batch: block larger than 64 KiB")
                if 0 <= limit < total + size:
                    raise _too_large(CODEC_SNAPPY, limit)
                piece = bytes(raw(block))
                if len(piece) != size:
                    raise ChunkFormatError("corrupt snappy sub-batch: block length mismatch")
            else:
                piece = block
            total += len(piece)
            if 0 <= limit < total:
                raise _too_large(CODEC_SNAPPY, limit)
            parts.append(piece)
        elif 0x02 <= kind <= 0x7F:
            raise ChunkFormatError(f"corrupt snappy sub-batch: reserved unskippable frame 0x{kind:02x}")
        # 0x80..0xfe: skippable / padding frames
        pos = body_end
    return b"".join(parts)


def _varint_prefix(block: bytes) -> int:
    value = 0
    shift = 0
    for i in range(min(len(block), 5)):
        b = block[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
        shift += 7
    raise ChunkFormatError("corrupt snappy sub-batch: bad block length")


def _unlz4(data: bytes | memoryview, limit: int) -> bytes:
    lz4frame = _library(CODEC_LZ4)
    parts: list[bytes] = []
    total = 0
    rest = bytes(data)
    while rest:  # concatenated frames are legal
        d = lz4frame.LZ4FrameDecompressor()
        chunk: bytes = d.decompress(rest, max_length=-1 if limit < 0 else limit - total + 1)
        total += len(chunk)
        parts.append(chunk)
        if 0 <= limit < total:
            raise _too_large(CODEC_LZ4, limit)
        if not d.eof:
            raise ChunkFormatError("corrupt lz4 sub-batch: frame is truncated")
        rest = d.unused_data
    return b"".join(parts)


def _unzstd(data: bytes | memoryview, limit: int) -> bytes:
    """Zstandard frames, fed in small input steps so output is checked against ``limit`` as it grows."""
    zstandard = _library(CODEC_ZSTD)
    dctx = zstandard.ZstdDecompressor()
    parts: list[bytes] = []
    total = 0
    pending = bytes(data)
    step = _ZSTD_STEP
    while pending:  # concatenated frames are legal
        d = dctx.decompressobj()
        i = 0
        while not d.eof and i < len(pending):
            chunk: bytes = d.decompress(pending[i : i + step])
            i += step
            total += len(chunk)
            parts.append(chunk)
            if 0 <= limit < total:
                raise _too_large(CODEC_ZSTD, limit)
        if not d.eof:
            raise ChunkFormatError("corrupt zstd sub-batch: frame is truncated")
        pending = d.unused_data + pending[i:]
    return b"".join(parts)


def compress(codec: int, data: bytes | memoryview) -> bytes:
    """Compress a record list the way the Java client does (for publishing and tests)."""
    _check_codec(codec)
    raw = bytes(data)
    if codec == CODEC_NONE:
        return raw
    if codec == CODEC_GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return c.compress(raw) + c.flush()
    if codec == CODEC_SNAPPY:
        framed = bytes(_library(CODEC_SNAPPY).snappy.compress(raw))
        # a framed stream always opens with the stream identifier, even when empty
        return framed if framed.startswith(_SNAPPY_STREAM_ID) else _SNAPPY_STREAM_ID + framed
    if codec == CODEC_LZ4:
        out: bytes = _library(CODEC_LZ4).compress(raw)
        return out
    zout: bytes = _library(CODEC_ZSTD).ZstdCompressor().compress(raw)
    return zout
