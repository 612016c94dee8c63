"""mewbase event-server client, written from ``specs/mewbase.md`` and verified against an emulator.

The package face: :class:`MewbaseClient` (publish with confirms and transactions, subscribe and
acknowledge, query binders, exact bounded reads) and :class:`MewbaseLog` (a channel as an
offset-addressed log: the calls a bounded batch makes of its source). The layers are one module each:
``frames`` (BSON frames with hard limits), ``connection`` (one socket, rID correlation),
``client``, ``log``, ``url``, ``errors``, and ``conventions`` (every choice the draft leaves open).
This package knows nothing of Airflow, Dagster or Spark.
"""

from streamledger.protocol.mewbase.client import MewbaseClient, Subscription, Transaction
from streamledger.protocol.mewbase.errors import (
    AuthenticationFailed,
    BinderNotFound,
    ChannelNotFound,
    ConnectionClosed,
    EventTooLarge,
    FrameError,
    FrameLengthError,
    InvalidRequest,
    MewbaseConnectionError,
    MewbaseError,
    MewbaseProtocolError,
    MewbaseTimeout,
    NotAuthorised,
    OffsetOutOfRange,
    ServerError,
    StoreNotVerified,
    TransactionError,
    UnsupportedVersion,
)
from streamledger.protocol.mewbase.events import Event, EventBatch
from streamledger.protocol.mewbase.log import ChannelInfo, MewbaseLog
from streamledger.protocol.mewbase.url import MewbaseParams, parse_url

__all__ = [
    "AuthenticationFailed",
    "BinderNotFound",
    "ChannelInfo",
    "ChannelNotFound",
    "ConnectionClosed",
    "Event",
    "EventBatch",
    "EventTooLarge",
    "FrameError",
    "FrameLengthError",
    "InvalidRequest",
    "MewbaseClient",
    "MewbaseConnectionError",
    "MewbaseError",
    "MewbaseLog",
    "MewbaseParams",
    "MewbaseProtocolError",
    "MewbaseTimeout",
    "NotAuthorised",
    "OffsetOutOfRange",
    "ServerError",
    "StoreNotVerified",
    "Subscription",
    "Transaction",
    "TransactionError",
    "UnsupportedVersion",
    "parse_url",
]
