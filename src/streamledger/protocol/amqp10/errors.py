"""Typed errors of the AMQP 1.0 client.

One family (:class:`Amqp10Error`) so callers can catch "the broker or the bytes said no" apart from
programming errors. Management answers that are not 2xx raise :class:`ManagementError` (or a subclass
per status), carrying the HTTP-like ``status`` and the broker's own ``description``. No message ever
contains a password: connection errors name the redacted URL.
"""

from __future__ import annotations

from streamledger.errors import StreamledgerError


class Amqp10Error(StreamledgerError):
    """Base of every deliberate error of the AMQP 1.0 client."""


class InvalidUrl(Amqp10Error, ValueError):
    """The broker URL (or an argument) was rejected before anything was sent."""


class RequestTooLarge(Amqp10Error, ValueError):
    """A management request does not fit one frame of the broker's max-frame-size (refused unsent)."""


class Amqp10ProtocolError(Amqp10Error):
    """Bytes received do not follow AMQP 1.0 (bad header, bad frame, frame above the agreed size)."""


class FrameTooLarge(Amqp10ProtocolError):
    """A frame announced a size above the negotiated max-frame-size (refused before allocation)."""


class Amqp10ConnectionError(Amqp10Error):
    """The TCP/TLS connection could not be made, or broke."""


class Amqp10TlsError(Amqp10ConnectionError):
    """The TLS handshake failed (unknown CA, bad client certificate)."""


class Amqp10Timeout(Amqp10ConnectionError):
    """The broker did not answer within the timeout."""


class AuthenticationFailed(Amqp10Error):
    """SASL ended with a non-ok outcome (wrong credentials, mechanism not offered)."""


class NotAmqp10Broker(Amqp10Error):
    """The peer does not speak AMQP 1.0 there (e.g. a RabbitMQ 3.x AMQP 0-9-1 listener)."""


class RemoteClosed(Amqp10Error):
    """The broker closed the connection, session or link, with its error condition and description."""

    def __init__(self, message: str, *, condition: str | None = None, description: str | None = None) -> None:
        super().__init__(message)
        self.condition = condition
        self.description = description


class PartitionsUnknown(Amqp10Error):
    """A super stream's partitions cannot be named over AMQP 1.0 (the node lists no bindings)."""


class ManagementError(Amqp10Error):
    """A ``/management`` request answered with a non-2xx status."""

    def __init__(self, message: str, *, status: int, description: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.description = description


class BadRequest(ManagementError):
    """400: the broker rejected the request's body or arguments."""


class AccessRefused(ManagementError):
    """401/403: the user lacks the permission for this operation."""


class NotFound(ManagementError):
    """404: no such queue, exchange or binding."""


class Conflict(ManagementError):
    """409: the resource exists with other properties (PRECONDITION_FAILED), or is locked."""


def management_error(status: int, what: str, description: str | None) -> ManagementError:
    """The :class:`ManagementError` subclass for ``status``, with a one-line message."""
    cls: type[ManagementError] = {
        400: BadRequest,
        401: AccessRefused,
        403: AccessRefused,
        404: NotFound,
        409: Conflict,
    }.get(status, ManagementError)
    detail = f": {description}" if description else ""
    return cls(f"{what}: {status}{detail}", status=status, description=description)
