"""Typed errors of the RabbitMQ Streams client.

One hierarchy for the whole client, so callers can catch "the broker or the bytes said no"
(:class:`StreamError`) separately from programming errors. The data-plane codecs raise the
:class:`ProtocolError` family; the connection layer extends this module with response-code errors.
"""

from __future__ import annotations

from streamledger import offsets
from streamledger.errors import StreamledgerError
from streamledger.protocol.amqp10.codec import errors as _codec_errors


class StreamError(StreamledgerError):
    """Base of every deliberate error of the RabbitMQ Streams client."""


class ProtocolError(StreamError):
    """Bytes received from the broker (or handed to a codec) do not follow the protocol."""


class ChunkFormatError(ProtocolError):
    """An Osiris chunk is truncated, inconsistent or of an unknown format."""


class CrcMismatch(ChunkFormatError):
    """The CRC-32 of a chunk's data section differs from the one in its header."""


class AmqpDecodeError(ProtocolError, _codec_errors.AmqpDecodeError):
    """Bytes are not a valid AMQP 1.0 value or message (also the shared codec's error type)."""


class CodecUnavailable(StreamError):
    """A sub-batch uses a compression codec whose Python library is not installed."""


class FrameTooLarge(ProtocolError):
    """A frame is larger than the negotiated frame max."""


# -- connection layer (added by the client work) ------------------------------------------------


class InvalidRequest(StreamError, ValueError):
    """Arguments rejected on the client side before anything was sent (e.g. start > end)."""


class ConnectionFailed(StreamError):
    """The TCP/TLS connection could not be made, or broke; never carries credentials."""


class TlsError(ConnectionFailed):
    """The TLS handshake failed (wrong CA, bad client certificate); retrying cannot help."""


class ConnectionClosed(ConnectionFailed):
    """The broker closed the connection (with a Close frame, or with a bare EOF)."""

    def __init__(self, message: str, *, code: int | None = None, code_name: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.code_name = code_name


class StreamTimeout(StreamError, TimeoutError):
    """A request or a read did not complete within its time limit."""


class ResponseError(StreamError):
    """The broker answered a request with a response code other than OK."""

    def __init__(self, command: str, code: int, code_name: str, stream: str | None = None) -> None:
        where = f" on stream {stream!r}" if stream is not None else ""
        super().__init__(f"{command}{where} failed: {code_name} (0x{code:02x})")
        self.command = command
        self.code = code
        self.code_name = code_name
        self.stream = stream


class StreamNotFound(ResponseError):
    """The stream (or super stream) does not exist (code 0x02)."""


class StreamAlreadyExists(ResponseError):
    """The stream (or super stream) already exists (code 0x05)."""


class StreamNotAvailable(ResponseError):
    """The stream exists but has no leader right now (code 0x06); worth retrying."""


class AccessRefused(ResponseError):
    """The user lacks permission for this operation (code 0x10)."""


class PreconditionFailed(ResponseError):
    """The broker rejected the request's arguments (code 0x11)."""


class AuthenticationError(ResponseError):
    """SASL authentication or virtual-host access failed; the message never names the password."""


class PublishRejected(StreamError):
    """The broker answered some published messages with PublishError."""

    def __init__(self, stream: str, errors: list[tuple[int, str]], result: object | None = None) -> None:
        first_id, first_code = errors[0]
        super().__init__(
            f"publish to stream {stream!r}: {len(errors)} message(s) rejected "
            f"(first: publishing id {first_id}, {first_code})"
        )
        self.stream = stream
        self.errors = errors
        self.result = result  # the PublishResult, with what was confirmed


class UnsupportedByBroker(StreamError):
    """The broker's version does not have a command; raised instead of sending it."""

    def __init__(self, command: str, broker_version: str | None, detail: str = "") -> None:
        version = broker_version or "unknown version"
        extra = f"; {detail}" if detail else ""
        super().__init__(f"{command} is not supported by RabbitMQ {version}{extra}")
        self.command = command
        self.broker_version = broker_version


class DataLossError(StreamError, offsets.DataLossError):
    """The requested start offset is below the first offset still retained (retention removed it);
    the log-neutral :class:`streamledger.offsets.DataLossError` in the stream client's family."""


class StoreNotVerified(StreamTimeout, offsets.OffsetNotVerified):
    """A stored offset did not read back within the timeout (the verified-store contract)."""


class OffsetOutOfRange(StreamError):
    """A range end lies beyond the stream's committed tail, so reading it would wait for data."""

    def __init__(self, stream: str, end: int, tail: int) -> None:
        super().__init__(
            f"stream {stream!r}: range end {end} is beyond the committed tail {tail} "
            "(the end is exclusive; plan ranges up to committed_tail())"
        )
        self.stream = stream
        self.end = end
        self.tail = tail
