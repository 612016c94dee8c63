"""The stream message codec: AMQP 1.0 records of RabbitMQ streams as columns.

The hot path (:func:`decode_columns`, :func:`decode_misses`) turns stream records into body/
properties/application-properties/message-annotations columns. Most records are a lone data
section (``00 53 75 a0 <len> body``), recognised by a byte comparison; other shapes go through
the shared codec's section walker. Both have C versions in ``_accel.c`` (optional, see
:mod:`.accel`; the C walker handles the common shapes and returns ``None`` for the rest, which the
Python walker, the reference, then decodes).

The type system itself (values, messages, encoder, decoder) is the shared AMQP 1.0 codec,
:mod:`streamledger.protocol.amqp10.codec`, re-exported here for the stream client's users; the
decode functions here raise this client's :class:`~.errors.AmqpDecodeError` (a ``ProtocolError``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from streamledger.protocol.amqp10.codec import decoder as _decoder
from streamledger.protocol.amqp10.codec import errors as _codec_errors
from streamledger.protocol.amqp10.codec.decoder import Decoded as _Decoded
from streamledger.protocol.amqp10.codec.decoder import decode_record as _decode_one
from streamledger.protocol.amqp10.codec.decoder import value_to_json_bytes
from streamledger.protocol.amqp10.codec.encoder import encode_message, encode_value
from streamledger.protocol.amqp10.codec.types import (
    HEADER_FIELDS,
    PROPERTY_FIELDS,
    SECTION_AMQP_SEQUENCE,
    SECTION_AMQP_VALUE,
    SECTION_APPLICATION_PROPERTIES,
    SECTION_DATA,
    SECTION_DELIVERY_ANNOTATIONS,
    SECTION_FOOTER,
    SECTION_HEADER,
    SECTION_MESSAGE_ANNOTATIONS,
    SECTION_PROPERTIES,
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
)
from streamledger.protocol.amqp10.codec.types import timestamp_value as _ts
from streamledger.protocol.amqp10.codec.types import uuid_from_bytes as _uuid_from_bytes
from streamledger.protocol.rabbitmq.accel import ACCEL, load_accelerator
from streamledger.protocol.rabbitmq.errors import AmqpDecodeError

__all__ = [
    "ACCEL",
    "HEADER_FIELDS",
    "PROPERTY_FIELDS",
    "SECTION_AMQP_SEQUENCE",
    "SECTION_AMQP_VALUE",
    "SECTION_APPLICATION_PROPERTIES",
    "SECTION_DATA",
    "SECTION_DELIVERY_ANNOTATIONS",
    "SECTION_FOOTER",
    "SECTION_HEADER",
    "SECTION_MESSAGE_ANNOTATIONS",
    "SECTION_PROPERTIES",
    "AmqpMessage",
    "Array",
    "Byte",
    "Char",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "Described",
    "Float32",
    "Int",
    "Long",
    "Short",
    "Symbol",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
    "_ts",
    "_uuid_from_bytes",
    "decode_columns",
    "decode_message",
    "decode_misses",
    "decode_value",
    "encode_message",
    "encode_value",
    "load_accelerator",
    "value_to_json_bytes",
]

_u32 = struct.Struct(">I").unpack_from
_DATA8 = b"\x00\x53\x75\xa0"
_DATA32 = b"\x00\x53\x75\xb0"


def decode_value(data: bytes | memoryview, pos: int = 0) -> tuple[Any, int]:
    """Decode one AMQP value starting at ``pos``; return it and the position after it."""
    try:
        return _decoder.decode_value(data, pos)
    except _codec_errors.AmqpDecodeError as exc:
        raise AmqpDecodeError(str(exc)) from None


def decode_message(data: bytes | memoryview) -> AmqpMessage:
    """Decode a whole record as an AMQP 1.0 message; :class:`AmqpDecodeError` if it is not one."""
    try:
        return _decoder.decode_message(data)
    except _codec_errors.AmqpDecodeError as exc:
        raise AmqpDecodeError(str(exc)) from None


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
                if r[:4] == d32 and len(r) >= 8 and _u32(r, 4)[0] + 8 == len(r):
                    bodies[i] = r[8:]
                    misses -= 1
    return bodies, misses


def _no_accel(record: bytes) -> _Decoded | None:
    return None


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


