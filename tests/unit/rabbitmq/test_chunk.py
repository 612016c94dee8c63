"""Osiris chunk decoding: the spec's worked example, range filtering, sub-batches, corrupt input."""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamledger.protocol.rabbitmq.amqp import encode_message
from streamledger.protocol.rabbitmq.chunk import (
    CHUNK_HEADER_SIZE,
    CHUNK_TYPE_USER,
    ChunkHeader,
    EncodedEntry,
    SubBatch,
    build_chunk,
    decode_chunk,
    encode_entry,
    parse_chunk_header,
)
from streamledger.protocol.rabbitmq.errors import (
    ChunkFormatError,
    CodecUnavailable,
    CrcMismatch,
    ProtocolError,
)
from streamledger.protocol.rabbitmq.records import RecordBatch
from tests.unit.rabbitmq import load_accel


@pytest.fixture(autouse=True, scope="module", params=["accelerated", "pure-python"])
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run every test of this module with the C loops and with their pure-Python twins."""
    from streamledger.protocol.rabbitmq import amqp, chunk

    names = ("_split_entries", "_split_bodies", "ACCELERATED")
    saved = [getattr(chunk, n) for n in names], amqp._data_bodies, amqp._decode_record
    if request.param == "pure-python":
        values = [chunk._split_entries_py, chunk._split_bodies_py, False]
        amqp._data_bodies, amqp._decode_record = amqp._data_bodies_py, amqp._no_accel
    else:
        lib = load_accel()
        values = [lib.split_entries, lib.split_bodies, True]
        amqp._data_bodies, amqp._decode_record = lib.data_bodies, lib.decode_record
    for name, value in zip(names, values, strict=True):
        setattr(chunk, name, value)
    yield request.param
    for name, value in zip(names, saved[0], strict=True):
        setattr(chunk, name, value)
    amqp._data_bodies, amqp._decode_record = saved[1], saved[2]


def h(text: str) -> bytes:
    return bytes.fromhex(" ".join(line.split("  ")[0] for line in text.strip().splitlines()))


# osiris-chunk.md section 7, byte for byte
SPEC_CHUNK = h("""
50 00 00 02 00 00 00 03 00 00 01 8b cf e5 68 00
00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 64
85 35 2b f8 00 00 00 24 00 00 00 00 00 00 00 00
00 00 00 0a 00 53 75 a0 05 68 65 6c 6c 6f 80 00
02 00 00 00 0b 00 00 00 0b 00 00 00 01 78 00 00
00 02 79 7a
""")


def decode(buf: bytes | memoryview, pos: int = 0, *, start: int = 0, end: int = 2**64, mode: str = "amqp",
           verify_crc: bool = True, out: RecordBatch | None = None) -> tuple[ChunkHeader, RecordBatch]:
    batch = out if out is not None else RecordBatch.empty("s", mode)  # type: ignore[arg-type]
    header = decode_chunk(buf, pos, start=start, end=end, decode=mode,  # type: ignore[arg-type]
                          verify_crc=verify_crc, out=batch)
    return header, batch


def test_spec_worked_example_builds_byte_exact() -> None:
    assert len(SPEC_CHUNK) == 84
    built = build_chunk([b"\x00\x53\x75\xa0\x05hello", SubBatch([b"x", b"yz"])],
                        first_offset=100, timestamp=1_700_000_000_000, epoch=1)
    assert built == SPEC_CHUNK
    assert zlib.crc32(SPEC_CHUNK[48:]) == 0x85352BF8


def test_spec_worked_example_header() -> None:
    assert parse_chunk_header(SPEC_CHUNK) == ChunkHeader(
        chunk_type=0, num_entries=2, num_records=3, timestamp=1_700_000_000_000, epoch=1, first_offset=100,
        crc=0x85352BF8, data_length=36, trailer_length=0, bloom_size=0)
    assert parse_chunk_header(SPEC_CHUNK).next_offset == 103


def test_spec_worked_example_decodes() -> None:
    header, batch = decode(SPEC_CHUNK)
    assert header.first_offset == 100
    assert batch.offsets == [100, 101, 102]
    assert batch.bodies == [b"hello", b"x", b"yz"]
    assert batch.chunk_timestamps == [1_700_000_000_000] * 3
    assert batch.properties == [None] * 3 and len(batch) == 3
    _, raw = decode(SPEC_CHUNK, mode="raw")
    assert raw.bodies == [b"\x00\x53\x75\xa0\x05hello", b"x", b"yz"]
    assert raw.properties is None and raw.application_properties is None and raw.message_annotations is None


def test_spec_example_inside_a_deliver_v1_frame() -> None:
    frame = h("00 00 00 59 00 08 00 01 00") + SPEC_CHUNK
    assert len(frame) == 93
    _, batch = decode(memoryview(frame), 9, start=101, end=103)
    assert (batch.offsets, batch.bodies) == ([101, 102], [b"x", b"yz"])


def test_spec_example_inside_a_deliver_v2_frame() -> None:
    frame = h("00 00 00 61 00 08 00 02 00 00 00 00 00 00 00 00 64") + SPEC_CHUNK
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    _, batch = decode(frame, 17)
    assert batch.offsets == [100, 101, 102]


@pytest.mark.parametrize(("start", "end", "expected"), [
    (0, 100, []), (100, 101, [100]), (101, 102, [101]), (102, 200, [102]), (103, 200, []),
    (0, 2**64, [100, 101, 102]), (101, 101, []),
])
def test_range_filter_on_spec_chunk(start: int, end: int, expected: list[int]) -> None:
    _, batch = decode(SPEC_CHUNK, start=start, end=end)
    assert batch.offsets == expected
    assert batch.bodies == [{100: b"hello", 101: b"x", 102: b"yz"}[o] for o in expected]


def test_header_seen_on_rabbitmq_4_3() -> None:
    hdr = h("""
