"""Publishing with confirms: DeclarePublisher, batched Publish v1 frames, wait for every confirm.

Frames are cut at ``batch_size`` messages or at the negotiated frame max, whichever comes first
(4.3.5+ closes the connection on a bigger frame). At most ``window`` messages are left
unconfirmed before we read confirms, so neither side's socket buffers fill up and deadlock.

Deduplication (spec 7.1): with a ``publisher_ref`` the broker keeps the last publishing id per
(reference, stream) and drops - but still confirms - any id at or below it. Without an explicit
``first_publishing_id`` we continue after QueryPublisherSequence; passing the same
``first_publishing_id`` again makes a retried publish idempotent.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable
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
    bodies: Iterable[bytes],
    *,
    amqp: bool = True,
    publisher_ref: str | None = None,
    batch_size: int = 500,
    application_properties: dict[str, Any] | None = None,
    first_publishing_id: int | None = None,
    timeout: float = 10.0,
    window: int = 20_000,
) -> PublishResult:
    """Publish ``bodies`` (AMQP 1.0 data sections, or raw records) and wait for all confirms.

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
                  batch_size=batch_size, app_props=application_properties, timeout=timeout, window=window)
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
    bodies: Iterable[bytes],
    result: PublishResult,
    next_id: int,
    *,
    amqp: bool,
    batch_size: int,
    app_props: dict[str, Any] | None,
    timeout: float,
    window: int,
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
    parts: list[bytes] = []
    count = 0
    size = header_size
    result.first_publishing_id = next_id

    def flush() -> None:
        nonlocal parts, count, size
        if count:
            head = PUBLISH_HEAD.pack(size - 4, c.PUBLISH, 1, publisher_id, count)
            conn.send(head + b"".join(parts))
            result.published += count
            parts, count, size = [], 0, header_size
            if result.published - result.confirmed - len(result.errors) > window:
                _pump(conn, result, stream, timeout, target=window // 2)

    pack = PUBLISH_ENTRY.pack
    for body in bodies:
        message = encode_message(body, application_properties=app_props) if amqp else bytes(body)
        entry_size = 12 + len(message)
        if len(message) > _MAX_ENTRY or header_size + entry_size > limit:
            raise FrameTooLarge(
                f"message of {len(message)} bytes does not fit in one frame (frame max {limit} bytes)"
            )
        if count >= batch_size or size + entry_size > limit:
            flush()
        parts.append(pack(next_id, len(message)))
        parts.append(message)
        result.last_publishing_id = next_id
        next_id += 1
        count += 1
        size += entry_size
    flush()
    if result.published == 0:
        result.first_publishing_id = None
    _pump(conn, result, stream, timeout, target=0)


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
