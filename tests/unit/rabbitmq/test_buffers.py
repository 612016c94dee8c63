"""The buffer layout (``BufferBatch``, ``decode_chunk_buffers``) against the list layout it replaces on
the hot path: same records, same bodies, same map entries, same errors; C loops against their twins."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamledger.protocol.rabbitmq.amqp import encode_message
from streamledger.protocol.rabbitmq.chunk import (
    SubBatch,
    build_chunk,
    decode_chunk,
    decode_chunk_buffers,
    encode_entry,
)
from streamledger.protocol.rabbitmq.errors import ChunkFormatError
from streamledger.protocol.rabbitmq.reader import _split_buffers
from streamledger.protocol.rabbitmq.records import BufferBatch, RecordBatch
from tests.unit.rabbitmq import load_accel

_NAMES = ("_split_entries", "_split_bodies", "_append_bodies", "_append_list", "ACCELERATED")


@pytest.fixture(autouse=True, scope="module", params=["accelerated", "pure-python"])
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs with the C loops and with their pure-Python twins."""
    from streamledger.protocol.rabbitmq import amqp, chunk

    saved = [getattr(chunk, n) for n in _NAMES], amqp._data_bodies, amqp._decode_record
    if request.param == "pure-python":
        values = [chunk._split_entries_py, chunk._split_bodies_py, chunk._append_bodies_py,
                  chunk._append_list_py, False]
        amqp._data_bodies, amqp._decode_record = amqp._data_bodies_py, amqp._no_accel
    else:
        lib = load_accel()
        values = [lib.split_entries, lib.split_bodies, lib.append_bodies, lib.append_list, True]
        amqp._data_bodies, amqp._decode_record = lib.data_bodies, lib.decode_record
    for name, value in zip(_NAMES, values, strict=True):
        setattr(chunk, name, value)
    yield request.param
    for name, value in zip(_NAMES, saved[0], strict=True):
        setattr(chunk, name, value)
    amqp._data_bodies, amqp._decode_record = saved[1], saved[2]


def lists(chunks: list[bytes], mode: str, start: int = 0, end: int = 2**64) -> RecordBatch:
    out = RecordBatch.empty("s", mode)  # type: ignore[arg-type]
    for c in chunks:
        decode_chunk(c, 0, start=start, end=end, decode=mode, verify_crc=True, out=out)  # type: ignore[arg-type]
    return out


def buffers(
    chunks: list[bytes], mode: str, start: int = 0, end: int = 2**64, maps: bool = True
) -> BufferBatch:
    out = BufferBatch.empty("s")
    for c in chunks:
        decode_chunk_buffers(c, 0, start=start, end=end, decode=mode, verify_crc=True,  # type: ignore[arg-type]
                             maps=maps, out=out)
    return out


def assert_same(ref: RecordBatch, got: BufferBatch, mode: str) -> None:
    assert len(got) == len(ref)
    assert got.offsets() == ref.offsets
    assert got.chunk_timestamps() == ref.chunk_timestamps
    assert got.bodies() == ref.bodies
    ends = memoryview(got.body_offsets).cast("i")
    assert len(ends) == len(ref) + 1 and ends[0] == 0 and ends[-1] == len(got.body_data)
    if mode == "amqp":
        as_lists = got.to_record_batch()
        assert as_lists.properties == ref.properties
        assert as_lists.application_properties == ref.application_properties
        assert as_lists.message_annotations == ref.message_annotations
        for name in ("properties", "application_properties", "message_annotations"):
            column = getattr(got, name)
            # all-null columns stay None (O(1)); a filled one is as long as the batch
            assert column is None if all(v is None for v in getattr(ref, name)) else len(column) == len(ref)


PLAIN = [encode_message(b"m%05d" % i) for i in range(500)]
VARIED = [encode_message(bytes([i % 251]) * (i * 7 % 300)) for i in range(400)] + [
    encode_message(b"v" * 70_000)]  # a vbin32 data section
WITH_PROPS = [
    encode_message(b"p%d" % i, properties={"message-id": i, "creation-time": 1_700_000_000_000 + i},
                   application_properties={"i": i, "s": "x" * (i % 5)}, message_annotations={"x-i": i})
    if i % 7 == 0 else encode_message(b"q%d" % i)
    for i in range(300)
]
RAW = [b"raw-%d" % i * (i % 4) for i in range(300)] + [b""]

