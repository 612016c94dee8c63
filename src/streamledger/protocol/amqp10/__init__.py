"""A lean AMQP 1.0 client for RabbitMQ 4.x topology management (the ``/management`` node).

Written from the AMQP 1.0 spec, amqp10-management.md and amqp10-message.md; it reuses the project's
AMQP 1.0 type codec (:mod:`.codec`). Entry point: :class:`Management` (``Management.connect(url)``);
the wire layer is :class:`Amqp10Connection`. See docs/amqp10.md.
"""

from streamledger.protocol.amqp10.connection import MANAGEMENT_NODE, Amqp10Connection, Response
from streamledger.protocol.amqp10.errors import (
    AccessRefused,
    Amqp10ConnectionError,
    Amqp10Error,
    Amqp10ProtocolError,
    Amqp10Timeout,
    Amqp10TlsError,
    AuthenticationFailed,
    BadRequest,
    Conflict,
    FrameTooLarge,
    InvalidUrl,
    ManagementError,
    NotAmqp10Broker,
    NotFound,
    RemoteClosed,
    RequestTooLarge,
)
from streamledger.protocol.amqp10.management import (
    Management,
    QueueInfo,
    StreamOptions,
    partition_names,
    segment,
)
from streamledger.protocol.amqp10.url import Amqp10Params, parse_amqp_url

__all__ = [
    "MANAGEMENT_NODE", "AccessRefused", "Amqp10Connection", "Amqp10ConnectionError", "Amqp10Error",
    "Amqp10Params", "Amqp10ProtocolError", "Amqp10Timeout", "Amqp10TlsError", "AuthenticationFailed",
    "BadRequest", "Conflict", "FrameTooLarge", "InvalidUrl", "Management", "ManagementError",
    "NotAmqp10Broker", "NotFound", "QueueInfo", "RemoteClosed", "RequestTooLarge", "Response", "StreamOptions",
    "parse_amqp_url", "partition_names", "segment",
]
