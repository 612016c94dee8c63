"""AMQP 1.0 codec: byte-exact vectors from amqp10-message.md, round trips, rstream interop, fuzzing."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamledger.protocol.rabbitmq.amqp import (
    AmqpMessage,
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float32,
    Int,
    Long,
    Short,
    Symbol,
    UByte,
    UInt,
    ULong,
    UShort,
    decode_columns,
    decode_message,
    decode_value,
    encode_message,
    encode_value,
    value_to_json_bytes,
)
from streamledger.protocol.rabbitmq.errors import AmqpDecodeError, ProtocolError

UTC = dt.UTC


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace("\n", " "))


# ---------------------------------------------------------------- spec section 6 vectors

JAVA_STYLE = h(
    "00 53 73 c0 14 07 53 01 40 40 40 40 40 a3 0a 74 65 78 74 2f 70 6c 61 69 6e"
    " 00 53 74 c1 07 02 a1 01 6b a1 01 76"
    " 00 53 75 a0 02 68 69"
)


def test_hello_data_section_both_ways() -> None:
    raw = h("00 53 75 a0 05 68 65 6c 6c 6f")
    assert encode_message(b"hello") == raw
    m = decode_message(raw)
    assert m == AmqpMessage(body=b"hello")


def test_java_style_message_is_byte_exact() -> None:
    assert len(JAVA_STYLE) == 44
    assert encode_message(
        b"hi", properties={"message-id": 1, "content-type": "text/plain"}, application_properties={"k": "v"}
    ) == JAVA_STYLE
    m = decode_message(JAVA_STYLE)
    assert m.body == b"hi"
    assert m.properties == {"message-id": 1, "content-type": "text/plain"}
    assert type(m.properties["content-type"]) is Symbol
    assert m.application_properties == {"k": "v"}
    assert m.message_annotations is None and m.header is None and m.body_type == "data"


def test_rstream_style_thirteen_property_fields() -> None:
    props = h("00 53 73 c0 1a 0d 53 01 40 40 40 40 40 a3 0a 74 65 78 74 2f 70 6c 61 69 6e 40 40 40 40 40 40")
    m = decode_message(props + h("00 53 75 a0 02 68 69"))
    assert m.properties == {"message-id": 1, "content-type": "text/plain"}


def test_amqp_value_string_body() -> None:
    m = decode_message(h("00 53 77 a1 02 68 69"))
    assert (m.body, m.body_type, m.value) == (b"hi", "value", "hi")


def test_header_durable() -> None:
    raw = h("00 53 70 c0 02 01 41")
    assert decode_message(raw + encode_message(b"")).header == {"durable": True}
    assert encode_message(b"", header={"durable": True}).startswith(raw)


def test_message_annotations_routing_key() -> None:
    raw = h("00 53 72 c1 14 02 a3 0d 78 2d 72 6f 75 74 69 6e 67 2d 6b 65 79 a1 02 72 6b")
    m = decode_message(raw + h("00 53 75 a0 00"))
    assert m.message_annotations == {"x-routing-key": "rk"}
    assert type(next(iter(m.message_annotations))) is str
    assert encode_message(b"", message_annotations={"x-routing-key": "rk"}).startswith(raw)


def test_300_byte_body_uses_vbin32() -> None:
    raw = encode_message(b"z" * 300)
    assert raw.startswith(h("00 53 75 b0 00 00 01 2c"))
    assert decode_message(raw).body == b"z" * 300
    assert decode_columns([raw])[0] == [b"z" * 300]


def test_a_vbin32_data_section_takes_the_fast_path_in_both_implementations() -> None:
    """``00 53 75 b0`` and a four-byte length: an 8-byte prefix. The lone-data-section fast path (C
    and its Python twin) must cut out such bodies itself, not leave them to the per-record decoder
    (a miss): every AMQP body over 255 bytes has this shape."""
    from streamledger.protocol.rabbitmq import amqp

    records = [encode_message(b"z" * 300), encode_message(b"hi"), encode_message(b"y" * 70_000)]
    impls = [amqp._data_bodies_py] + ([amqp.ACCEL.data_bodies] if amqp.ACCEL is not None else [])
    for impl in impls:
        assert impl(records) == ([b"z" * 300, b"hi", b"y" * 70_000], 0), impl


def test_several_data_sections_are_joined() -> None:
    raw = encode_message(b"ab") + h("00 53 75 a0 01 63")
    assert decode_message(raw).body == b"abc"


def test_symbolic_and_long_descriptors() -> None:
    sym = b"\x00\xa3\x10amqp:data:binary\xa0\x02hi"
    assert decode_message(sym).body == b"hi"
    long_desc = b"\x00\x80" + (0x75).to_bytes(8, "big") + b"\xa0\x02hi"
    assert decode_message(long_desc).body == b"hi"


def test_unknown_later_section_is_skipped() -> None:
    raw = encode_message(b"hi") + b"\x00\x53\x99\x40"
    assert decode_message(raw).body == b"hi"


def test_sequence_body_is_json() -> None:
    m = decode_message(h("00 53 76 c0 06 02 54 01 a1 01 78"))
    assert (m.body, m.body_type, m.value) == (b'[1,"x"]', "sequence", [1, "x"])


def test_value_to_json_bytes_choices() -> None:
    v = {"b": b"\x01\x02", "t": dt.datetime(2024, 1, 1, tzinfo=UTC), "u": uuid.UUID(int=1), 7: [None]}
    assert value_to_json_bytes(v) == (
        b'{"b":"0102","t":"2024-01-01T00:00:00+00:00","u":"00000000-0000-0000-0000-000000000001","7":[null]}'
    )


# ---------------------------------------------------------------- every constructor, byte-exact

PRIMITIVES: list[tuple[str, Any]] = [
    ("40", None),
    ("41", True),
    ("42", False),
    ("56 01", True),
    ("56 00", False),
    ("50 ff", 255),
    ("60 ff fe", 65534),
    ("70 ff ff ff fe", 4294967294),
    ("52 07", 7),
    ("43", 0),
    ("80 ff ff ff ff ff ff ff fe", 2**64 - 2),
    ("53 09", 9),
    ("44", 0),
    ("51 ff", -1),
    ("61 ff fe", -2),
    ("71 ff ff ff fd", -3),
    ("54 fc", -4),
    ("81 ff ff ff ff ff ff ff fb", -5),
    ("55 fa", -6),
    ("72 3f c0 00 00", 1.5),
    ("82 3f f8 00 00 00 00 00 00", 1.5),
    ("74 01 02 03 04", Decimal32(b"\x01\x02\x03\x04")),
    ("84 01 02 03 04 05 06 07 08", Decimal64(bytes(range(1, 9)))),
    ("94" + " 0a" * 16, Decimal128(b"\x0a" * 16)),
    ("73 00 01 f6 00", Char("\U0001f600")),
    ("83 00 00 01 8b cf e5 68 00", dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
    ("98" + " 11" * 16, uuid.UUID(bytes=b"\x11" * 16)),
    ("a0 02 00 ff", b"\x00\xff"),
    ("b0 00 00 00 02 00 ff", b"\x00\xff"),
    ("a1 03 e2 82 ac", "\u20ac"),
    ("b1 00 00 00 01 61", "a"),
    ("a3 03 61 62 63", Symbol("abc")),
    ("b3 00 00 00 01 61", Symbol("a")),
    ("45", []),
    ("c0 03 02 41 40", [True, None]),
    ("d0 00 00 00 06 00 00 00 02 41 40", [True, None]),
    ("c1 05 02 a1 01 6b 41", {"k": True}),
    ("d1 00 00 00 08 00 00 00 02 a1 01 6b 41", {"k": True}),
    ("e0 06 02 a1 01 61 01 62", Array(["a", "b"], 0xA1)),
    ("f0 00 00 00 07 00 00 00 02 54 01 02", Array([1, 2], 0x54)),
    ("e0 02 03 40", Array([None, None, None], 0x40)),
    ("00 53 75 a0 01 78", Described(0x75, b"x")),
    ("e0 08 02 00 a3 01 64 52 05 06", Array([Described(Symbol("d"), 5), Described(Symbol("d"), 6)], 0x52)),
]


@pytest.mark.parametrize(("hexstr", "value"), PRIMITIVES)
def test_decode_every_constructor(hexstr: str, value: Any) -> None:
    raw = h(hexstr)
    got, end = decode_value(raw)
    assert end == len(raw)
    assert got == value
    assert type(got) is type(value) or isinstance(value, int)
    assert decode_value(memoryview(b"\xee" + raw), 1) == (got, len(raw) + 1)


@pytest.mark.parametrize(
    ("value", "hexstr"),
    [
        (None, "40"), (True, "41"), (False, "42"), (0, "55 00"), (-128, "55 80"),
        (2**63, "80 80 00 00 00 00 00 00 00"), (200, "81 00 00 00 00 00 00 00 c8"),
        (UInt(0), "43"), (UInt(255), "52 ff"), (UInt(256), "70 00 00 01 00"),
        (ULong(0), "44"), (ULong(7), "53 07"), (Int(5), "54 05"), (Int(-129), "71 ff ff ff 7f"),
        (Long(5), "55 05"), (UByte(5), "50 05"), (Byte(-1), "51 ff"), (UShort(1), "60 00 01"),
        (Short(-1), "61 ff ff"), (Float32(1.5), "72 3f c0 00 00"), (1.5, "82 3f f8 00 00 00 00 00 00"),
        ("a" * 256, "b1 00 00 01 00" + " 61" * 256), ([], "45"), ({}, "c1 01 00"),
        (Symbol("s"), "a3 01 73"), (Char("a"), "73 00 00 00 61"),
    ],
)
def test_encoder_picks_the_smallest_form(value: Any, hexstr: str) -> None:
    assert encode_value(value) == h(hexstr)


def test_encoder_rejects_what_it_cannot_encode() -> None:
    with pytest.raises(TypeError):
        encode_value(object())
    with pytest.raises(ValueError):
        encode_value(UByte(256))
    with pytest.raises(ValueError):
        encode_value(2**64)
    with pytest.raises(ValueError):
        encode_value(Char("ab"))


# ---------------------------------------------------------------- property tests

_ms_datetimes = st.integers(min_value=-62135596800000, max_value=253402300799999).map(
    lambda ms: dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=ms)
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(0, 255).map(UByte),
    st.integers(0, 65535).map(UShort),
    st.integers(0, 2**32 - 1).map(UInt),
    st.integers(0, 2**64 - 1).map(ULong),
    st.integers(-128, 127).map(Byte),
    st.integers(-(2**15), 2**15 - 1).map(Short),
    st.integers(-(2**31), 2**31 - 1).map(Int),
    st.integers(-(2**63), 2**63 - 1).map(Long),
    st.floats(allow_nan=False),
    st.floats(allow_nan=False, width=32).map(Float32),
    st.binary(min_size=4, max_size=4).map(Decimal32),
    st.binary(min_size=8, max_size=8).map(Decimal64),
    st.binary(min_size=16, max_size=16).map(Decimal128),
    st.characters(codec="utf-8").map(Char),
    _ms_datetimes,
    st.uuids(),
    st.binary(max_size=300),
    st.text(max_size=300),
    st.text(alphabet=st.characters(codec="ascii"), max_size=20).map(Symbol),
)
_keys = st.one_of(st.text(max_size=10), st.text(max_size=10).filter(str.isascii).map(Symbol),
                  st.integers(-(2**63), 2**63 - 1), st.binary(max_size=5))
_arrays = st.one_of(
    st.lists(st.text(max_size=5), max_size=5).map(lambda xs: Array(xs)),
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=5).map(lambda xs: Array(xs)),
    st.lists(st.integers(0, 255).map(UByte), min_size=1, max_size=70).map(lambda xs: Array(xs)),
    st.lists(st.uuids(), min_size=1, max_size=3).map(lambda xs: Array(xs)),
    st.lists(st.booleans(), min_size=1, max_size=300).map(lambda xs: Array(xs)),
)
_values = st.recursive(
    st.one_of(_scalars, _arrays),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(_keys, inner, max_size=5),
        st.builds(Described, st.one_of(st.integers(0, 2**64 - 1).map(ULong), _keys), inner),
    ),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    """Equality that also tells string from symbol and float NaN/-0.0 apart."""
    if isinstance(a, float) and isinstance(b, float):
        return math.copysign(1, a) == math.copysign(1, b) and a == b
    if isinstance(a, str) or isinstance(b, str):
        kinds = (type(a) is Symbol, type(a) is Char) == (type(b) is Symbol, type(b) is Char)
        return a == b and kinds
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a == b and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_value_round_trip(value: Any) -> None:
    raw = encode_value(value)
    got, end = decode_value(raw)
    assert end == len(raw)
    assert _same(got, value)
    # decoding is canonical: re-encoding the decoded value decodes to the same thing again
    assert _same(decode_value(encode_value(got))[0], got)


_app_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=20),
                        st.binary(max_size=20), st.floats(allow_nan=False), _ms_datetimes, st.uuids())
_props = st.fixed_dictionaries(
    {},
    optional={
        "message-id": st.one_of(
            st.integers(0, 2**64 - 1), st.text(max_size=10), st.uuids(), st.binary(max_size=8)
        ),
        "user-id": st.binary(max_size=8),
        "to": st.text(max_size=10),
        "subject": st.text(max_size=10),
        "reply-to": st.text(max_size=10),
        "correlation-id": st.one_of(st.integers(0, 2**64 - 1), st.text(max_size=10)),
        "content-type": st.text(alphabet=st.characters(codec="ascii"), max_size=10),
        "content-encoding": st.text(alphabet=st.characters(codec="ascii"), max_size=10),
        "absolute-expiry-time": _ms_datetimes,
        "creation-time": _ms_datetimes,
        "group-id": st.text(max_size=10),
        "group-sequence": st.integers(0, 2**32 - 1),
        "reply-to-group-id": st.text(max_size=10),
    },
)


@settings(deadline=None)
@given(
    body=st.binary(max_size=600),
    props=_props,
    app=st.dictionaries(st.text(max_size=10), _app_values, max_size=6),
    ann=st.dictionaries(st.text(alphabet=st.characters(codec="ascii"), max_size=12), _app_values, max_size=4),
)
def test_message_round_trip(
    body: bytes, props: dict[str, Any], app: dict[str, Any], ann: dict[str, Any]
) -> None:
    raw = encode_message(body, properties=props, application_properties=app, message_annotations=ann)
    m = decode_message(raw)
    assert m.body == body
    assert m.properties == (props or None)
    assert m.application_properties == (app or None)
    assert m.message_annotations == (ann or None)
    bodies, p, a, ma = decode_columns([raw, raw])
    assert bodies == [body, body] and p == [props or None] * 2
    assert a == [app or None] * 2 and ma == [ann or None] * 2


# ---------------------------------------------------------------- raw pass-through and columns


def test_decode_columns_mixes_amqp_and_raw_records() -> None:
    recs = [
        encode_message(b"a"),
        b"plain raw payload",
        b"\x00\x53\x75\xa0\x09short",  # looks like a data section, wrong length: raw
        JAVA_STYLE,
        b"",
        b"\x00\x53\x75",
        encode_message(b"x" * 1000),
        b"\x00\x53\x75\xa0\x01zz",  # a valid section followed by garbage: raw
    ]
    bodies, props, apps, anns = decode_columns(recs)
    assert bodies == [b"a", recs[1], recs[2], b"hi", b"", recs[5], b"x" * 1000, recs[7]]
    assert props == [None] * 3 + [{"message-id": 1, "content-type": "text/plain"}] + [None] * 4
    assert apps[3] == {"k": "v"} and apps.count(None) == 7
    assert anns == [None] * 8


def test_decode_columns_empty() -> None:
    assert decode_columns([]) == ([], [], [], [])


def test_raw_record_is_not_a_message() -> None:
    with pytest.raises(AmqpDecodeError, match=r"not an AMQP 1\.0 message"):
        decode_message(b"hello")
    assert issubclass(AmqpDecodeError, ProtocolError)


# ---------------------------------------------------------------- corrupt and truncated input


def _complex_message() -> bytes:
    return encode_message(
        b"body" * 10,
        properties={"message-id": uuid.UUID(int=5), "creation-time": 1_700_000_000_000, "subject": "s"},
        application_properties={"a": 1, "b": "two", "c": [1, {"d": b"e"}], "arr": Array([1, 2, 3])},
        message_annotations={"x-k": Described(ULong(1), "v")},
        header={"durable": True, "priority": 9},
    )


def test_every_truncation_of_a_value_raises_typed_error() -> None:
    raw = encode_value({"a": [1, 2.5, "x" * 300, Array(["s", "t"]), {Symbol("k"): uuid.UUID(int=1)}]})
    for cut in range(len(raw)):
        with pytest.raises(AmqpDecodeError):
            decode_value(raw[:cut])


def test_truncated_messages_are_valid_prefixes_or_typed_errors() -> None:
    raw = _complex_message()
    for cut in range(len(raw)):
        try:
            decode_message(raw[:cut])
        except AmqpDecodeError:
            pass
        assert decode_columns([raw[:cut]])[0] is not None


@settings(deadline=None)
@given(st.data())
def test_mutated_messages_never_raise_untyped_errors(data: st.DataObject) -> None:
    raw = bytearray(_complex_message())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(raw))
    except AmqpDecodeError:
        pass
    bodies, *_ = decode_columns([bytes(raw)])
    assert len(bodies) == 1


@pytest.mark.timeout(10)
def test_hostile_counts_fail_fast() -> None:
    # list32 claiming 4 billion items; array32 of 4 billion nulls; a deeply nested list
    for raw in (
        h("d0 00 00 00 08 ff ff ff ff 40 40 40 40"),
        h("f0 00 00 00 05 ff ff ff ff 40"),
        h("b0 ff ff ff ff 00"),
        b"\xc0\x02\x01" * 5000 + b"\x45",
    ):
        with pytest.raises(AmqpDecodeError):
            decode_value(raw)


def test_bad_boolean_and_unknown_code() -> None:
    with pytest.raises(AmqpDecodeError, match="boolean"):
        decode_value(h("56 02"))
    with pytest.raises(AmqpDecodeError, match="0x99"):
        decode_value(h("99"))


# ---------------------------------------------------------------- interop with rstream (test-only peer)


def test_we_decode_what_rstream_encodes() -> None:
    from rstream import AMQPMessage
    from rstream._pyamqp.message import Header, Properties

    m = AMQPMessage(
        body=b"payload",
        properties=Properties(message_id=42, subject="subj", content_type="application/json",
                              creation_time=1_700_000_000_000, group_sequence=3),
        application_properties={"k": "v", "n": 5, "f": 1.5, "t": True},
        message_annotations={"x-opt": "a"},
        header=Header(durable=True, priority=3),
    )
    got = decode_message(bytes(m))
    assert got.body == b"payload"
    assert got.properties == {
        "message-id": 42, "subject": "subj", "content-type": "application/json",
        "creation-time": dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC), "group-sequence": 3,
    }
    assert got.application_properties == {"k": "v", "n": 5, "f": 1.5, "t": True}
    assert got.message_annotations == {"x-opt": "a"}
    assert got.header == {"durable": True, "priority": 3}
    assert decode_columns([bytes(AMQPMessage(body=b"hello"))])[0] == [b"hello"]
    assert decode_message(bytes(AMQPMessage(value={"a": [1, 2]}))).value == {"a": [1, 2]}


def test_rstream_decodes_what_we_encode() -> None:
    from rstream import amqp_decoder

    raw = encode_message(b"body", properties={"message-id": 7, "content-type": "text/plain"},
                         application_properties={"k": "v", "n": 3}, message_annotations={"x-a": "b"})
    m = amqp_decoder(raw)
    # rstream's decoder hands strings and symbols back as bytes
    assert m.body == b"body"
    assert m.properties.message_id == 7
    assert m.properties.content_type == b"text/plain"
    assert m.application_properties == {b"k": b"v", b"n": 3}
    assert m.message_annotations == {b"x-a": b"b"}


# ---------------------------------------------------------------- C decoder of common shapes vs Python


def _typed(v: Any) -> Any:
    """A structure that differs whenever values or their types differ (str vs Symbol, int vs bool...)."""
    if isinstance(v, dict):
        return ("dict", sorted(((repr(_typed(k)), _typed(x)) for k, x in v.items()), key=repr))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [_typed(x) for x in v])
    if isinstance(v, float) and math.isnan(v):
        return ("float", "nan")
    return (type(v).__name__, v)


_ascii = st.characters(codec="ascii")
_symbols = st.text(alphabet=_ascii, max_size=8).map(Symbol)
_simple_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=300),
    st.binary(max_size=300), _ms_datetimes, st.uuids(), _symbols,
    st.integers(0, 255).map(UByte), st.integers(-(2**15), 2**15 - 1).map(Short),
    st.integers(0, 2**32 - 1).map(UInt), st.floats(width=32).map(Float32),
)
_map_keys = st.one_of(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), _symbols)
_nested = st.recursive(
    _simple_values,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_map_keys, inner, max_size=4)),
    max_leaves=10,
)
_exotic = st.one_of(
    st.builds(Described, st.integers(0, 255).map(ULong), st.text(max_size=3)),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3).map(Array),
    st.characters().map(Char),
    st.binary(min_size=4, max_size=4).map(Decimal32),
)


def _section(code: int, value: Any) -> bytes:
    return bytes((0x00, 0x53, code)) + encode_value(value)


def _sec(code: Any, values: Any) -> Any:
    return st.builds(_section, st.just(code) if isinstance(code, int) else code, values)


_sections = st.one_of(
    _sec(0x70, st.lists(st.one_of(st.booleans(), st.integers(0, 255)), max_size=6)),
    _sec(0x71, st.dictionaries(_symbols, _nested, max_size=3)),
    _sec(0x72, st.dictionaries(st.one_of(_symbols, st.integers(0, 99)), _nested, max_size=4)),
    _sec(0x73, st.lists(_simple_values, max_size=14)),
    _sec(0x74, st.dictionaries(st.text(max_size=8), st.one_of(_nested, _exotic), max_size=5)),
    _sec(0x75, st.binary(max_size=300)),
    _sec(0x75, st.text(max_size=3)),
    _sec(0x77, _nested),
    _sec(0x78, st.dictionaries(_symbols, _simple_values, max_size=2)),
    _sec(st.sampled_from([0x6F, 0x79, 0x10]), _simple_values),
)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(sections=st.lists(_sections, min_size=1, max_size=5), mutate=st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=2), cut=st.integers(0, 3))
def test_c_record_decoder_agrees_with_python(
    sections: list[bytes], mutate: list[tuple[int, int]], cut: int
) -> None:
    from streamledger.protocol.rabbitmq.amqp import _decode_one
    from tests.unit.rabbitmq import load_accel

    accel = load_accel()
    raw = bytearray(b"".join(sections))
    for at, value in mutate:
        raw[at % len(raw)] = value
    record = bytes(raw[: len(raw) - cut])
    fast = accel.decode_record(record)
    if fast is not None:  # None hands the record to the Python decoder, the reference
        assert _typed(fast) == _typed(_decode_one(record))


def test_c_record_decoder_takes_the_common_shapes() -> None:
    from tests.unit.rabbitmq import load_accel

    accel = load_accel()
    props = {"message-id": 9, "content-type": "text/plain", "creation-time": 1_700_000_000_000,
             "correlation-id": uuid.UUID(int=3)}
    msg = encode_message(
        b"body", properties=props,
        application_properties={"k": "v", "n": -5, "f": 0.5, "b": b"x", "t": True, "none": None},
        message_annotations={"x-routing-key": "rk"}, header={"durable": True})
    got = accel.decode_record(msg)
    assert got is not None
    body, props, app, ann = got
    assert body == b"body" and app == {"k": "v", "n": -5, "f": 0.5, "b": b"x", "t": True, "none": None}
    assert props["creation-time"] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert type(props["content-type"]) is Symbol and props["correlation-id"] == uuid.UUID(int=3)
    assert ann == {"x-routing-key": "rk"} and type(next(iter(ann))) is str
    assert accel.decode_record(encode_message(b"a") + encode_message(b"b"))[0] == b"ab"
    # shapes left to Python: amqp-value bodies, arrays, raw bytes
    assert accel.decode_record(h("00 53 77 a1 02 68 69")) is None
    assert accel.decode_record(b"hello") is None
    assert accel.decode_record(encode_message(b"", application_properties={"a": Array([1])})) is None