CASES = {
    "plain": [build_chunk(PLAIN[:250], first_offset=0, timestamp=11),
              build_chunk(PLAIN[250:], first_offset=260, timestamp=12)],  # a gap of 10 offsets
    "varied": [build_chunk(VARIED, first_offset=5, timestamp=13)],
    "sub-batches": [build_chunk([SubBatch(PLAIN[:100], 1), *PLAIN[100:120], SubBatch(PLAIN[120:200], 0),
                                 SubBatch(WITH_PROPS[:50], 4)], first_offset=1000, timestamp=14)],
    "properties": [build_chunk(WITH_PROPS, first_offset=7, timestamp=15)],
    "raw-records": [build_chunk(RAW, first_offset=3, timestamp=16)],
    "mixed": [build_chunk(PLAIN[:40], first_offset=0), build_chunk(WITH_PROPS[:40], first_offset=40),
              build_chunk([b"tracking"], first_offset=80, chunk_type=1),
              build_chunk(PLAIN[:40], first_offset=81)],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", ["amqp", "raw"])
@pytest.mark.parametrize(("start", "end"), [(0, 2**64), (20, 120), (1010, 1150), (100, 100)])
def test_buffers_equal_lists(case: str, mode: str, start: int, end: int) -> None:
    chunks = CASES[case]
    assert_same(lists(chunks, mode, start, end), buffers(chunks, mode, start, end), mode)


def test_maps_false_skips_the_map_columns() -> None:
    got = buffers(CASES["properties"], "amqp", maps=False)
    assert got.properties is got.application_properties is got.message_annotations is None
    assert got.bodies() == lists(CASES["properties"], "amqp").bodies


def test_lone_data_chunks_leave_map_columns_none_then_pad() -> None:
    plain = buffers(CASES["plain"], "amqp")
    assert plain.properties is plain.application_properties is plain.message_annotations is None
    mixed = buffers(CASES["mixed"], "amqp")
    assert mixed.properties is not None and mixed.properties[:40] == [None] * 40
    assert len(mixed.properties) == len(mixed) == 120


def _sample() -> bytes:
    return build_chunk([encode_message(b"a" * 20), b"raw", SubBatch([b"x", b"yy", b"zzz"], codec=1),
                        SubBatch([b"p", b"q"], codec=0), b""], first_offset=500, timestamp=1)


def _outcome(fn: Any) -> tuple[str, str]:
    try:
        fn()
    except ChunkFormatError as exc:
        return (type(exc).__name__, str(exc))
    return ("ok", "")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["amqp", "raw"])
def test_corrupt_chunks_raise_the_same_errors(mode: str) -> None:
    chunks = [_sample(), CASES["plain"][0], CASES["properties"][0]]
    for good in chunks:
        for cut in range(0, len(good), 7):
            bad = good[:cut]
            a = _outcome(lambda bad=bad: lists([bad], mode))  # type: ignore[misc]
            b = _outcome(lambda bad=bad: buffers([bad], mode))  # type: ignore[misc]
            assert a == b and a[0] != "ok", cut
        for at in (4, 2):  # record count, entry count
            width = 4 if at == 4 else 2
            wrong = bytearray(good)
            wrong[at : at + width] = (int.from_bytes(good[at : at + width], "big") + 1).to_bytes(width, "big")
            a = _outcome(lambda wrong=wrong: lists([bytes(wrong)], mode))  # type: ignore[misc]
            assert a == _outcome(lambda wrong=wrong: buffers([bytes(wrong)], mode))  # type: ignore[misc]
            assert "chunk at offset" in a[1]


@settings(deadline=None, max_examples=200)
@given(st.data())
def test_random_corruption_same_outcome(data: st.DataObject) -> None:
    good = bytearray(_sample() if data.draw(st.booleans()) else CASES["properties"][0])
    for _ in range(data.draw(st.integers(1, 3))):
        good[data.draw(st.integers(0, len(good) - 1))] = data.draw(st.integers(0, 255))
    mode = data.draw(st.sampled_from(["amqp", "raw"]))
    verify = data.draw(st.booleans())

    def run_lists() -> RecordBatch:
        out = RecordBatch.empty("s", mode)  # type: ignore[arg-type]
        decode_chunk(bytes(good), 0, start=0, end=2**64, decode=mode,  # type: ignore[arg-type]
                     verify_crc=verify, out=out)
        return out

    def run_buffers() -> BufferBatch:
        out = BufferBatch.empty("s")
        decode_chunk_buffers(bytes(good), 0, start=0, end=2**64, decode=mode,  # type: ignore[arg-type]
                             verify_crc=verify, maps=True, out=out)
        return out

    a, b = _outcome(run_lists), _outcome(run_buffers)
    assert a == b
    if a[0] == "ok":
        assert_same(run_lists(), run_buffers(), mode)


_records = st.lists(
    st.one_of(st.binary(max_size=30), st.binary(max_size=300).map(encode_message),
              st.binary(max_size=12).map(lambda b: b"\x00\x53\x75\xb0" + len(b).to_bytes(4, "big") + b)),
    max_size=12,
)


