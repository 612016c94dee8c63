"""RabbitMQ Streams client: the package face (docs/interfaces.md); the modules behind it are private.

>>> with StreamClient.connect("rabbitmq-stream://guest:guest@127.0.0.1:5552/") as client:
...     client.create_stream("events", exists_ok=True)
...     for batch in client.read_range("events", 0, client.committed_tail("events")):
...         ...
"""

from __future__ import annotations

from streamledger.protocol.rabbitmq.client import StreamClient
from streamledger.protocol.rabbitmq.errors import (
    AccessRefused,
    AuthenticationError,
    ChunkFormatError,
    CodecUnavailable,
    ConnectionClosed,
    ConnectionFailed,
    CrcMismatch,
    DataLossError,
    FrameTooLarge,
    InvalidRequest,
    OffsetOutOfRange,
    PreconditionFailed,
    ProtocolError,
    PublishRejected,
    ResponseError,
    StoreNotVerified,
    StreamAlreadyExists,
    StreamError,
    StreamNotAvailable,
    StreamNotFound,
    StreamTimeout,
    TlsError,
    UnsupportedByBroker,
)
from streamledger.protocol.rabbitmq.offsets import OffsetSpec
from streamledger.protocol.rabbitmq.publisher import OutboundMessage, PublishResult
from streamledger.protocol.rabbitmq.reader import ReadStats
from streamledger.protocol.rabbitmq.records import BufferBatch, RecordBatch
from streamledger.protocol.rabbitmq.stats import StreamMetadata, StreamStats
from streamledger.protocol.rabbitmq.url import ConnectionParams, parse_url

__all__ = [
    "AccessRefused",
    "AuthenticationError",
    "BufferBatch",
    "ChunkFormatError",
    "CodecUnavailable",
    "ConnectionClosed",
    "ConnectionFailed",
    "ConnectionParams",
    "CrcMismatch",
    "DataLossError",
    "FrameTooLarge",
    "InvalidRequest",
    "OffsetOutOfRange",
    "OffsetSpec",
    "OutboundMessage",
    "PreconditionFailed",
    "ProtocolError",
    "PublishRejected",
    "PublishResult",
    "ReadStats",
    "RecordBatch",
    "ResponseError",
    "StoreNotVerified",
    "StreamAlreadyExists",
    "StreamClient",
    "StreamError",
    "StreamMetadata",
    "StreamNotAvailable",
    "StreamNotFound",
    "StreamStats",
    "StreamTimeout",
    "TlsError",
    "UnsupportedByBroker",
    "parse_url",
]
