"""A lean AMQP 1.0 client for RabbitMQ 4.x topology management (the ``/management`` node).

Written from the AMQP 1.0 spec, amqp10-management.md and amqp10-message.md; it reuses the project's
AMQP 1.0 type codec (:mod:`.codec`). Entry point: :class:`Management` (``Management.connect(url)``);
the wire layer is :class:`Amqp10Connection`. See docs/amqp10.md.

The names load lazily (PEP 562): the stream client imports the shared codec (:mod:`.codec`), and that
must not pull in the AMQP 1.0 client as well.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "MANAGEMENT_NODE": "connection", "Amqp10Connection": "connection", "Response": "connection",
    "Management": "management", "QueueInfo": "management", "StreamOptions": "management",
    "partition_names": "management", "segment": "management",
    "Amqp10Params": "url", "parse_amqp_url": "url",
}


def __getattr__(name: str) -> Any:
    """Import the client's modules on first use of one of their names (the codec stays light)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_HOMES.get(name, 'errors')}")
    return getattr(module, name)


__all__ = [
    "MANAGEMENT_NODE", "AccessRefused", "Amqp10Connection", "Amqp10ConnectionError", "Amqp10Error",
    "Amqp10Params", "Amqp10ProtocolError", "Amqp10Timeout", "Amqp10TlsError", "AuthenticationFailed",
    "BadRequest", "Conflict", "FrameTooLarge", "InvalidUrl", "Management", "ManagementError",
    "NotAmqp10Broker", "NotFound", "PartitionsUnknown", "QueueInfo", "RemoteClosed", "RequestTooLarge",
    "Response", "StreamOptions", "parse_amqp_url", "partition_names", "segment",
]
