"""The AMQP 1.0 type system as Python values: explicit-type wrappers, described values, messages.

Shared by the stream message codec (records in RabbitMQ streams) and the AMQP 1.0 client (performatives
and management messages). The mapping between AMQP types and Python values is in
:mod:`streamledger.protocol.amqp10.codec` (package docstring).
"""

from __future__ import annotations

import datetime as _dt
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

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

SECTION_SYMBOLS = {
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
PROPERTY_INDEX = {name: i for i, name in enumerate(PROPERTY_FIELDS)}


EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MS = _dt.timedelta(milliseconds=1)


def timestamp_value(ms: int) -> _dt.datetime | int:
    """A timestamp's Python value: aware UTC datetime, or the raw milliseconds outside its range."""
    try:
        return EPOCH + ms * _MS
    except OverflowError:
        return ms


def uuid_from_bytes(raw: bytes) -> uuid.UUID:
    """A uuid's Python value (the C accelerator calls back into this)."""
    return uuid.UUID(bytes=raw)
