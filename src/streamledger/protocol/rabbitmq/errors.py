"""Typed errors of the RabbitMQ Streams client.

One hierarchy for the whole client, so callers can catch "the broker or the bytes said no"
(:class:`StreamError`) separately from programming errors. The data-plane codecs raise the
:class:`ProtocolError` family; the connection layer extends this module with response-code errors.
"""

from __future__ import annotations

from streamledger.errors import StreamledgerError


class StreamError(StreamledgerError):
    """Base of every deliberate error of the RabbitMQ Streams client."""


class ProtocolError(StreamError):
    """Bytes received from the broker (or handed to a codec) do not follow the protocol."""


class ChunkFormatError(ProtocolError):
    """An Osiris chunk is truncated, inconsistent or of an unknown format."""


class CrcMismatch(ChunkFormatError):
    """The CRC-32 of a chunk's data section differs from the one in its header."""


class AmqpDecodeError(ProtocolError):
    """Bytes are not a valid AMQP 1.0 value or message."""


class CodecUnavailable(StreamError):
    """A sub-batch uses a compression codec whose Python library is not installed."""


class FrameTooLarge(ProtocolError):
    """A frame is larger than the negotiated frame max."""
