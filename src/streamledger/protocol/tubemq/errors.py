"""Typed errors of the TubeMQ master client.

Callers need to tell apart "the bytes on the wire were wrong" (:class:`FrameError`), "nobody
answered" (:class:`NoMasterAvailable`, :class:`TubeMQTimeout`), "this master is not the leader"
(:class:`StandbyMasterError`, handled by failover) and "the master said no"
(:class:`MasterResponseError` with the master's ``errCode``/``errMsg``). Credentials never go into
a message.
"""

from __future__ import annotations

from streamledger.errors import StreamledgerError

__all__ = [
    "CertificateFailure",
    "FrameError",
    "InvalidArgument",
    "MasterResponseError",
    "NoMasterAvailable",
    "ReRegisterRequired",
    "RemoteException",
    "StandbyMasterError",
    "TubeMQConnectionError",
    "TubeMQError",
    "TubeMQProtocolError",
    "TubeMQTimeout",
]

# TErrCodeConstants values the client reacts to.
ERR_SUCCESS = 200
ERR_NOT_READY = 201
ERR_BAD_REQUEST = 400
ERR_HB_NO_NODE = 411
ERR_CERTIFICATE_FAILURE = 415
ERR_TOPIC_NOT_DEPLOYED = 431


class TubeMQError(StreamledgerError):
    """Base of every deliberate TubeMQ client error."""


class InvalidArgument(TubeMQError, ValueError):
    """A caller-supplied value (master address, topic, group) is unusable; names the value."""


class TubeMQProtocolError(TubeMQError):
    """The peer sent something that does not follow the TubeMQ RPC protocol."""


class FrameError(TubeMQProtocolError):
    """A packet violates the framing rules (token, list size, block length, size limit)."""


class TubeMQConnectionError(TubeMQError):
    """The TCP connection to a master could not be opened or was lost."""


class TubeMQTimeout(TubeMQError):
    """A request got no response within its timeout."""


class NoMasterAvailable(TubeMQError):
    """Every configured master failed (connection error or standby) for one call."""


class RemoteException(TubeMQError):
    """The master answered an RPC with status ERROR or FATAL (a Java exception name and message)."""

    def __init__(self, address: str, status: int, exception_name: str, message: str) -> None:
        self.address = address
        self.status = status
        self.exception_name = exception_name
        self.remote_message = message
        kind = "FATAL" if status == 2 else "ERROR"
        super().__init__(f"master {address} answered RPC {kind}: {exception_name}: {message}")

    @property
    def fails_over(self) -> bool:
        """True when the Java SDK would try the next master (standby or an IOException subclass)."""
        return self.exception_name.endswith(_FAILOVER_SUFFIXES)


class StandbyMasterError(RemoteException):
    """The contacted master is not the active one; the client rotates to the next address."""


_FAILOVER_SUFFIXES = tuple(
    f"corerpc.exception.{name}"
    for name in (
        "StandbyException",
        "ServiceStoppingException",
        "ServerNotReadyException",
        "ClientClosedException",
        "NetworkException",
        "LocalConnException",
    )
)


class MasterResponseError(TubeMQError):
    """A master call came back with ``success = false``; carries the master's code and message."""

    def __init__(self, operation: str, address: str, err_code: int, err_msg: str) -> None:
        self.operation = operation
        self.address = address
        self.err_code = err_code
        self.err_msg = err_msg
        super().__init__(f"{operation} refused by master {address}: errCode {err_code}: {err_msg}")


class ReRegisterRequired(MasterResponseError):
    """errCode 411 (HB_NO_NODE): the master does not know this client; register again."""


class CertificateFailure(MasterResponseError):
    """errCode 415: the master rejected the authentication info (user, signature or timestamp)."""


def response_error(operation: str, address: str, err_code: int, err_msg: str) -> MasterResponseError:
    """Build the most specific error class for a business error code."""
    cls: type[MasterResponseError] = MasterResponseError
    if err_code == ERR_HB_NO_NODE:
        cls = ReRegisterRequired
    elif err_code == ERR_CERTIFICATE_FAILURE:
        cls = CertificateFailure
    return cls(operation, address, err_code, err_msg)
