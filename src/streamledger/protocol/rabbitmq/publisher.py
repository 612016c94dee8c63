"""Publishing with confirms: DeclarePublisher, batched Publish v1 frames, wait for every confirm.

Frames are cut at ``batch_size`` messages or at the negotiated frame max, whichever comes first
(4.3.5+ closes the connection on a bigger frame). At most ``window`` messages are left
unconfirmed before we read confirms, so neither side's socket buffers fill up and deadlock.

Deduplication (spec 7.1): with a ``publisher_ref`` the broker keeps the last publishing id per
(reference, stream) and drops - but still confirms - any id at or below it. Without an explicit
``first_publishing_id`` we continue after QueryPublisherSequence; passing the same
``first_publishing_id`` again makes a retried publish idempotent.

Filter values (spec 7.2, RabbitMQ 3.13+): a message may carry a filter value, from which the broker
builds each chunk's Bloom filter so that filtering subscribers skip chunks. Frames with a filter value
are Publish v2 (every entry then carries the field, -1 for none); frames without stay v1. The value
comes from an :class:`OutboundMessage`'s own ``filter_value`` or from the application property named by
``filter_property`` (as the Java client's filter-value extractor), so a reader can post-filter exactly
on what it decodes.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.amqp import encode_message
from streamledger.protocol.rabbitmq.connection import Connection, raise_for_code
from streamledger.protocol.rabbitmq.errors import (
    FrameTooLarge,
    InvalidRequest,
    PublishRejected,
    StreamTimeout,
    UnsupportedByBroker,
)
from streamledger.protocol.rabbitmq.wire import (
    PUBLISH_ENTRY,
    PUBLISH_HEAD,
    Reader,
    Writer,
    declare_publisher_frame,
)

_CONFIRM_HEAD: Final = struct.Struct(">BI")
_MAX_ENTRY: Final = 0x7FFFFFFF
_NO_FILTER: Final = b"\xff\xff"  # a v2 entry without a filter value (string of length -1)
_FILTER_LENGTH: Final = struct.Struct(">h")


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """One message to publish with its own application properties (merged over the call's) and,
    optionally, its own filter value (RabbitMQ 3.13+ stream filtering)."""

    body: bytes
    application_properties: Mapping[str, Any] | None = None
    filter_value: str | None = None


def supports_filtering(conn: Connection) -> bool:
    """Whether the broker takes Publish v2 (filter values) and filtering subscriptions: 3.13+, known
    from ExchangeCommandVersions (Publish max version 2) or, before 3.11, from the version."""
    if conn.server_commands is not None:
        versions = conn.server_commands.get(c.PUBLISH)
        return versions is not None and versions[1] >= 2
    version = conn.version_tuple
    return version is not None and version >= (3, 13)


def _filter_of(props: Mapping[str, Any] | None, name: str | None) -> str | None:
    """The filter value a message's application property gives (None: the message is unfiltered)."""
    if name is None or not props:
        return None
    value = props.get(name)
    if value is None:
        return None
    from streamledger.protocol.amqp10.text import stringify

    return stringify(value)


@dataclass(slots=True)
class PublishResult:
    """Outcome of one :meth:`StreamClient.publish` call."""

    published: int = 0
    confirmed: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)  # (publishing id, code name)
    first_publishing_id: int | None = None
    last_publishing_id: int | None = None


