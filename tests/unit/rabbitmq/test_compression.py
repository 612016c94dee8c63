"""Sub-batch codecs: round trips, the exact stream formats the spec names, bounds and missing libraries."""

from __future__ import annotations

import gzip
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamledger.protocol.rabbitmq import compression
from streamledger.protocol.rabbitmq.compression import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    codec_available,
    compress,
    decompress,
)
from streamledger.protocol.rabbitmq.errors import ChunkFormatError, CodecUnavailable, StreamError

ALL = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD]
MAGIC = {
    CODEC_GZIP: b"\x1f\x8b",
    CODEC_SNAPPY: b"\xff\x06\x00\x00sNaPpY",
    CODEC_LZ4: b"\x04\x22\x4d\x18",
    CODEC_ZSTD: b"\x28\xb5\x2f\xfd",
}


@pytest.mark.parametrize("codec", ALL)
def test_all_codecs_are_available_here(codec: int) -> None:
    assert codec_available(codec)


@pytest.mark.parametrize("codec", ALL)
@settings(deadline=None)
@given(data=st.binary(max_size=200_000))
def test_round_trip(codec: int, data: bytes) -> None:
    packed = compress(codec, data)
    if codec in MAGIC:
        assert packed.startswith(MAGIC[codec])
    assert decompress(codec, packed) == data
    assert decompress(codec, memoryview(packed), max_size=len(data)) == data


@pytest.mark.parametrize("codec", ALL)
def test_output_beyond_declared_size_is_refused(codec: int) -> None:
    data = b"abc" * 50_000  # highly compressible: a small input expanding a lot
    packed = compress(codec, data)
    with pytest.raises(ChunkFormatError, match="more than its declared"):
        decompress(codec, packed, max_size=len(data) - 1)


@pytest.mark.parametrize("codec", [CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD])
def test_corrupt_and_truncated_input_raise_chunk_format_error(codec: int) -> None:
    data = bytes(range(256)) * 100
    packed = compress(codec, data)
    for bad in (packed[: len(packed) // 2], packed[:3], b"\x00" * 20, packed[:-1]):
        with pytest.raises(ChunkFormatError):
            decompress(codec, bad, max_size=len(data))


def test_streams_written_by_other_libraries() -> None:
    import lz4.frame
    import snappy
    import zstandard

    data = b"record-" * 20_000
    assert decompress(CODEC_GZIP, gzip.compress(data)) == data
    assert decompress(CODEC_GZIP, gzip.compress(data[:10]) + gzip.compress(data[10:])) == data  # two members
    assert decompress(CODEC_SNAPPY, snappy.StreamCompressor().compress(data)) == data
    # Java writes independent 64 KiB blocks
    java_like = lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False)
    assert decompress(CODEC_LZ4, java_like) == data
    assert decompress(CODEC_LZ4, lz4.frame.compress(data[:5]) + lz4.frame.compress(data[5:])) == data
    # a streaming zstd writer leaves the content size out of the frame header
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert decompress(CODEC_ZSTD, no_size, max_size=len(data)) == data


def test_snappy_skippable_frames_and_reserved_frames() -> None:
    data = b"hello snappy"
    packed = compress(CODEC_SNAPPY, data)
    padded = packed[:10] + b"\xfe\x02\x00\x00\x00\x00" + packed[10:]
    assert decompress(CODEC_SNAPPY, padded) == data
    with pytest.raises(ChunkFormatError, match="reserved"):
        decompress(CODEC_SNAPPY, packed[:10] + b"\x02\x00\x00\x00")
    with pytest.raises(ChunkFormatError, match="stream identifier"):
        decompress(CODEC_SNAPPY, packed[10:])


@pytest.mark.parametrize("code", [5, 6, 7, 8])
def test_unknown_codes_are_errors(code: int) -> None:
    with pytest.raises(ChunkFormatError, match=f"compression code {code}"):
        decompress(code, b"x")
    assert not codec_available(code)


@pytest.mark.parametrize(
    ("codec", "module", "package"),
    [
        (CODEC_ZSTD, "zstandard", "zstandard"),
        (CODEC_LZ4, "lz4.frame", "lz4"),
        (CODEC_SNAPPY, "cramjam", "cramjam"),
    ],
)
def test_missing_library_names_codec_and_package(
    codec: int, module: str, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = compress(codec, b"data")
    # make the import fail as it would in an environment without the package
    monkeypatch.setattr(compression, "_modules", {})
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(CodecUnavailable) as err:
        decompress(codec, packed)
    assert f"'{package}' package" in str(err.value)
    assert compression.codec_name(codec) in str(err.value)
    assert isinstance(err.value, StreamError) and not codec_available(codec)
    # gzip and none never need anything
    assert decompress(CODEC_GZIP, compress(CODEC_GZIP, b"x")) == b"x"
