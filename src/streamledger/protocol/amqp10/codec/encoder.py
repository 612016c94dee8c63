"""AMQP 1.0 encoder: any Python value (:func:`encode_value`) and stream messages (:func:`encode_message`).

Always the smallest form of a type (what the Java client writes; every form is valid AMQP): plain
``int`` becomes long, ``float`` double, ``str`` string; the wrappers of :mod:`.types` pick another
type explicitly (``UInt``, ``Symbol``, ...). Values out of range for their type raise ``ValueError``,
unencodable Python types ``TypeError``.
"""

from __future__ import annotations

import datetime as _dt
import struct
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from streamledger.protocol.amqp10.codec.types import (
    EPOCH,
    HEADER_FIELDS,
    PROPERTY_FIELDS,
    PROPERTY_INDEX,
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
)

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
        return (v - EPOCH) // _dt.timedelta(milliseconds=1)
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
        i = PROPERTY_INDEX.get(name)
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


def encode_value_message(
    value: Any,
    *,
    properties: Mapping[str, Any] | None = None,
    application_properties: Mapping[str, Any] | None = None,
) -> bytes:
    """A message whose body is one amqp-value section (what RabbitMQ's ``/management`` node reads)."""
    parts: list[bytes] = []
    if properties:
        parts.append(_encode_properties(properties))
    if application_properties:
        parts.append(_section(0x74, _enc(dict(application_properties))))
    parts.append(_section(0x77, _enc(value)))
    return b"".join(parts)
