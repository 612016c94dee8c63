"""Typed errors of the mewbase client.

Callers need to tell apart "the bytes on the wire were wrong" (:class:`FrameError`), "the peer broke
the protocol" (:class:`MewbaseProtocolError`), "nobody answered in time" (:class:`MewbaseTimeout`),
"the connection is gone" (:class:`MewbaseConnectionError`) and "the server said no"
(:class:`ServerError`, carrying the server's ``errCode`` and ``errMsg``). Every ``str(err)`` is one
line and never contains a password.
"""

from __future__ import annotations

from streamledger.errors import StreamledgerError
from streamledger.offsets import OffsetNotVerified
from streamledger.protocol.mewbase import conventions as cv

__all__ = [
    "AuthenticationFailed",
    "BinderNotFound",
    "ChannelNotFound",
    "ConnectionClosed",
    "EventTooLarge",
    "FrameError",
    "FrameLengthError",
    "InvalidRequest",
    "MewbaseConnectionError",
    "MewbaseError",
    "MewbaseProtocolError",
    "MewbaseTimeout",
    "NotAuthorised",
    "OffsetOutOfRange",
    "ServerError",
    "StoreNotVerified",
    "TransactionError",
    "UnsupportedVersion",
    "server_error",
]


def one_line(text: str) -> str:
    """Collapse whitespace so a server-supplied message cannot break the one-line rule."""
    return " ".join(str(text).split())


class MewbaseError(StreamledgerError):
    """Base of every deliberate mewbase client error."""


class InvalidRequest(MewbaseError, ValueError):
    """A caller-supplied value (URL, channel, range, limit) is unusable; the message names it."""


class MewbaseProtocolError(MewbaseError):
    """The server sent something the protocol does not allow (unknown frame, missing field, bad order)."""


class FrameError(MewbaseProtocolError):
    """The byte stream is not a sequence of valid ``{type, frame}`` BSON documents."""


class FrameLengthError(FrameError):
    """A frame's length prefix is below 5 or above the configured maximum (checked before reading on)."""

    def __init__(self, length: int, limit: int) -> None:
        self.length = length
        self.limit = limit
        super().__init__(f"frame length {length} outside the accepted 5..{limit} bytes")


class MewbaseConnectionError(MewbaseError):
    """The TCP connection could not be opened or was lost."""


class ConnectionClosed(MewbaseConnectionError):
    """The server closed the connection (or it was closed after an earlier failure)."""


class MewbaseTimeout(MewbaseError):
    """A wait (response, event, query result) ran out of time."""


class OffsetOutOfRange(MewbaseError):
    """A position lies beyond what the server holds (a bounded read's end, an acknowledgement)."""


class StoreNotVerified(MewbaseError, OffsetNotVerified):
    """The acknowledged position read back from the server differs from the one stored (the
    verified-store contract of :mod:`streamledger.offsets`)."""


class ServerError(MewbaseError):
    """The server answered ``ok: false``; carries its ``errCode`` and ``errMsg``."""

    def __init__(
        self, operation: str, err_code: str | None, err_msg: str | None, *, message: str | None = None
    ) -> None:
        self.operation = operation
        self.err_code = err_code
        self.err_msg = err_msg
        code = err_code if err_code is not None else "no errCode"
        detail = f": {one_line(err_msg)}" if err_msg else ""
        super().__init__(message or f"{operation} refused by the server: {code}{detail}")


class AuthenticationFailed(ServerError):
    """CONNECT was refused for the credentials (the server closes the connection)."""


class UnsupportedVersion(ServerError):
    """CONNECT was refused for the client version (the server closes the connection)."""


class NotAuthorised(ServerError):
    """The user may not perform this operation."""


class ChannelNotFound(ServerError):
    """The channel does not exist on the server."""


class BinderNotFound(ServerError):
    """The binder does not exist on the server."""


class TransactionError(ServerError):
    """STARTTX with a transaction already open, or COMMITTX/ABORTTX without one."""


class EventTooLarge(ServerError):
    """The server rejected an event over its size limit."""


_BY_CODE: dict[str, type[ServerError]] = {
    cv.ERR_AUTHENTICATION_FAILED: AuthenticationFailed,
    cv.ERR_UNSUPPORTED_VERSION: UnsupportedVersion,
    cv.ERR_NOT_AUTHORISED: NotAuthorised,
    cv.ERR_NO_SUCH_CHANNEL: ChannelNotFound,
    cv.ERR_NO_SUCH_BINDER: BinderNotFound,
    cv.ERR_TX_IN_PROGRESS: TransactionError,
    cv.ERR_NO_TX: TransactionError,
    cv.ERR_EVENT_TOO_LARGE: EventTooLarge,
}


def server_error(operation: str, err_code: object, err_msg: object) -> ServerError:
    """Build the most specific error for a refused request (numeric codes of later servers included)."""
    code = cv.normalise_error_code(err_code)
    msg = None if err_msg is None else one_line(str(err_msg))
    cls = _BY_CODE.get(code, ServerError) if code is not None else ServerError
    return cls(operation, code, msg)
