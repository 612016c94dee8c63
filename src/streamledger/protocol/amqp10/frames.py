"""AMQP 1.0 framing and performatives (OASIS AMQP 1.0 part 2), as pure functions on bytes.

A frame is ``size:uint32 doff:uint8 type:uint8 channel:uint16``, an extended header of
``doff * 4 - 8`` bytes (skipped), then the body: one described performative (a list) and, for
``transfer``, the message bytes that follow it. An 8-byte frame with no body is a heartbeat.
Type 0 frames carry AMQP performatives, type 1 frames SASL ones.

Performatives decode to :class:`Performative`: the spec's name and its fields by the spec's field
names (absent trailing fields are ``None``). Encoders take Python values and apply the field types
the spec demands (uint, ushort, symbol, ...), trimming trailing nulls as the spec allows.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from streamledger.protocol.amqp10.codec.decoder import decode_value
from streamledger.protocol.amqp10.codec.encoder import encode_value
from streamledger.protocol.amqp10.codec.errors import AmqpDecodeError
from streamledger.protocol.amqp10.codec.types import Array, Described, Symbol, UByte, UInt, ULong, UShort
from streamledger.protocol.amqp10.errors import Amqp10ProtocolError, FrameTooLarge

AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"
TLS_HEADER: Final = b"AMQP\x02\x01\x00\x00"
FRAME_AMQP: Final = 0
FRAME_SASL: Final = 1
MIN_MAX_FRAME_SIZE: Final = 512  # every peer must accept frames up to this size (part 2, 2.7.1)
_HEAD = struct.Struct(">IBBH")

# descriptor code -> (name, field names)
PERFORMATIVES: Final[dict[int, tuple[str, tuple[str, ...]]]] = {
    0x10: (
        "open",
        (
            "container-id",
            "hostname",
            "max-frame-size",
            "channel-max",
            "idle-time-out",
            "outgoing-locales",
            "incoming-locales",
            "offered-capabilities",
            "desired-capabilities",
            "properties",
        ),
    ),
    0x11: (
        "begin",
        (
            "remote-channel",
            "next-outgoing-id",
            "incoming-window",
            "outgoing-window",
            "handle-max",
            "offered-capabilities",
            "desired-capabilities",
            "properties",
        ),
    ),
    0x12: (
        "attach",
        (
            "name",
            "handle",
            "role",
            "snd-settle-mode",
            "rcv-settle-mode",
            "source",
            "target",
            "unsettled",
            "incomplete-unsettled",
            "initial-delivery-count",
            "max-message-size",
            "offered-capabilities",
            "desired-capabilities",
            "properties",
        ),
    ),
    0x13: (
        "flow",
        (
            "next-incoming-id",
            "incoming-window",
            "next-outgoing-id",
            "outgoing-window",
            "handle",
            "delivery-count",
            "link-credit",
            "available",
            "drain",
            "echo",
            "properties",
        ),
    ),
    0x14: (
        "transfer",
        (
            "handle",
            "delivery-id",
            "delivery-tag",
            "message-format",
            "settled",
            "more",
            "rcv-settle-mode",
            "state",
            "resume",
            "aborted",
            "batchable",
        ),
    ),
    0x15: ("disposition", ("role", "first", "last", "settled", "state", "batchable")),
    0x16: ("detach", ("handle", "closed", "error")),
    0x17: ("end", ("error",)),
    0x18: ("close", ("error",)),
    0x40: ("sasl-mechanisms", ("sasl-server-mechanisms",)),
    0x41: ("sasl-init", ("mechanism", "initial-response", "hostname")),
    0x42: ("sasl-challenge", ("challenge",)),
    0x43: ("sasl-response", ("response",)),
    0x44: ("sasl-outcome", ("code", "additional-data")),
}
_CODES: Final = {name: code for code, (name, _f) in PERFORMATIVES.items()}
ERROR: Final = 0x1D
SOURCE: Final = 0x28
TARGET: Final = 0x29
ACCEPTED: Final = 0x24
SASL_OUTCOMES: Final = {0: "ok", 1: "auth", 2: "sys", 3: "sys-perm", 4: "sys-temp"}


@dataclass(frozen=True, slots=True)
class Performative:
    """One decoded performative: ``name`` (``open``, ``transfer``, ...) and its fields by spec name."""

    name: str
    fields: dict[str, Any]

    def get(self, field: str, default: Any = None) -> Any:
        """A field's value, ``default`` when absent or null."""
        value = self.fields.get(field)
        return default if value is None else value


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: type (0 AMQP, 1 SASL), channel, performative (``None`` for a heartbeat), payload."""

    type: int
    channel: int
    performative: Performative | None
    payload: bytes = b""


def frame_size(header: bytes, max_frame_size: int) -> int:
    """The total size announced by a frame's first 8 bytes, checked against ``max_frame_size``.

    Called before the rest of the frame is read, so an absurd size is refused without allocating it.
    """
    if len(header) < 8:
        raise Amqp10ProtocolError(f"truncated frame header: {len(header)} of 8 bytes")
    size, doff, _type, _channel = _HEAD.unpack_from(header)
    if size < 8:
        raise Amqp10ProtocolError(f"frame size {size} is below the 8-byte header")
    if size > max_frame_size:
        raise FrameTooLarge(f"frame of {size} bytes exceeds the max-frame-size of {max_frame_size}")
    if doff < 2 or doff * 4 > size:
        raise Amqp10ProtocolError(f"frame data offset {doff} does not fit a frame of {size} bytes")
    return int(size)


def parse_frame(data: bytes, max_frame_size: int = 1 << 32) -> Frame:
    """Decode one whole frame (exactly ``size`` bytes); :class:`Amqp10ProtocolError` when malformed."""
    size = frame_size(data[:8], max_frame_size)
    if size != len(data):
        raise Amqp10ProtocolError(f"frame size field says {size} bytes but {len(data)} were given")
    doff, ftype, channel = data[4], data[5], struct.unpack_from(">H", data, 6)[0]
    if ftype not in (FRAME_AMQP, FRAME_SASL):
        raise Amqp10ProtocolError(f"unknown frame type {ftype}")
    body = doff * 4
    if body == size:
        return Frame(ftype, channel, None)
    try:
        value, end = decode_value(data, body)
    except AmqpDecodeError as exc:
        raise Amqp10ProtocolError(f"bad performative in frame on channel {channel}: {exc}") from None
    return Frame(ftype, channel, performative(value), bytes(data[end:]))


def performative(value: Any) -> Performative:
    """A decoded described list as a :class:`Performative` (unknown descriptors are protocol errors)."""
    if not isinstance(value, Described) or not isinstance(value.descriptor, int):
        raise Amqp10ProtocolError("frame body is not a described performative")
    known = PERFORMATIVES.get(value.descriptor)
    if known is None:
        raise Amqp10ProtocolError(f"unknown performative descriptor 0x{value.descriptor:x}")
    name, names = known
    items = value.value if value.value is not None else []
    if not isinstance(items, list) or len(items) > len(names):
        raise Amqp10ProtocolError(f"{name} performative is not a list of at most {len(names)} fields")
    return Performative(name, dict(zip(names, items, strict=False)))


def encode_frame(
    ftype: int, channel: int, name: str | None, fields: Sequence[Any] = (), payload: bytes = b""
) -> bytes:
    """One frame (doff 2) holding the performative ``name`` with ``fields`` (already typed) + payload."""
    if name is None:
        return _HEAD.pack(8, 2, ftype, channel)
    values = list(fields)
    while values and values[-1] is None:
        values.pop()
    body = encode_value(Described(ULong(_CODES[name]), values)) + payload
    return _HEAD.pack(8 + len(body), 2, ftype, channel) + body


def error_text(error: Any) -> tuple[str | None, str | None]:
    """(condition, description) of an ``error`` field (a described list), or ``(None, None)``."""
    if isinstance(error, Described) and isinstance(error.value, list):
        items = [*error.value, None, None]
        description = " ".join(str(items[1]).split()) if items[1] is not None else None
        if description and len(description) > 300:  # RabbitMQ can put a whole Erlang stack trace here
            description = description[:297] + "..."
        return (str(items[0]) if items[0] is not None else None, description)
    return None, None


def symbols(values: Any) -> list[str]:
    """A symbol or an array of symbols (both are legal for multiple-valued fields) as a list."""
    if values is None:
        return []
    if isinstance(values, list):
        return [str(v) for v in values]
    return [str(values)]


# ---- encoders of the performatives this client sends


def sasl_init(mechanism: str, initial_response: bytes | None, hostname: str | None) -> bytes:
    return encode_frame(FRAME_SASL, 0, "sasl-init", [Symbol(mechanism), initial_response, hostname])


def open_frame(
    container_id: str, hostname: str, max_frame_size: int, channel_max: int, idle_time_out_ms: int | None
) -> bytes:
    return encode_frame(
        FRAME_AMQP,
        0,
        "open",
        [
            container_id,
            hostname,
            UInt(max_frame_size),
            UShort(channel_max),
            None if idle_time_out_ms is None else UInt(idle_time_out_ms),
        ],
    )


def begin_frame(channel: int, next_outgoing_id: int, incoming_window: int, outgoing_window: int) -> bytes:
    return encode_frame(
        FRAME_AMQP,
        channel,
        "begin",
        [None, UInt(next_outgoing_id), UInt(incoming_window), UInt(outgoing_window)],
    )


def terminus(code: int, address: str | None) -> Described:
    """A source (0x28) or target (0x29) with just an address."""
    return Described(ULong(code), [address])


def attach_frame(
    channel: int,
    name: str,
    handle: int,
    *,
    receiver: bool,
    source: Described,
    target: Described,
    snd_settle_mode: int,
    properties: dict[Any, Any] | None = None,
    initial_delivery_count: int | None = None,
) -> bytes:
    return encode_frame(
        FRAME_AMQP,
        channel,
        "attach",
        [
            name,
            UInt(handle),
            receiver,
            UByte(snd_settle_mode),
            UByte(0),
            source,
            target,
            None,
            None,
            None if initial_delivery_count is None else UInt(initial_delivery_count),
            None,
            None,
            None,
            properties,
        ],
    )


def flow_frame(
    channel: int,
    *,
    next_incoming_id: int | None,
    incoming_window: int,
    next_outgoing_id: int,
    outgoing_window: int,
    handle: int | None = None,
    delivery_count: int | None = None,
    link_credit: int | None = None,
) -> bytes:
    return encode_frame(
        FRAME_AMQP,
        channel,
        "flow",
        [
            None if next_incoming_id is None else UInt(next_incoming_id),
            UInt(incoming_window),
            UInt(next_outgoing_id),
            UInt(outgoing_window),
            None if handle is None else UInt(handle),
            None if delivery_count is None else UInt(delivery_count),
            None if link_credit is None else UInt(link_credit),
        ],
    )


def transfer_frame(
    channel: int,
    handle: int,
    delivery_id: int | None,
    delivery_tag: bytes | None,
    *,
    settled: bool,
    more: bool,
    payload: bytes,
) -> bytes:
    first = delivery_id is not None
    return encode_frame(
        FRAME_AMQP,
        channel,
        "transfer",
        [
            UInt(handle),
            UInt(delivery_id) if delivery_id is not None else None,
            delivery_tag if first else None,
            UInt(0) if first else None,
            settled if first else None,
            more,
        ],
        payload,
    )


def disposition_frame(
    channel: int, first: int, last: int | None, *, receiver: bool, settled: bool, state: Described | None
) -> bytes:
    return encode_frame(
        FRAME_AMQP,
        channel,
        "disposition",
        [receiver, UInt(first), None if last is None else UInt(last), settled, state],
    )


def accepted() -> Described:
    return Described(ULong(ACCEPTED), [])


def detach_frame(channel: int, handle: int, *, closed: bool = True) -> bytes:
    return encode_frame(FRAME_AMQP, channel, "detach", [UInt(handle), closed])


def end_frame(channel: int) -> bytes:
    return encode_frame(FRAME_AMQP, channel, "end", [])


def close_frame(condition: str | None = None, description: str | None = None) -> bytes:
    error = None if condition is None else Described(ULong(ERROR), [Symbol(condition), description])
    return encode_frame(FRAME_AMQP, 0, "close", [error])


def symbol_array(names: Sequence[str]) -> Array:
    return Array([Symbol(n) for n in names], 0xA3 if all(len(n) < 256 for n in names) else 0xB3)
