"""The AMQP 1.0 type codec (OASIS AMQP 1.0 part 1 types, part 3 message sections).

Written from amqp10-message.md; one codec for two users: the RabbitMQ stream message codec
(:mod:`streamledger.protocol.rabbitmq.amqp`, records in stream chunks, with its optional C accelerator)
and the AMQP 1.0 client (:mod:`streamledger.protocol.amqp10`, performatives and management messages).

* :mod:`.types`: the Python side of the type system (wrappers, :class:`Described`, :class:`AmqpMessage`,
  section codes and field names);
* :mod:`.decoder`: :func:`decode_value`, :func:`decode_message` and the section walker;
* :mod:`.encoder`: :func:`encode_value`, :func:`encode_message`.

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

from streamledger.protocol.amqp10.codec.decoder import (
    decode_message,
    decode_record,
    decode_value,
    value_to_json_bytes,
    walk_sections,
)
from streamledger.protocol.amqp10.codec.encoder import encode_message, encode_value, encode_value_message
from streamledger.protocol.amqp10.codec.errors import AmqpDecodeError
from streamledger.protocol.amqp10.codec.types import (
    HEADER_FIELDS,
    PROPERTY_FIELDS,
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

__all__ = [
    "HEADER_FIELDS", "PROPERTY_FIELDS", "AmqpDecodeError", "AmqpMessage", "Array", "Byte", "Char",
    "Decimal32", "Decimal64", "Decimal128", "Described", "Float32", "Int", "Long", "Short", "Symbol",
    "UByte", "UInt", "ULong", "UShort", "decode_message", "decode_record", "decode_value",
    "encode_message", "encode_value", "encode_value_message", "value_to_json_bytes", "walk_sections",
]