@settings(deadline=None, max_examples=300)
@given(records=_records, cut=st.integers(0, 6), flag=st.booleans(), amqp=st.booleans(), data=st.data())
def test_append_bodies_c_and_python_agree(records: list[bytes], cut: int, flag: bool, amqp: bool,
                                          data: st.DataObject) -> None:
    from streamledger.protocol.rabbitmq.chunk import _append_bodies_py

    accel = load_accel()
    section = b"".join(encode_entry(r) for r in records) + (encode_entry(SubBatch([b"x"])) if flag else b"")
    n = len(records) + flag
    klo = data.draw(st.integers(0, n))
    khi = data.draw(st.integers(klo, n))
    prefix = data.draw(st.binary(max_size=5))
    for candidate in (section, section[: max(len(section) - cut, 0)]):
        outcomes = []
        for fn in (accel.append_bodies, _append_bodies_py):
            out_data, out_offsets = bytearray(prefix), bytearray(array("i", [0, len(prefix)]).tobytes())
            try:
                result: object = fn(candidate, n, n, klo, khi, amqp, out_data, out_offsets)
            except ValueError as exc:
                result = ("error", str(exc))
            outcomes.append((result, bytes(out_data), bytes(out_offsets)))
        assert outcomes[0] == outcomes[1]


def test_append_functions_refuse_inconsistent_buffers() -> None:
    from streamledger.protocol.rabbitmq.chunk import _append_bodies_py, _append_list_py

    accel = load_accel()
    section = encode_entry(b"abc")
    for append_bodies, append_list in ((accel.append_bodies, accel.append_list),
                                       (_append_bodies_py, _append_list_py)):
        with pytest.raises(ValueError, match="ends at 0, the data buffer holds 2 bytes"):
            append_bodies(section, 1, 1, 0, 1, False, bytearray(b"xy"), bytearray(4))
        with pytest.raises(ValueError, match="whole int32s"):
            append_list([b"a"], bytearray(), bytearray(3))
        with pytest.raises(TypeError):
            append_list([b"a"], b"", bytearray(4))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            append_list(["a"], bytearray(), bytearray(4))  # type: ignore[list-item]
        out_data, out_offsets = bytearray(b"q"), bytearray(array("i", [0, 1]).tobytes())
        append_list([b"", b"de"], out_data, out_offsets)
        assert out_data == b"qde" and list(array("i", bytes(out_offsets))) == [0, 1, 1, 3]


def test_body_limit_is_checked_before_copying() -> None:
    """More than 2**31-1 body bytes cannot be addressed by int32 offsets: refused before copying."""
    from streamledger.protocol.rabbitmq import chunk

    out_data, out_offsets = bytearray(), bytearray(4)
    with pytest.raises(ValueError, match="past 2147483647 bytes"):
        chunk._extend_buffers([b"abcd"], out_data, out_offsets, 2**31 - 3)
    assert out_data == b"" and out_offsets == bytearray(4)


def test_split_buffers_cuts_runs_bodies_and_maps() -> None:
    whole = buffers(CASES["mixed"], "amqp")
    pieces = list(_split_buffers(whole, 25))
    assert [len(p) for p in pieces] == [25, 25, 25, 25, 20]
    assert [o for p in pieces for o in p.offsets()] == whole.offsets()
    assert [b for p in pieces for b in p.bodies()] == whole.bodies()
    assert [t for p in pieces for t in p.chunk_timestamps()] == whole.chunk_timestamps()
    joined = [m for p in pieces for m in p.to_record_batch().properties or []]
    assert joined == whole.to_record_batch().properties
    assert pieces[0].properties is None  # its 25 records are lone data sections


@pytest.mark.parametrize("mode", ["amqp"])
def test_a_data_section_holding_a_decimal_is_no_message_in_either_layout(mode: str) -> None:
    """A data section must hold binary (vbin8/vbin32). One byte turned a section's ``a0`` into ``74``
    (decimal32, whose value type subclasses bytes): the walker took it for a body, the list layout
    kept a Decimal32 and the buffer layout raised TypeError (found by the random-corruption test in
    CI-like runs, pure Python). Now the record is not AMQP: its bytes pass through raw, alike."""
    record = b"\x00\x53\x75\x74\x03q10"
    chunk = build_chunk([encode_message(b"ok"), record], first_offset=0, timestamp=1)
    a, b = lists([chunk], mode), buffers([chunk], mode)
    assert a.bodies == [b"ok", record] and all(type(x) is bytes for x in a.bodies)
    assert_same(a, b, mode)
