"""AMQP 1.0 type system and message sections, as stored in RabbitMQ stream records.

Written from amqp10-message.md. Two audiences:

* the hot path (:func:`decode_columns`, :func:`decode_misses`) turns stream records into body/
  properties/application-properties/message-annotations columns. Most records are a lone data
  section (``00 53 75 a0 <len> body``), recognised by a byte comparison; other shapes go through
  the section walker. Both have C versions in ``_accel.c`` (optional; the C walker handles the
  common shapes and returns ``None`` for the rest, which this module's walker, the reference,
  then decodes).
* everything else (:func:`decode_message`, :func:`decode_value`, :func:`encode_value`,
  :func:`encode_message`) covers the whole type system and round-trips.

Python mapping (decoding): null -> ``None``; boolean -> ``bool``; every integer type -> ``int``;
float/double -> ``float``; decimal32/64/128 -> :class:`Decimal32`/:class:`Decimal64`/
:class:`Decimal128` (the raw big-endian bytes, no arithmetic meaning is imposed); char ->
:class:`Char`; timestamp -> timezone-aware UTC ``datetime`` (an ``int`` of milliseconds when the
value is outside ``datetime``'s range); uuid -> ``uuid.UUID``; binary -> ``bytes``; string ->
``str``; symbol -> :class:`Symbol` (a ``str``); list -> ``list``; map -> ``dict``; array ->
:class:`Array` (a ``list``); described -> :class:`Described`. For encoding, plain ``int`` becomes
long (smallest form; ulong above 2**63-1), ``float`` double; the wrapper classes (:class:`UInt`,
:class:`Float32`, ...) pick another AMQP type explicitly.

Bodies: data sections are joined; an amqp-value body becomes its bytes (binary), its UTF-8 text
(string/symbol) or else compact JSON of the value (:func:`value_to_json_bytes`: bytes as hex,
timestamps ISO-8601, UUIDs as text); amqp-sequence bodies become the JSON of the list (several
sequence sections: the JSON list of those lists). The decoded value stays in ``AmqpMessage.value``.

Section dicts: properties and header use the spec's field names (``message-id``,
``creation-time``, ...), holding only the non-null fields; message-annotations keys become plain
``str`` (symbols) or stay ``int`` (ulong keys).
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.util
import json
import os
import struct
import sys
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from streamledger.protocol.rabbitmq.errors import AmqpDecodeError

# --------------------------------------------------------------------------------------------
# explicit-type wrappers


class Symbol(str):
    """AMQP symbol (ASCII), distinct from string."""

    __slots__ = ()


class Char(str):
    """AMQP char: exactly one Unicode code point."""

    __slots__ = ()


class UByte(int):
    """Encode as AMQP ubyte."""

    __slots__ = ()


class UShort(int):
    """Encode as AMQP ushort."""

    __slots__ = ()


class UInt(int):
    """Encode as AMQP uint."""

    __slots__ = ()


class ULong(int):
    """Encode as AMQP ulong."""

    __slots__ = ()


class Byte(int):
    """Encode as AMQP byte."""

    __slots__ = ()


class Short(int):
    """Encode as AMQP short."""

    __slots__ = ()


class Int(int):
    """Encode as AMQP int."""

    __slots__ = ()


class Long(int):
    """Encode as AMQP long."""

    __slots__ = ()


class Float32(float):
    """Encode as AMQP float (binary32)."""

    __slots__ = ()


class Decimal32(bytes):
    """AMQP decimal32, kept as its 4 raw bytes."""

    __slots__ = ()


class Decimal64(bytes):
    """AMQP decimal64, kept as its 8 raw bytes."""

    __slots__ = ()


class Decimal128(bytes):
    """AMQP decimal128, kept as its 16 raw bytes."""

    __slots__ = ()


class Array(list[Any]):
    """AMQP array: one element type for all items.

    ``code`` is the element format code; ``None`` lets the encoder infer it from the items.
    """

    def __init__(self, items: Iterable[Any] = (), code: int | None = None) -> None:
        super().__init__(items)
        self.code = code


@dataclass(frozen=True, slots=True)
class Described:
    """A described value: ``descriptor`` (usually a ulong or symbol) and the value."""

    descriptor: Any
    value: Any


@dataclass(slots=True)
class AmqpMessage:
    """One decoded AMQP 1.0 message (see the module docstring for the mapping)."""

    body: bytes
    header: dict[str, Any] | None = None
    delivery_annotations: dict[Any, Any] | None = None
    message_annotations: dict[Any, Any] | None = None
    properties: dict[str, Any] | None = None
    application_properties: dict[Any, Any] | None = None
    footer: dict[Any, Any] | None = None
    body_type: Literal["data", "value", "sequence", "none"] = "data"
    value: Any = None


# --------------------------------------------------------------------------------------------
# decoding

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MS = _dt.timedelta(milliseconds=1)

_u16 = struct.Struct(">H").unpack_from
_u32 = struct.Struct(">I").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_i16 = struct.Struct(">h").unpack_from
_i32 = struct.Struct(">i").unpack_from
_i64 = struct.Struct(">q").unpack_from
_f32 = struct.Struct(">f").unpack_from
_f64 = struct.Struct(">d").unpack_from
_two_u32 = struct.Struct(">II").unpack_from

_DecodeFn = Callable[[bytes, int], tuple[Any, int]]

_DECODE_ERRORS = (IndexError, struct.error, UnicodeDecodeError, RecursionError, ValueError, TypeError,
                  OverflowError, AmqpDecodeError)


class _Bad(Exception):
    """Internal: carries a decode failure reason without the cost of the public error type."""


def _ts(ms: int) -> _dt.datetime | int:
    try:
        return _EPOCH + ms * _MS
    except OverflowError:
        return ms


def _need(buf: bytes, end: int) -> None:
    if end > len(buf):
        raise _Bad("value runs past the end of the data")


def _d_null(buf: bytes, pos: int) -> tuple[Any, int]:
    return None, pos


def _d_true(buf: bytes, pos: int) -> tuple[Any, int]:
    return True, pos


def _d_false(buf: bytes, pos: int) -> tuple[Any, int]:
    return False, pos


def _d_zero(buf: bytes, pos: int) -> tuple[Any, int]:
    return 0, pos


def _d_empty_list(buf: bytes, pos: int) -> tuple[Any, int]:
    return [], pos


def _d_bool(buf: bytes, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    if b > 1:
        raise _Bad(f"boolean byte 0x{b:02x}")
    return b == 1, pos + 1


def _d_ubyte(buf: bytes, pos: int) -> tuple[Any, int]:
    return buf[pos], pos + 1


def _d_byte(buf: bytes, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    return (b - 256 if b > 127 else b), pos + 1


def _d_ushort(buf: bytes, pos: int) -> tuple[Any, int]:
    return _u16(buf, pos)[0], pos + 2


def _d_short(buf: bytes, pos: int) -> tuple[Any, int]:
    return _i16(buf, pos)[0], pos + 2


def _d_uint(buf: bytes, pos: int) -> tuple[Any, int]:
    return _u32(buf, pos)[0], pos + 4


def _d_int(buf: bytes, pos: int) -> tuple[Any, int]:
    return _i32(buf, pos)[0], pos + 4


def _d_ulong(buf: bytes, pos: int) -> tuple[Any, int]:
    return _u64(buf, pos)[0], pos + 8


def _d_long(buf: bytes, pos: int) -> tuple[Any, int]:
    return _i64(buf, pos)[0], pos + 8


def _d_float(buf: bytes, pos: int) -> tuple[Any, int]:
    return _f32(buf, pos)[0], pos + 4


def _d_double(buf: bytes, pos: int) -> tuple[Any, int]:
    return _f64(buf, pos)[0], pos + 8


def _d_dec32(buf: bytes, pos: int) -> tuple[Any, int]:
    _need(buf, pos + 4)
    return Decimal32(buf[pos : pos + 4]), pos + 4


def _d_dec64(buf: bytes, pos: int) -> tuple[Any, int]:
    _need(buf, pos + 8)
    return Decimal64(buf[pos : pos + 8]), pos + 8


def _d_dec128(buf: bytes, pos: int) -> tuple[Any, int]:
    _need(buf, pos + 16)
    return Decimal128(buf[pos : pos + 16]), pos + 16


def _d_char(buf: bytes, pos: int) -> tuple[Any, int]:
    return Char(chr(_u32(buf, pos)[0])), pos + 4


def _d_timestamp(buf: bytes, pos: int) -> tuple[Any, int]:
    return _ts(_i64(buf, pos)[0]), pos + 8


def _d_uuid(buf: bytes, pos: int) -> tuple[Any, int]:
    _need(buf, pos + 16)
    return uuid.UUID(bytes=bytes(buf[pos : pos + 16])), pos + 16


def _d_vbin8(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + buf[pos]
    _need(buf, end)
    return buf[pos + 1 : end], end


def _d_vbin32(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 4 + _u32(buf, pos)[0]
    _need(buf, end)
    return buf[pos + 4 : end], end


def _d_str8(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + buf[pos]
    _need(buf, end)
    return buf[pos + 1 : end].decode(), end


def _d_str32(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 4 + _u32(buf, pos)[0]
    _need(buf, end)
    return buf[pos + 4 : end].decode(), end


def _d_sym8(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + buf[pos]
    _need(buf, end)
    return Symbol(buf[pos + 1 : end].decode("ascii")), end


def _d_sym32(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 4 + _u32(buf, pos)[0]
    _need(buf, end)
    return Symbol(buf[pos + 4 : end].decode("ascii")), end


def _items(buf: bytes, pos: int, count: int, end: int) -> list[Any]:
    """``count`` consecutive values ending exactly at ``end``.

    The common item types of properties and application-properties (str8, sym8, vbin8, null,
    small integers, booleans) are decoded inline: one table call per item was the largest cost
    of the general message path.
    """
    if end > len(buf):
        raise _Bad("compound runs past the end of the data")
    if count > end - pos:  # every item takes at least one byte
        raise _Bad(f"compound claims {count} items in {end - pos} bytes")
    out: list[Any] = []
    append = out.append
    p = pos
    decoders = _DECODERS
    for _ in range(count):
        c = buf[p]
        if c == 0xA1:
            q = p + 2 + buf[p + 1]
            if q > end:
                raise _Bad("string runs past its compound")
            append(buf[p + 2 : q].decode())
            p = q
        elif c == 0x40:
            append(None)
            p += 1
        elif c == 0x53 or c == 0x52 or c == 0x50:
            append(buf[p + 1])
            p += 2
        elif c == 0xA3:
            q = p + 2 + buf[p + 1]
            if q > end:
                raise _Bad("symbol runs past its compound")
            append(Symbol(buf[p + 2 : q].decode("ascii")))
            p = q
        elif c == 0xA0:
            q = p + 2 + buf[p + 1]
            if q > end:
                raise _Bad("binary runs past its compound")
            append(buf[p + 2 : q])
            p = q
        elif c == 0x41:
            append(True)
            p += 1
        elif c == 0x42:
            append(False)
            p += 1
        else:
            v, p = decoders[c](buf, p + 1)
            append(v)
    if p != end:
        raise _Bad("compound size does not match its items")
    return out


def _d_list8(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + buf[pos]
    return _items(buf, pos + 2, buf[pos + 1], end), end


def _d_list32(buf: bytes, pos: int) -> tuple[Any, int]:
    size, count = _two_u32(buf, pos)
    end = pos + 4 + size
    return _items(buf, pos + 8, count, end), end


def _to_map(items: list[Any]) -> dict[Any, Any]:
    if len(items) & 1:
        raise _Bad("map with an odd number of elements")
    it = iter(items)
    return dict(zip(it, it, strict=True))


def _d_map8(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + buf[pos]
    return _to_map(_items(buf, pos + 2, buf[pos + 1], end)), end


def _d_map32(buf: bytes, pos: int) -> tuple[Any, int]:
    size, count = _two_u32(buf, pos)
    end = pos + 4 + size
    return _to_map(_items(buf, pos + 8, count, end)), end


def _array(buf: bytes, pos: int, count: int, end: int) -> Array:
    _need(buf, end)
    p = pos
    descriptor: Any = None
    described = buf[p] == 0x00
    if described:
        descriptor, p = _DECODERS[buf[p + 1]](buf, p + 2)
    code = buf[p]
    p += 1
    fn = _DECODERS[code]
    if fn is _d_invalid or code == 0x00:
        raise _Bad(f"bad array element constructor 0x{code:02x}")
    if 0x40 <= code <= 0x45:
        if count > 8 * len(buf):  # zero-width elements: bound the allocation by the input size
            raise _Bad(f"array of {count} zero-width elements")
    elif count > end - p:
        raise _Bad(f"array claims {count} elements in {end - p} bytes")
    items: list[Any] = []
    append = items.append
    for _ in range(count):
        v, p = fn(buf, p)
        append(Described(descriptor, v) if described else v)
    if p != end:
        raise _Bad("array size does not match its elements")
    return Array(items, code)


def _d_array8(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + buf[pos]
    return _array(buf, pos + 2, buf[pos + 1], end), end


def _d_array32(buf: bytes, pos: int) -> tuple[Any, int]:
    size, count = _two_u32(buf, pos)
    end = pos + 4 + size
    return _array(buf, pos + 8, count, end), end


def _d_described(buf: bytes, pos: int) -> tuple[Any, int]:
    descriptor, p = _DECODERS[buf[pos]](buf, pos + 1)
    value, p = _DECODERS[buf[p]](buf, p + 1)
    return Described(descriptor, value), p


def _d_invalid(buf: bytes, pos: int) -> tuple[Any, int]:
    raise _Bad(f"unknown AMQP format code 0x{buf[pos - 1]:02x}")


def _d_small_signed(buf: bytes, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    return (b - 256 if b > 127 else b), pos + 1


_DECODERS: list[_DecodeFn] = [_d_invalid] * 256
for _code, _fn in {
    0x00: _d_described,
    0x40: _d_null, 0x41: _d_true, 0x42: _d_false, 0x43: _d_zero, 0x44: _d_zero, 0x45: _d_empty_list,
    0x56: _d_bool, 0x50: _d_ubyte, 0x52: _d_ubyte, 0x53: _d_ubyte, 0x51: _d_byte,
    0x54: _d_small_signed, 0x55: _d_small_signed,
    0x60: _d_ushort, 0x61: _d_short, 0x70: _d_uint, 0x71: _d_int, 0x80: _d_ulong, 0x81: _d_long,
    0x72: _d_float, 0x82: _d_double, 0x74: _d_dec32, 0x84: _d_dec64, 0x94: _d_dec128,
    0x73: _d_char, 0x83: _d_timestamp, 0x98: _d_uuid,
    0xA0: _d_vbin8, 0xB0: _d_vbin32, 0xA1: _d_str8, 0xB1: _d_str32, 0xA3: _d_sym8, 0xB3: _d_sym32,
    0xC0: _d_list8, 0xD0: _d_list32, 0xC1: _d_map8, 0xD1: _d_map32, 0xE0: _d_array8, 0xF0: _d_array32,
}.items():
    _DECODERS[_code] = _fn
del _code, _fn


def decode_value(data: bytes | memoryview, pos: int = 0) -> tuple[Any, int]:
    """Decode one AMQP value starting at ``pos``; return it and the position after it."""
    buf = bytes(data) if not isinstance(data, bytes) else data
    try:
        return _DECODERS[buf[pos]](buf, pos + 1)
    except _Bad as exc:
        raise AmqpDecodeError(f"invalid AMQP 1.0 value at byte {pos}: {exc}") from None
    except _DECODE_ERRORS as exc:
        raise AmqpDecodeError(f"invalid AMQP 1.0 value at byte {pos}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, (IndexError, struct.error)):
        return "truncated data"
    if isinstance(exc, RecursionError):
        return "values nested too deeply"
    return f"{type(exc).__name__}: {exc}"


# ---- message sections

SECTION_HEADER = 0x70
SECTION_DELIVERY_ANNOTATIONS = 0x71
SECTION_MESSAGE_ANNOTATIONS = 0x72
SECTION_PROPERTIES = 0x73
SECTION_APPLICATION_PROPERTIES = 0x74
SECTION_DATA = 0x75
SECTION_AMQP_SEQUENCE = 0x76
SECTION_AMQP_VALUE = 0x77
SECTION_FOOTER = 0x78

_SECTION_SYMBOLS = {
    "amqp:header:list": 0x70,
    "amqp:delivery-annotations:map": 0x71,
    "amqp:message-annotations:map": 0x72,
    "amqp:properties:list": 0x73,
    "amqp:application-properties:map": 0x74,
    "amqp:data:binary": 0x75,
    "amqp:amqp-sequence:list": 0x76,
    "amqp:amqp-value:*": 0x77,
    "amqp:footer:map": 0x78,
}

HEADER_FIELDS = ("durable", "priority", "ttl", "first-acquirer", "delivery-count")
PROPERTY_FIELDS = (
    "message-id", "user-id", "to", "subject", "reply-to", "correlation-id", "content-type",
    "content-encoding", "absolute-expiry-time", "creation-time", "group-id", "group-sequence",
    "reply-to-group-id",
)
_PROPERTY_INDEX = {name: i for i, name in enumerate(PROPERTY_FIELDS)}


def _fields(value: Any, names: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(value, list):
        raise _Bad(f"{what} section is not a list")
    if len(value) > len(names):
        raise _Bad(f"{what} section has {len(value)} fields, at most {len(names)} are defined")
    return {names[i]: v for i, v in enumerate(value) if v is not None}


def _annotations(value: Any, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{what} section is not a map")
    return {(str(k) if isinstance(k, Symbol) else k): v for k, v in value.items()}


_Walked = tuple[
    "dict[str, Any] | None",  # header
    "dict[Any, Any] | None",  # delivery-annotations
    "dict[Any, Any] | None",  # message-annotations
    "dict[str, Any] | None",  # properties
    "dict[Any, Any] | None",  # application-properties
    "list[bytes] | None",  # data sections
    "list[Any] | None",  # amqp-sequence sections
    bool,  # amqp-value present
    Any,  # amqp-value
    "dict[Any, Any] | None",  # footer
]


def _walk(buf: bytes) -> _Walked:
    """Parse a record as a sequence of sections; raises _Bad / low-level errors when it is not one."""
    n = len(buf)
    if n < 3:
        raise _Bad("too short for an AMQP section")
    header: dict[str, Any] | None = None
    da: dict[Any, Any] | None = None
    ma: dict[Any, Any] | None = None
    props: dict[str, Any] | None = None
    app: dict[Any, Any] | None = None
    data: list[bytes] | None = None
    seq: list[Any] | None = None
    value: Any = None
    value_set = False
    footer: dict[Any, Any] | None = None
    pos = 0
    first = True
    while pos < n:
        if buf[pos] != 0x00:
            raise _Bad(f"byte {pos} is not a section (described value) constructor")
        if buf[pos + 1] == 0x53:  # smallulong descriptor, the usual case
            code = buf[pos + 2]
            pos += 3
        else:
            desc, pos = _DECODERS[buf[pos + 1]](buf, pos + 2)
            if isinstance(desc, str):
                code = _SECTION_SYMBOLS.get(desc, -1)
            elif isinstance(desc, int) and 0x70 <= desc <= 0x78:
                code = desc
            else:
                code = -1
        if first and not 0x70 <= code <= 0x78:
            raise _Bad("first section has no AMQP message section descriptor")
        first = False
        c = buf[pos]
        if code == 0x75 and c == 0xA0:  # data, inline for speed
            end = pos + 2 + buf[pos + 1]
            if end > n:
                raise _Bad("data section runs past the end of the record")
            v: Any = buf[pos + 2 : end]
            pos = end
        else:
            v, pos = _DECODERS[c](buf, pos + 1)
        if code == 0x75:
            if not isinstance(v, bytes):
                raise _Bad("data section does not hold binary")
            if data is None:
                data = [v]
            else:
                data.append(v)
        elif code == 0x73:
            props = _fields(v, PROPERTY_FIELDS, "properties")
        elif code == 0x74:
            if not isinstance(v, dict):
                raise _Bad("application-properties section is not a map")
            app = v
        elif code == 0x72:
            ma = _annotations(v, "message-annotations")
        elif code == 0x70:
            header = _fields(v, HEADER_FIELDS, "header")
        elif code == 0x71:
            da = _annotations(v, "delivery-annotations")
        elif code == 0x77:
            value = v
            value_set = True
        elif code == 0x76:
            if not isinstance(v, list):
                raise _Bad("amqp-sequence section is not a list")
            if seq is None:
                seq = [v]
            else:
                seq.append(v)
        elif code == 0x78:
            footer = _annotations(v, "footer")
        # unknown descriptors: skipped, as the spec asks
    if pos != n:
        raise _Bad("last section runs past the end of the record")
    return header, da, ma, props, app, data, seq, value_set, value, footer


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, Described):
        return {"descriptor": _jsonable(v.descriptor), "value": _jsonable(v.value)}
    if isinstance(v, dict):
        return {(k if isinstance(k, str) else json.dumps(_jsonable(k))): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def value_to_json_bytes(value: Any) -> bytes:
    """Compact JSON of a decoded AMQP value (how non-binary, non-string bodies are exposed)."""
    return json.dumps(_jsonable(value), separators=(",", ":"), ensure_ascii=False).encode()


def _body(
    data: list[bytes] | None, seq: list[Any] | None, value_set: bool, value: Any
) -> tuple[bytes, Literal["data", "value", "sequence", "none"], Any]:
    if data is not None:
        return (data[0] if len(data) == 1 else b"".join(data)), "data", None
    if value_set:
        if isinstance(value, bytes):
            return value, "value", value
        if isinstance(value, str):
            return value.encode(), "value", value
        return value_to_json_bytes(value), "value", value
    if seq is not None:
        sq: Any = seq[0] if len(seq) == 1 else seq
        return value_to_json_bytes(sq), "sequence", sq
    return b"", "none", None


def decode_message(data: bytes | memoryview) -> AmqpMessage:
    """Decode a whole record as an AMQP 1.0 message; :class:`AmqpDecodeError` if it is not one."""
    buf = bytes(data) if not isinstance(data, bytes) else data
    try:
        header, da, ma, props, app, data_, seq, value_set, value, footer = _walk(buf)
        body, kind, decoded = _body(data_, seq, value_set, value)
    except _Bad as exc:
        raise AmqpDecodeError(f"not an AMQP 1.0 message: {exc}") from None
    except _DECODE_ERRORS as exc:
        raise AmqpDecodeError(f"not an AMQP 1.0 message: {_reason(exc)}") from None
    return AmqpMessage(body, header, da, ma, props, app, footer, kind, decoded)


_DATA8 = b"\x00\x53\x75\xa0"
_DATA32 = b"\x00\x53\x75\xb0"


_Decoded = tuple[bytes, "dict[str, Any] | None", "dict[Any, Any] | None", "dict[Any, Any] | None"]


def _decode_one(r: bytes) -> _Decoded:
    """(body, properties, application-properties, message-annotations) of one record; raw if not AMQP."""
    try:
        _h, _da, ma, props, app, data, seq, value_set, value, _f = _walk(r)
        if data is not None and len(data) == 1:
            return data[0], props, app, ma
        body = _body(data, seq, value_set, value)[0]
    except (_Bad, *_DECODE_ERRORS):
        return r, None, None, None
    return body, props, app, ma


_Columns = tuple[
    list[bytes], list[dict[str, Any] | None], list[dict[Any, Any] | None], list[dict[Any, Any] | None]
]


def _data_bodies_py(records: list[bytes]) -> tuple[list[bytes | None], int]:
    """Pure-Python twin of ``_accel.data_bodies``: the body of every record that is exactly one
    data section (vbin8 or vbin32 filling the record), ``None`` for the others, and their count."""
    d8 = _DATA8
    # one data section with a vbin8 body, the common shape, checked without a function call
    bodies: list[bytes | None] = [
        r[5:] if r[:4] == d8 and len(r) > 4 and r[4] + 5 == len(r) else None for r in records
    ]
    misses = bodies.count(None)
    if misses:
        d32 = _DATA32
        for i, b in enumerate(bodies):
            if b is None:
                r = records[i]
                if r[:4] == d32 and len(r) >= 9 and _u32(r, 4)[0] + 9 == len(r):
                    bodies[i] = r[9:]
                    misses -= 1
    return bodies, misses


def _no_accel(record: bytes) -> _Decoded | None:
    return None


def _uuid_from_bytes(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw)


def load_accelerator() -> ModuleType | None:
    """The optional C loops (``_accel``), or ``None`` to use the pure-Python ones.

    ``None`` when ``STREAMLEDGER_PURE_PYTHON`` is set, when the module is not built, or when the
    built file is older than ``_accel.c`` next to it (a stale build after a source update: it is
    not even imported, and a warning says how to rebuild).
    """
    if os.environ.get("STREAMLEDGER_PURE_PYTHON"):
        return None
    name = f"{__package__}._accel"
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    source = Path(__file__).with_name("_accel.c")
    try:
        stale = source.stat().st_mtime > Path(spec.origin).stat().st_mtime
    except OSError:
        stale = False  # no source next to the build (an installed wheel)
    if stale and name not in sys.modules:
        warnings.warn(f"{spec.origin} is older than {source.name}; using the pure-Python decoder "
                      f"(rebuild: python -m {__package__}._accel_build)", RuntimeWarning, stacklevel=2)
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    module.configure(Symbol, _ts, _uuid_from_bytes, PROPERTY_FIELDS)
    return module


ACCEL = load_accelerator()
_data_bodies: Callable[[list[bytes]], tuple[list[bytes | None], int]] = _data_bodies_py
# the C decoder of common message shapes; None means "let _decode_one decide"
_decode_record: Callable[[bytes], _Decoded | None] = _no_accel
if ACCEL is not None:
    _data_bodies = ACCEL.data_bodies
    _decode_record = ACCEL.decode_record


def decode_columns(records: list[bytes]) -> _Columns:
    """Decode many records into (bodies, properties, application_properties, message_annotations).

    Records that are not AMQP 1.0 pass through untouched as bodies with ``None`` dicts.
    """
    found, misses = _data_bodies(records)
    m = len(found)
    if not misses:
        return found, [None] * m, [None] * m, [None] * m  # type: ignore[return-value]
    bodies: list[bytes] = []
    props: list[dict[str, Any] | None] = [None] * m
    apps: list[dict[Any, Any] | None] = [None] * m
    mas: list[dict[Any, Any] | None] = [None] * m
    for i, b in enumerate(found):
        if b is None:
            r = records[i]
            b, props[i], apps[i], mas[i] = _decode_record(r) or _decode_one(r)
        bodies.append(b)
    return bodies, props, apps, mas


def decode_misses(
    items: list[bytes], misses: list[int]
) -> tuple[list[dict[str, Any] | None], list[dict[Any, Any] | None], list[dict[Any, Any] | None]]:
    """Finish columns whose lone-data-section bodies are already cut out.

    ``items[i]`` for ``i`` in ``misses`` is a whole record of another shape: it is replaced by its
    body (or left as is when it is not AMQP); returns the three dict columns.
    """
    m = len(items)
    props: list[dict[str, Any] | None] = [None] * m
    apps: list[dict[Any, Any] | None] = [None] * m
    mas: list[dict[Any, Any] | None] = [None] * m
    for i in misses:
        r = items[i]
        items[i], props[i], apps[i], mas[i] = _decode_record(r) or _decode_one(r)
    return props, apps, mas


# --------------------------------------------------------------------------------------------
# encoding

_p_u16 = struct.Struct(">H").pack
_p_u32 = struct.Struct(">I").pack
_p_u64 = struct.Struct(">Q").pack
_p_i16 = struct.Struct(">h").pack
_p_i32 = struct.Struct(">i").pack
_p_i64 = struct.Struct(">q").pack
_p_f32 = struct.Struct(">f").pack
_p_f64 = struct.Struct(">d").pack


def _ms(v: _dt.datetime | int) -> int:
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=_dt.UTC)
        return (v - _EPOCH) // _MS
    return int(v)


def _enc_uint(v: int) -> bytes:
    if v == 0:
        return b"\x43"
    if v < 256:
        return bytes((0x52, v))
    return b"\x70" + _p_u32(v)


def _enc_ulong(v: int) -> bytes:
    if v == 0:
        return b"\x44"
    if v < 256:
        return bytes((0x53, v))
    return b"\x80" + _p_u64(v)


def _enc_long(v: int) -> bytes:
    if -128 <= v <= 127:
        return bytes((0x55, v & 0xFF))
    return b"\x81" + _p_i64(v)


def _enc_int(v: int) -> bytes:
    if -128 <= v <= 127:
        return bytes((0x54, v & 0xFF))
    return b"\x71" + _p_i32(v)


def _vlen(small: int, large: int, raw: bytes) -> bytes:
    n = len(raw)
    if n < 256:
        return bytes((small, n)) + raw
    return bytes((large,)) + _p_u32(n) + raw


def _compound(small: int, large: int, count: int, payload: bytes) -> bytes:
    if count < 256 and len(payload) + 1 < 256:
        return bytes((small, len(payload) + 1, count)) + payload
    return bytes((large,)) + _p_u32(len(payload) + 4) + _p_u32(count) + payload


def encode_value(value: Any) -> bytes:
    """Encode a Python value with the smallest AMQP 1.0 form (see the module docstring)."""
    try:
        return _enc(value)
    except (struct.error, OverflowError) as exc:
        raise ValueError(f"value out of range for its AMQP type: {value!r} ({exc})") from None


def _enc(v: Any) -> bytes:
    if v is None:
        return b"\x40"
    if v is True:
        return b"\x41"
    if v is False:
        return b"\x42"
    if isinstance(v, int):
        t = type(v)
        if t is int or t is Long:
            if t is int and v > 0x7FFFFFFFFFFFFFFF:
                return _enc_ulong(v)
            return _enc_long(v)
        if t is UInt:
            return _enc_uint(v)
        if t is ULong:
            return _enc_ulong(v)
        if t is Int:
            return _enc_int(v)
        if t is UByte:
            if not 0 <= v <= 255:
                raise ValueError(f"ubyte out of range: {v}")
            return bytes((0x50, v))
        if t is Byte:
            if not -128 <= v <= 127:
                raise ValueError(f"byte out of range: {v}")
            return bytes((0x51, v & 0xFF))
        if t is UShort:
            return b"\x60" + _p_u16(v)
        if t is Short:
            return b"\x61" + _p_i16(v)
        if isinstance(v, bool):
            return b"\x41" if v else b"\x42"
        return _enc_long(int(v))
    if isinstance(v, float):
        if isinstance(v, Float32):
            return b"\x72" + _p_f32(v)
        return b"\x82" + _p_f64(v)
    if isinstance(v, Symbol):
        return _vlen(0xA3, 0xB3, v.encode("ascii"))
    if isinstance(v, Char):
        if len(v) != 1:
            raise ValueError(f"char must be one code point, got {v!r}")
        return b"\x73" + _p_u32(ord(v))
    if isinstance(v, str):
        return _vlen(0xA1, 0xB1, v.encode())
    if isinstance(v, Decimal32):
        return _fixed(0x74, v, 4)
    if isinstance(v, Decimal64):
        return _fixed(0x84, v, 8)
    if isinstance(v, Decimal128):
        return _fixed(0x94, v, 16)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _vlen(0xA0, 0xB0, bytes(v))
    if isinstance(v, _dt.datetime):
        return b"\x83" + _p_i64(_ms(v))
    if isinstance(v, uuid.UUID):
        return b"\x98" + v.bytes
    if isinstance(v, Described):
        return b"\x00" + _enc(v.descriptor) + _enc(v.value)
    if isinstance(v, Array):
        return _enc_array(v)
    if isinstance(v, (list, tuple)):
        if not v:
            return b"\x45"
        return _compound(0xC0, 0xD0, len(v), b"".join(_enc(x) for x in v))
    if isinstance(v, Mapping):
        payload = b"".join(_enc(k) + _enc(x) for k, x in v.items())
        return _compound(0xC1, 0xD1, 2 * len(v), payload)
    raise TypeError(f"cannot encode {type(v).__name__} as an AMQP 1.0 value")


def _fixed(code: int, raw: bytes, width: int) -> bytes:
    if len(raw) != width:
        raise ValueError(f"AMQP format code 0x{code:02x} needs {width} bytes, got {len(raw)}")
    return bytes((code,)) + raw


def _infer_array_code(items: list[Any]) -> int:
    if not items:
        return 0x40
    v = items[0]
    # the widest constructor of the kind, so that every element fits whatever its value
    for cls, code in (
        (bool, 0x56), (UByte, 0x50), (UShort, 0x60), (UInt, 0x70), (ULong, 0x80), (Byte, 0x51),
        (Short, 0x61), (Int, 0x71), (Float32, 0x72), (float, 0x82), (Symbol, 0xB3), (Char, 0x73),
        (str, 0xB1), (Decimal32, 0x74), (Decimal64, 0x84), (Decimal128, 0x94), (bytes, 0xB0),
        (_dt.datetime, 0x83), (uuid.UUID, 0x98), (list, 0xD0), (tuple, 0xD0), (dict, 0xD1),
        (int, 0x81),
    ):
        if isinstance(v, cls):
            return code
    if v is None:
        return 0x40
    raise TypeError(f"cannot encode an array of {type(v).__name__}")


def _enc_element(code: int, v: Any) -> bytes:
    """One array element without its constructor."""
    full = _ENC_AS[code](v)
    return full[1:]


def _enc_list32(v: Any) -> bytes:
    payload = b"".join(_enc(x) for x in v)
    return b"\xd0" + _p_u32(len(payload) + 4) + _p_u32(len(v)) + payload


def _enc_map32(v: Any) -> bytes:
    payload = b"".join(_enc(k) + _enc(x) for k, x in v.items())
    return b"\xd1" + _p_u32(len(payload) + 4) + _p_u32(2 * len(v)) + payload


def _nothing(code: int) -> Callable[[Any], bytes]:
    def enc(v: Any) -> bytes:
        return bytes((code,))
    return enc


_ENC_AS: dict[int, Callable[[Any], bytes]] = {
    0x40: _nothing(0x40),
    0x56: lambda v: bytes((0x56, 1 if v else 0)),
    0x50: lambda v: bytes((0x50, v)),
    0x51: lambda v: bytes((0x51, v & 0xFF)),
    0x60: lambda v: b"\x60" + _p_u16(v),
    0x61: lambda v: b"\x61" + _p_i16(v),
    0x70: lambda v: b"\x70" + _p_u32(v),
    0x71: lambda v: b"\x71" + _p_i32(v),
    0x80: lambda v: b"\x80" + _p_u64(v),
    0x81: lambda v: b"\x81" + _p_i64(v),
    0x72: lambda v: b"\x72" + _p_f32(v),
    0x82: lambda v: b"\x82" + _p_f64(v),
    0x74: lambda v: _fixed(0x74, v, 4),
    0x84: lambda v: _fixed(0x84, v, 8),
    0x94: lambda v: _fixed(0x94, v, 16),
    0x73: lambda v: b"\x73" + _p_u32(ord(v)),
    0x83: lambda v: b"\x83" + _p_i64(_ms(v)),
    0x98: lambda v: b"\x98" + v.bytes,
    0xA0: lambda v: b"\xa0" + bytes((len(v),)) + bytes(v),
    0xB0: lambda v: b"\xb0" + _p_u32(len(v)) + bytes(v),
    0xA1: lambda v: b"\xa1" + bytes((len(v.encode()),)) + v.encode(),
    0xB1: lambda v: b"\xb1" + _p_u32(len(v.encode())) + v.encode(),
    0xA3: lambda v: b"\xa3" + bytes((len(v),)) + v.encode("ascii"),
    0xB3: lambda v: b"\xb3" + _p_u32(len(v)) + v.encode("ascii"),
    0xD0: _enc_list32,
    0xD1: _enc_map32,
}


def _enc_array(v: Array) -> bytes:
    items = list(v)
    code = v.code if v.code is not None else _infer_array_code(items)
    if code not in _ENC_AS:
        raise ValueError(f"cannot encode array elements with format code 0x{code:02x}")
    if code == 0x40 and any(x is not None for x in items):
        raise ValueError("an array of nulls holds only None")
    payload = bytes((code,)) + b"".join(_enc_element(code, x) for x in items)
    if len(items) < 256 and len(payload) + 1 < 256:
        return bytes((0xE0, len(payload) + 1, len(items))) + payload
    return b"\xf0" + _p_u32(len(payload) + 4) + _p_u32(len(items)) + payload


def _section(code: int, value: bytes) -> bytes:
    return bytes((0x00, 0x53, code)) + value


def _id_value(v: Any) -> bytes:
    if isinstance(v, int) and not isinstance(v, bool):
        return _enc_ulong(int(v))
    if isinstance(v, (str, bytes, bytearray, uuid.UUID)):
        return _enc(v)
    raise TypeError(f"message-id / correlation-id must be int, str, bytes or UUID, not {type(v).__name__}")


def _encode_properties(props: Mapping[str, Any]) -> bytes:
    fields: list[bytes | None] = [None] * len(PROPERTY_FIELDS)
    for key, v in props.items():
        name = key.replace("_", "-")
        i = _PROPERTY_INDEX.get(name)
        if i is None:
            raise ValueError(f"unknown AMQP message property {key!r}")
        if v is None:
            continue
        if i in (0, 5):
            fields[i] = _id_value(v)
        elif i == 1:
            fields[i] = _vlen(0xA0, 0xB0, v.encode() if isinstance(v, str) else bytes(v))
        elif i in (6, 7):
            fields[i] = _vlen(0xA3, 0xB3, str(v).encode("ascii"))
        elif i in (8, 9):
            fields[i] = b"\x83" + _p_i64(_ms(v))
        elif i == 11:
            fields[i] = _enc_uint(int(v))
        else:
            fields[i] = _vlen(0xA1, 0xB1, str(v).encode())
    last = max((i for i, f in enumerate(fields) if f is not None), default=-1)
    if last < 0:
        return _section(0x73, b"\x45")
    payload = b"".join(f if f is not None else b"\x40" for f in fields[: last + 1])
    return _section(0x73, _compound(0xC0, 0xD0, last + 1, payload))


def encode_message(
    body: bytes,
    *,
    properties: Mapping[str, Any] | None = None,
    application_properties: Mapping[str, Any] | None = None,
    message_annotations: Mapping[str, Any] | None = None,
    header: Mapping[str, Any] | None = None,
) -> bytes:
    """Encode a message the way the Java client does: sections in canonical order, one data body.

    ``properties`` keys are the spec's field names (``message-id`` or ``message_id``);
    ``message_annotations`` keys are encoded as symbols.
    """
    parts: list[bytes] = []
    if header:
        values = [None] * len(HEADER_FIELDS)
        for key, v in header.items():
            name = key.replace("_", "-")
            if name not in HEADER_FIELDS:
                raise ValueError(f"unknown AMQP header field {key!r}")
            values[HEADER_FIELDS.index(name)] = v
        enc_fields = [
            _enc(bool(values[0])) if values[0] is not None else b"\x40",
            bytes((0x50, int(values[1]))) if values[1] is not None else b"\x40",
            _enc_uint(int(values[2])) if values[2] is not None else b"\x40",
            _enc(bool(values[3])) if values[3] is not None else b"\x40",
            _enc_uint(int(values[4])) if values[4] is not None else b"\x40",
        ]
        last = max(i for i, v in enumerate(values) if v is not None) if any(
            v is not None for v in values) else -1
        if last >= 0:
            parts.append(_section(0x70, _compound(0xC0, 0xD0, last + 1, b"".join(enc_fields[: last + 1]))))
    if message_annotations:
        parts.append(_section(0x72, _enc({Symbol(k) if isinstance(k, str) else k: v
                                          for k, v in message_annotations.items()})))
    if properties:
        parts.append(_encode_properties(properties))
    if application_properties:
        parts.append(_section(0x74, _enc(dict(application_properties))))
    parts.append(_section(0x75, _vlen(0xA0, 0xB0, bytes(body))))
    return b"".join(parts)