def publish(
    conn: Connection,
    publisher_id: int,
    stream: str,
    bodies: Iterable[bytes | OutboundMessage],
    *,
    amqp: bool = True,
    publisher_ref: str | None = None,
    batch_size: int = 500,
    application_properties: dict[str, Any] | None = None,
    first_publishing_id: int | None = None,
    timeout: float = 10.0,
    window: int = 20_000,
    filter_property: str | None = None,
) -> PublishResult:
    """Publish ``bodies`` (AMQP 1.0 data sections, or raw records; bytes or :class:`OutboundMessage`)
    and wait for all confirms.

    ``filter_property``: each message's filter value is the (stringified) value of this application
    property, when the message has it. A broker without filtering (before 3.13) is refused before
    anything is sent when ``filter_property`` is given, else at the first message with a filter value.
    Raises :class:`PublishRejected` (with ``.result``) if the broker answered any message with
    PublishError.
    """
    if not stream:
        raise InvalidRequest("stream name must be a non-empty string")
    if not isinstance(batch_size, int) or not 1 <= batch_size <= 65_535:
        raise InvalidRequest(f"batch_size must be in 1..65535, not {batch_size!r}")
    ref = publisher_ref or ""
    if len(ref.encode("utf-8")) > 255:
        raise InvalidRequest("publisher_ref must be at most 255 UTF-8 bytes")
    if first_publishing_id is not None and first_publishing_id < 0:
        raise InvalidRequest("first_publishing_id must not be negative")
    if filter_property is not None and not filter_property:
        raise InvalidRequest("filter_property must be a non-empty application property name")
    if filter_property is not None and not supports_filtering(conn):
        raise _no_filtering(conn, stream)

    corr = conn.next_corr()
    frame = declare_publisher_frame(corr, publisher_id, ref, stream)
    code, _ = conn.request(c.DECLARE_PUBLISHER, corr, frame, stream=stream)
    raise_for_code(code, c.DECLARE_PUBLISHER, stream)

    result = PublishResult()
    try:
        if first_publishing_id is not None:
            next_id = first_publishing_id
        elif ref:
            corr = conn.next_corr()
            frame = Writer(c.QUERY_PUBLISHER_SEQUENCE).u32(corr).string(ref).string(stream).frame()
            code, r = conn.request(c.QUERY_PUBLISHER_SEQUENCE, corr, frame, stream=stream)
            raise_for_code(code, c.QUERY_PUBLISHER_SEQUENCE, stream)
            next_id = r.u64() + 1
        else:
            next_id = 1
        _send_all(conn, publisher_id, stream, bodies, result, next_id, amqp=amqp,
                  batch_size=batch_size, app_props=application_properties, timeout=timeout, window=window,
                  filter_property=filter_property)
    finally:
        conn.on_publish_confirm = None
        conn.on_publish_error = None
        if not conn.closed:
            corr = conn.next_corr()
            try:
                conn.request(c.DELETE_PUBLISHER, corr,
                             Writer(c.DELETE_PUBLISHER).u32(corr).u8(publisher_id).frame(), stream=stream)
            except Exception:
                pass
    if result.errors:
        raise PublishRejected(stream, result.errors, result)
    return result


