"""AMQP 1.0 decoder: any value (:func:`decode_value`) and whole messages (:func:`decode_message`).

Every format code of the spec is accepted; a value that does not follow the rules (a length or count
running past its compound, an odd map, an unknown format code, invalid UTF-8) raises
:class:`AmqpDecodeError` with the byte position, never an ``IndexError`` from deep inside. Counts are
checked against the bytes left before anything is allocated, so a hostile length cannot make the
decoder allocate more than the input's size. The section walker (:func:`walk_sections`) is the
reference for the stream record decoder's C twin.
"""

from __future__ import annotations

import datetime as _dt
import json
import struct
import uuid
from collections.abc import Callable
from typing import Any, Literal

from streamledger.protocol.amqp10.codec.errors import AmqpDecodeError
from streamledger.protocol.amqp10.codec.types import (
    HEADER_FIELDS,
    PROPERTY_FIELDS,
    SECTION_SYMBOLS,
    AmqpMessage,
    Array,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Symbol,
    timestamp_value,
)

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
    return timestamp_value(_i64(buf, pos)[0]), pos + 8


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


def walk_sections(buf: bytes) -> _Walked:
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
                code = SECTION_SYMBOLS.get(desc, -1)
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
            # binary by its constructor (vbin8/vbin32): decimal and uuid values are bytes too
            if c not in (0xA0, 0xB0):
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
        header, da, ma, props, app, data_, seq, value_set, value, footer = walk_sections(buf)
        body, kind, decoded = _body(data_, seq, value_set, value)
    except _Bad as exc:
        raise AmqpDecodeError(f"not an AMQP 1.0 message: {exc}") from None
    except _DECODE_ERRORS as exc:
        raise AmqpDecodeError(f"not an AMQP 1.0 message: {_reason(exc)}") from None
    return AmqpMessage(body, header, da, ma, props, app, footer, kind, decoded)


Decoded = tuple[bytes, "dict[str, Any] | None", "dict[Any, Any] | None", "dict[Any, Any] | None"]


def decode_record(r: bytes) -> Decoded:
    """(body, properties, application-properties, message-annotations) of one record; raw if not AMQP."""
    try:
        _h, _da, ma, props, app, data, seq, value_set, value, _f = walk_sections(r)
        if data is not None and len(data) == 1:
            return data[0], props, app, ma
        body = _body(data, seq, value_set, value)[0]
    except (_Bad, *_DECODE_ERRORS):
        return r, None, None, None
    return body, props, app, ma