50 00 00 01 00 00 00 05 00 00 01 a2 00 8d 05 b6 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00
21 0f e5 01 00 00 00 38 00 00 00 00 00 00 00 00
""")
    got = parse_chunk_header(hdr)
    assert (got.chunk_type, got.num_entries, got.num_records, got.epoch, got.first_offset) == (0, 1, 5, 1, 0)
    assert (got.crc, got.data_length, got.bloom_size) == (0x210FE501, 0x38, 0)


def test_tracking_chunk_appends_nothing() -> None:
    data = h("00 00 00 0e 01 04 72 65 66 42 00 00 00 00 00 00 00 04")
    chunk = build_chunk([data[4:]], first_offset=5, chunk_type=1)
    assert chunk[48:] == data
    header, batch = decode(chunk)
    assert header.chunk_type == 1 and len(batch) == 0 and batch.properties == []


def test_trailer_and_bloom_are_handled_as_the_server_sends_them() -> None:
    trailer = b"\x01\x04refA" + (3).to_bytes(8, "big")
    # chunk_selector=all: trailer bytes follow the data; bloom size set but bytes absent
    with_trailer = build_chunk([b"a", b"b"], first_offset=7, trailer=trailer, bloom_size=16)
    assert decode(with_trailer)[1].bodies == [b"a", b"b"]
    # default selector: header says 14 trailer bytes, none are sent
    without = build_chunk([b"a", b"b"], first_offset=7, trailer_length=14)
    hdr, batch = decode(without)
    assert hdr.trailer_length == 14 and batch.offsets == [7, 8]


def test_batches_accumulate_across_chunks() -> None:
    out = RecordBatch.empty("s", "raw")
    decode(build_chunk([b"a", b"b"], first_offset=0), out=out, mode="raw")
    decode(build_chunk([b"c"], first_offset=3), out=out, mode="raw")  # offset 2 is a gap
    assert out.offsets == [0, 1, 3] and out.bodies == [b"a", b"b", b"c"]


def test_amqp_records_with_sections_and_raw_records_in_one_chunk() -> None:
    msg = encode_message(b"m", properties={"subject": "s"}, application_properties={"k": 1},
                         message_annotations={"x-a": "b"})
    chunk = build_chunk([msg, b"raw", SubBatch([encode_message(b"z"), msg], codec=1)], first_offset=10)
    _, batch = decode(chunk)
    assert batch.bodies == [b"m", b"raw", b"z", b"m"]
    assert batch.properties == [{"subject": "s"}, None, None, {"subject": "s"}]
    assert batch.application_properties == [{"k": 1}, None, None, {"k": 1}]
    assert batch.message_annotations == [{"x-a": "b"}, None, None, {"x-a": "b"}]


def test_uniform_fast_path_matches_general_path() -> None:
    bodies = [bytes([i]) * 100 for i in range(50)]
    uniform = build_chunk([encode_message(b) for b in bodies], first_offset=1000)
    _, batch = decode(uniform, start=1010, end=1040)
    assert batch.bodies == bodies[10:40] and batch.offsets == list(range(1010, 1040))
    # one record of another size defeats the fast path; results must be the same shape
    mixed = build_chunk([encode_message(b) for b in bodies[:-1]] + [encode_message(b"x" * 99)])
    _, batch = decode(mixed, start=10, end=40)
    assert batch.bodies == bodies[10:40]
    # same sizes, different prefixes (raw records that look alike in size only)
    alike = [b"\x00\x53\x75\xa0\x05hello", b"\x00\x53\x75\xa1\x05hello"]
    _, batch = decode(build_chunk(alike))
    assert batch.bodies == [b"hello", alike[1]]


def test_oversized_sub_batch_claim_is_refused_before_decompressing() -> None:
    payload = zlib.compress(b"\x00" * 1000)  # tiny input, a 300 MiB claim: refused up front
    head = bytes([0x90]) + (1).to_bytes(2, "big") + (300 * 1024 * 1024).to_bytes(4, "big")
    chunk = build_chunk([EncodedEntry(head + len(payload).to_bytes(4, "big") + payload, 1)], first_offset=3)
    with pytest.raises(ChunkFormatError, match="more than the 268435456 this reader accepts"):
        decode(chunk)


def test_codec_unavailable_names_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from streamledger.protocol.rabbitmq import compression

    chunk = build_chunk([SubBatch([b"a"], codec=4)], first_offset=77)
    monkeypatch.setattr(compression, "_modules", {})
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(CodecUnavailable, match=r"offset 77.*zstd.*'zstandard' package"):
        decode(chunk)


# ---------------------------------------------------------------- property test: build -> decode

_record = st.binary(max_size=40)
_entry = st.one_of(
    _record,
    st.builds(SubBatch, st.lists(_record, min_size=1, max_size=8), st.sampled_from([0, 1, 2, 3, 4])),
)


@settings(deadline=None, max_examples=150)
@given(
    entries=st.lists(_entry, max_size=12),
    first=st.integers(0, 2**40),
    bounds=st.tuples(st.integers(-3, 40), st.integers(-3, 40)),
    mode=st.sampled_from(["amqp", "raw"]),
    as_view=st.booleans(),
)
def test_build_then_decode_gives_exactly_the_range(
    entries: list[bytes | SubBatch], first: int, bounds: tuple[int, int], mode: str, as_view: bool
) -> None:
    records: list[bytes] = []
    for e in entries:
        records.extend(e.records if isinstance(e, SubBatch) else [e])
    chunk = b"junk" + build_chunk(entries, first_offset=first, timestamp=123)
    start, end = first + bounds[0], first + bounds[1]
    header, batch = decode(memoryview(chunk) if as_view else chunk, 4, start=max(start, 0), end=max(end, 0),
                           mode=mode)
    assert header.num_records == len(records) and header.chunk_type == CHUNK_TYPE_USER
    expected = [o for o in range(first, first + len(records)) if start <= o < end]
    assert batch.offsets == expected
    assert batch.chunk_timestamps == [123] * len(expected)
    if mode == "raw":
        assert batch.bodies == [records[o - first] for o in expected]
    else:  # random bytes are (almost always) not AMQP: they pass through untouched
        assert len(batch.bodies) == len(expected)
        assert all(b == records[o - first] or records[o - first].startswith(b"\x00")
                   for o, b in zip(expected, batch.bodies, strict=True))
        assert len(batch.properties or []) == len(expected)


_messages = st.tuples(
    st.binary(max_size=300),
    st.dictionaries(st.text(max_size=6), st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=8)),
                    max_size=3),
)


@settings(deadline=None, max_examples=100)
@given(groups=st.lists(st.tuples(st.lists(_messages, min_size=1, max_size=6),
                                 st.sampled_from([-1, 0, 1, 2, 3, 4])),  # -1: simple entries
                       min_size=1, max_size=5),
       bounds=st.tuples(st.integers(0, 30), st.integers(0, 30)))
def test_amqp_messages_in_any_entry_kind_decode_to_their_columns(
    groups: list[tuple[list[tuple[bytes, dict[str, Any]]], int]], bounds: tuple[int, int]
) -> None:
    entries: list[bytes | SubBatch] = []
    expected: list[tuple[bytes, dict[str, Any] | None]] = []
    for messages, codec in groups:
        encoded = [encode_message(body, application_properties=app) for body, app in messages]
        expected.extend((body, app or None) for body, app in messages)
        entries.extend(encoded if codec < 0 else [SubBatch(encoded, codec)])
    _, batch = decode(build_chunk(entries, first_offset=1000), start=1000 + bounds[0], end=1000 + bounds[1])
    want = expected[bounds[0] : max(bounds[0], bounds[1])]
    assert batch.bodies == [b for b, _ in want]
    assert batch.application_properties == [a for _, a in want]
    assert batch.properties == [None] * len(want) and batch.message_annotations == [None] * len(want)


# ---------------------------------------------------------------- corrupt and truncated chunks


def _sample_chunk() -> bytes:
    return build_chunk(
        [encode_message(b"a" * 20), b"raw", SubBatch([b"x", b"yy", b"zzz"], codec=1),
         SubBatch([b"p", b"q"], codec=0), SubBatch([b"s" * 300], codec=4), b""],
        first_offset=500, timestamp=1,
    )


def test_crc_mismatch_names_offset() -> None:
    chunk = bytearray(_sample_chunk())
    chunk[60] ^= 0x01
    with pytest.raises(CrcMismatch, match="chunk at offset 500: CRC-32") as err:
        decode(bytes(chunk))
    assert isinstance(err.value, ChunkFormatError) and isinstance(err.value, ProtocolError)


def test_bad_magic() -> None:
    chunk = b"\x51" + SPEC_CHUNK[1:]
    with pytest.raises(ChunkFormatError, match=r"offset 100: magic/version byte is 0x51"):
        decode(chunk)


@pytest.mark.timeout(20)
def test_every_truncation_raises_chunk_format_error() -> None:
    chunk = _sample_chunk()
    for cut in range(len(chunk)):
        with pytest.raises(ChunkFormatError):
            decode(chunk[:cut])


@pytest.mark.timeout(20)
def test_inconsistent_counts_and_lengths() -> None:
    good = _sample_chunk()
    hdr = parse_chunk_header(good)
    cases = {
        "more records": (4, hdr.num_records + 1),
        "fewer records": (4, hdr.num_records - 1),
        "more entries": (2, hdr.num_entries + 1),
    }
    for _name, (at, value) in cases.items():
        bad = bytearray(good)
        width = 4 if at == 4 else 2
        bad[at : at + width] = value.to_bytes(width, "big")
        with pytest.raises(ChunkFormatError):
            decode(bytes(bad))
    # a data length beyond the frame: refused before anything is allocated
    huge = bytearray(good)
    huge[36:40] = (0xFFFFFFF0).to_bytes(4, "big")
    with pytest.raises(ChunkFormatError, match="data section truncated"):
        decode(bytes(huge))


def _resigned(data: bytes, first: int = 9) -> bytes:
    """A chunk around hand-made data with a correct CRC, so only the structure is wrong."""
    chunk = bytearray(build_chunk([b"?"], first_offset=first))
    chunk[36:40] = len(data).to_bytes(4, "big")
    chunk[32:36] = zlib.crc32(data).to_bytes(4, "big")
    return bytes(chunk[:48]) + data


@pytest.mark.timeout(20)
@pytest.mark.parametrize("data", [
    b"\x7f\xff\xff\xff" + b"x" * 10,                        # simple entry claiming 2 GiB
    b"\x90\x00\x01\xff\xff\xff\xff\x00\x00\x00\x05abcde",   # gzip sub-batch claiming 4 GiB
    b"\x90\x00\x01\x00\x10\x00\x00\x00\x00\x00\x05abcde",   # gzip sub-batch claiming 1 MiB of 5 bytes
    b"\x80\xff\xff\x00\x00\x00\x08\x00\x00\x00\x08" + b"\x00" * 8,  # 65535 records in 8 bytes
    b"\x80\x00\x01\x00\x00\x00\x08\x00\x00\x00\x08\x00\x00\x00\x09abcd",  # record past its sub-batch
    b"\xd0\x00\x01\x00\x00\x00\x05\x00\x00\x00\x01x",       # codec 5
    b"\x80\x00\x01\x00\x00\x00\x05\x00",                     # truncated sub-batch header
])
def test_hostile_entries_fail_fast(data: bytes) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChunkFormatError, match="chunk at offset 9"):
        decode(_resigned(data))
    assert time.monotonic() - t0 < 5  # generous: only guards against pathological loops


@settings(deadline=None, max_examples=200)
@given(st.data())
def test_random_corruption_gives_typed_errors_only(data: st.DataObject) -> None:
    chunk = bytearray(_sample_chunk())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(chunk) - 1))
        chunk[i] = data.draw(st.integers(0, 255))
    verify = data.draw(st.booleans())
    try:
        _, batch = decode(bytes(chunk), verify_crc=verify, mode=data.draw(st.sampled_from(["amqp", "raw"])))
    except ChunkFormatError:
        return
    assert len(batch.offsets) == len(batch.bodies) == len(batch.chunk_timestamps)


def test_header_too_short() -> None:
    with pytest.raises(ChunkFormatError, match=f"0 of {CHUNK_HEADER_SIZE} bytes"):
        parse_chunk_header(b"")


def test_wrong_out_batch_for_mode() -> None:
    with pytest.raises(ValueError):
        decode_chunk(SPEC_CHUNK, 0, start=0, end=10**9, decode="amqp", verify_crc=True,
                     out=RecordBatch.empty("s", "raw"))
    with pytest.raises(ValueError):
        decode_chunk(SPEC_CHUNK, 0, start=0, end=10**9, decode="raw", verify_crc=True,
                     out=RecordBatch.empty("s", "amqp"))
    with pytest.raises(ValueError):
        decode_chunk(SPEC_CHUNK, 0, start=0, end=10**9, decode="json", verify_crc=True,  # type: ignore[arg-type]
                     out=RecordBatch.empty("s", "raw"))
    with pytest.raises(ValueError):
        RecordBatch.empty("s", "json")  # type: ignore[arg-type]


def test_encode_entry_matches_spec_layout() -> None:
    assert encode_entry(b"x") == b"\x00\x00\x00\x01x"
    expected = h("80 00 02 00 00 00 0b 00 00 00 0b 00 00 00 01 78 00 00 00 02 79 7a")
    assert encode_entry(SubBatch([b"x", b"yz"])) == expected
    assert encode_entry(SubBatch([b"a"], codec=1))[0] == 0x90


# ---------------------------------------------------------------- C accelerator vs its pure-Python twins


@pytest.fixture(scope="module")
def accel() -> Any:
    return load_accel()


def _outcome(fn: object, *args: object) -> object:
    try:
        return ("ok", fn(*args))  # type: ignore[operator]
    except ValueError as exc:
        return ("error", str(exc))


_entries_bytes = st.one_of(
    st.binary(max_size=64),
    st.lists(st.tuples(st.binary(max_size=20), st.booleans()), max_size=10).map(
        lambda items: b"".join(((len(r) | (0x80000000 if flag else 0)).to_bytes(4, "big") + r)
                               for r, flag in items)),
)


@settings(deadline=None, max_examples=300)
@given(data=_entries_bytes, plain=st.booleans(), cut=st.integers(0, 8))
def test_split_entries_c_and_python_agree(accel: Any, data: bytes, plain: bool, cut: int) -> None:
    from streamledger.protocol.rabbitmq.chunk import _split_entries_py

    for candidate in (data, data[: max(len(data) - cut, 0)]):
        assert _outcome(accel.split_entries, candidate, plain) == _outcome(
            _split_entries_py, candidate, plain)


@settings(deadline=None, max_examples=300)
@given(records=st.lists(st.one_of(st.binary(max_size=30), st.binary(max_size=300).map(encode_message)),
                        max_size=12),
       cut=st.integers(0, 6), flag=st.booleans())
def test_split_bodies_c_and_python_agree(accel: Any, records: list[bytes], cut: int, flag: bool) -> None:
    from streamledger.protocol.rabbitmq.chunk import _split_bodies_py

    data = b"".join(encode_entry(r) for r in records)
    if flag:
        data += encode_entry(SubBatch([b"x"]))
    for candidate in (data, data[: max(len(data) - cut, 0)]):
        assert _outcome(accel.split_bodies, candidate) == _outcome(_split_bodies_py, candidate)


_amqp_like = st.one_of(
    st.binary(max_size=20),
    st.binary(max_size=300).map(encode_message),
    st.tuples(st.binary(max_size=30), st.integers(0, 255)).map(
        lambda t: b"\x00\x53\x75\xa0" + bytes([t[1]]) + t[0]),
    st.binary(max_size=12).map(lambda b: b"\x00\x53\x75\xb0" + len(b).to_bytes(4, "big") + b),
    st.binary(max_size=12).map(lambda b: b"\x00\x53\x75\xb0" + (len(b) + 1).to_bytes(4, "big") + b),
)


@settings(deadline=None, max_examples=300)
@given(st.lists(_amqp_like, max_size=20))
def test_data_bodies_c_and_python_agree(accel: Any, records: list[bytes]) -> None:
    from streamledger.protocol.rabbitmq.amqp import _data_bodies_py

    assert accel.data_bodies(records) == _data_bodies_py(records)


def test_accelerated_and_pure_decoders_give_identical_batches(
    accel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamledger.protocol.rabbitmq import amqp, chunk

    records = [encode_message(bytes([i % 251]) * (i % 300)) for i in range(400)] + [b"raw", b""]
    records[::7] = [encode_message(b"p%d" % i, properties={"message-id": i, "creation-time": i},
                                   application_properties={"i": i, "s": "x" * (i % 5)},
                                   message_annotations={"x-i": i}) for i in range(len(records[::7]))]
    chunks = [
        build_chunk(records, first_offset=0),
        build_chunk([SubBatch(records[:200], 1), *records[200:300], SubBatch(records[300:], 0)],
                    first_offset=9),
        _sample_chunk(),
    ]

    def run() -> list[tuple[list[int], list[bytes], list[object] | None]]:
        out = []
        for c in chunks:
            for mode in ("amqp", "raw"):
                _, b = decode(c, start=20, end=380, mode=mode)
                out.append((b.offsets, b.bodies, b.properties))
        return out

    monkeypatch.setattr(chunk, "_split_entries", accel.split_entries)
    monkeypatch.setattr(chunk, "_split_bodies", accel.split_bodies)
    monkeypatch.setattr(amqp, "_data_bodies", accel.data_bodies)
    monkeypatch.setattr(amqp, "_decode_record", accel.decode_record)
    monkeypatch.setattr(chunk, "ACCELERATED", True)
    fast = run()
    monkeypatch.setattr(chunk, "_split_entries", chunk._split_entries_py)
    monkeypatch.setattr(chunk, "_split_bodies", chunk._split_bodies_py)
    monkeypatch.setattr(amqp, "_data_bodies", amqp._data_bodies_py)
    monkeypatch.setattr(amqp, "_decode_record", amqp._no_accel)
    monkeypatch.setattr(chunk, "ACCELERATED", False)  # also takes the pure-Python uniform-size paths
    assert run() == fast


# ---------------------------------------------------------------- interop: sub-entries as rstream builds them


def test_we_read_rstream_sub_entry_batches() -> None:
    """rstream's gzip/none sub-entry codecs produce the bytes its PublishSubBatching frame carries,
    which the server stores verbatim as one entry (osiris-chunk.md 5.2)."""
    from rstream import AMQPMessage
    from rstream.compression import CompressionHelper, CompressionType

    messages = [AMQPMessage(body=f"m{i}".encode()) for i in range(5)] + [b"raw-record"]
    entries = []
    for ctype in (CompressionType.Gzip, CompressionType.No):
        codec = CompressionHelper.compress(messages, ctype)
        head = bytes([0x80 | codec.compression_type() << 4])
        head += codec.messages_count().to_bytes(2, "big") + codec.uncompressed_size().to_bytes(4, "big")
        head += codec.compressed_size().to_bytes(4, "big")
        entries.append(EncodedEntry(head + codec.data(), codec.messages_count()))
    chunk = build_chunk([*entries, bytes(AMQPMessage(body=b"simple"))], first_offset=40)
    _, batch = decode(chunk, start=41, end=100)
    one_batch = [b"m0", b"m1", b"m2", b"m3", b"m4", b"raw-record"]
    assert batch.bodies == [*one_batch[1:], *one_batch, b"simple"]
    assert batch.offsets == list(range(41, 53))
    _, raw = decode(chunk, start=45, end=47, mode="raw")
    assert raw.bodies == [b"raw-record", bytes(AMQPMessage(body=b"m0"))]