def _send_all(
    conn: Connection,
    publisher_id: int,
    stream: str,
    bodies: Iterable[bytes | OutboundMessage],
    result: PublishResult,
    next_id: int,
    *,
    amqp: bool,
    batch_size: int,
    app_props: dict[str, Any] | None,
    timeout: float,
    window: int,
    filter_property: str | None = None,
) -> None:
    def on_confirm(_version: int, buf: bytearray, pos: int, end: int) -> None:
        pid, count = _CONFIRM_HEAD.unpack_from(buf, pos)
        if pid == publisher_id:
            if 5 + 8 * count > end - pos:
                from streamledger.protocol.rabbitmq.errors import ProtocolError

                raise ProtocolError("truncated PublishConfirm frame")
            result.confirmed += count

    def on_error(_version: int, buf: bytearray, pos: int, end: int) -> None:
        r = Reader(buf, pos, end, "PublishError")
        pid = r.u8()
        for _ in range(r.count(10)):
            pub_id, code = r.u64(), r.u16()
            if pid == publisher_id:
                result.errors.append((pub_id, c.code_name(code)))

    conn.on_publish_confirm = on_confirm
    conn.on_publish_error = on_error
    limit = conn.frame_max or c.DEFAULT_FRAME_MAX
    header_size = 13  # size(4) key(2) version(2) publisher(1) count(4)
    entries: list[tuple[int, bytes | None, bytes]] = []  # (publishing id, filter value, message)
    filtered = False  # whether the frame being built has a filter value (then it is Publish v2)
    size = header_size  # counted as v2 (2 + filter bytes more per entry): a v1 frame stays under too
    result.first_publishing_id = next_id
    checked = filter_property is not None  # the broker's support was checked by publish()

    def flush() -> None:
        nonlocal entries, filtered, size, checked
        if not entries:
            return
        if filtered and not checked:
            if not supports_filtering(conn):
                raise _no_filtering(conn, stream)
            checked = True
        parts: list[bytes] = []
        for pid, fv, message in entries:
            if filtered:
                parts.append(pack_id(pid))
                parts.append(_NO_FILTER if fv is None else _FILTER_LENGTH.pack(len(fv)) + fv)
                parts.append(pack_size(len(message)))
            else:
                parts.append(pack(pid, len(message)))
            parts.append(message)
        body = b"".join(parts)
        conn.send(PUBLISH_HEAD.pack(9 + len(body), c.PUBLISH, 2 if filtered else 1, publisher_id,
                                    len(entries)) + body)
        result.published += len(entries)
        entries, filtered, size = [], False, header_size
        if result.published - result.confirmed - len(result.errors) > window:
            _pump(conn, result, stream, timeout, target=window // 2)

    pack = PUBLISH_ENTRY.pack
    pack_id = struct.Struct(">Q").pack
    pack_size = struct.Struct(">I").pack
    for item in bodies:
        if isinstance(item, OutboundMessage):
            props = app_props if item.application_properties is None else {**(app_props or {}),
                                                                           **item.application_properties}
            fv = item.filter_value if item.filter_value is not None else _filter_of(props, filter_property)
            body = item.body
        else:
            props, body = app_props, item
            fv = _filter_of(props, filter_property)
        message = encode_message(body, application_properties=props) if amqp else bytes(body)
        fv_bytes = None if fv is None else fv.encode("utf-8")
        if fv_bytes is not None and len(fv_bytes) > 0x7FFF:
            raise InvalidRequest(f"stream {stream!r}: a filter value of {len(fv_bytes)} bytes is too long")
        entry_size = 14 + len(message) + (len(fv_bytes) if fv_bytes else 0)
        if len(message) > _MAX_ENTRY or header_size + entry_size > limit:
            raise FrameTooLarge(
                f"message of {len(message)} bytes does not fit in one frame (frame max {limit} bytes)"
            )
        if len(entries) >= batch_size or size + entry_size > limit:
            flush()
        entries.append((next_id, fv_bytes, message))
        filtered = filtered or fv_bytes is not None
        result.last_publishing_id = next_id
        next_id += 1
        size += entry_size
    flush()
    if result.published == 0:
        result.first_publishing_id = None
    _pump(conn, result, stream, timeout, target=0)


def _no_filtering(conn: Connection, stream: str) -> UnsupportedByBroker:
    return UnsupportedByBroker("Publish v2 (filter values)", conn.server_version,
                               f"stream {stream!r}: stream filtering needs RabbitMQ 3.13 or later")


def _pump(conn: Connection, result: PublishResult, stream: str, timeout: float, *, target: int) -> None:
    """Read frames until at most ``target`` messages are unanswered; the deadline moves on progress."""
    deadline = time.monotonic() + timeout
    answered = result.confirmed + len(result.errors)
    while result.published - result.confirmed - len(result.errors) > target:
        try:
            key, version, pos, end = conn.read_frame(deadline, "publish confirms")
        except StreamTimeout:
            missing = result.published - result.confirmed - len(result.errors)
            raise StreamTimeout(
                f"publish to stream {stream!r}: {missing} message(s) still unconfirmed after {timeout:g}s"
            ) from None
        conn.dispatch(key, version, pos, end, waiting_for="publish confirms")
        now_answered = result.confirmed + len(result.errors)
        if now_answered != answered:
            answered = now_answered
            deadline = time.monotonic() + timeout
