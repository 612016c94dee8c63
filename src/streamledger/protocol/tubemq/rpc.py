"""The TubeMQ RPC payload: three length-delimited protobuf messages per request or response.

Request:  ``RpcConnHeader{flag=0} | RequestHeader{serviceType, protocolVer} |
          RequestBody{method, timeout, request}``
Response: ``RpcConnHeader{flag=1} | ResponseHeader{status, ...} | RspResponseBody | RspExceptionBody``

Each message is preceded by its byte length as an unsigned LEB128 varint (protobuf's
``writeDelimitedTo``). This module turns payloads into typed values and back; it knows nothing
about sockets or masters.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from google.protobuf.message import DecodeError, Message

from streamledger.protocol.tubemq._pb import tubemq_rpc_pb2 as rpc_pb
from streamledger.protocol.tubemq.errors import TubeMQProtocolError

__all__ = [
    "DEFAULT_PROTOCOL_VERSION",
    "FLAG_REQUEST",
    "FLAG_RESPONSE",
    "SERVICE_MASTER",
    "Method",
    "RpcRequest",
    "RpcResponse",
    "Status",
    "decode_request",
    "decode_response",
    "decode_varint",
    "encode_exception_response",
    "encode_request",
    "encode_response",
    "encode_varint",
]

FLAG_REQUEST = 0
FLAG_RESPONSE = 1
SERVICE_MASTER = 1
# 3 = org.apache.inlong.tubemq: exception class names come back unchanged.
DEFAULT_PROTOCOL_VERSION = 3
_MAX_VARINT_BYTES = 10


class Method(IntEnum):
    """Master-service method ids used by producers and consumers."""

    PRODUCER_REGISTER = 1
    PRODUCER_HEARTBEAT = 2
    PRODUCER_CLOSE = 3
    CONSUMER_REGISTER = 4
    CONSUMER_HEARTBEAT = 5
    CONSUMER_CLOSE = 6


class Status(IntEnum):
    """ResponseHeader.status."""

    SUCCESS = 0
    ERROR = 1
    FATAL = 2


@dataclass(frozen=True, slots=True)
class RpcRequest:
    """A decoded request payload (what a master sees)."""

    service_type: int
    protocol_version: int
    method: int
    timeout_ms: int
    body: bytes


@dataclass(frozen=True, slots=True)
class RpcResponse:
    """A decoded response payload: ``data`` on SUCCESS, the exception name and message otherwise."""

    status: Status
    method: int | None
    data: bytes
    exception_name: str
    exception_message: str
    protocol_version: int | None


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128, as protobuf writes a delimited message's length."""
    if value < 0:
        raise ValueError(f"varint length cannot be negative: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Read an unsigned varint at ``pos``; returns ``(value, next_pos)``."""
    result = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(data):
            raise TubeMQProtocolError(f"truncated varint at byte {pos} of a {len(data)}-byte payload")
        byte = data[pos + i]
        result |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return result, pos + i + 1
    raise TubeMQProtocolError(f"varint longer than {_MAX_VARINT_BYTES} bytes at byte {pos}")


def _delimited(message: Message) -> bytes:
    body = message.SerializeToString()
    return encode_varint(len(body)) + body


def _read_delimited(data: bytes, pos: int, message: Message, what: str) -> int:
    length, pos = decode_varint(data, pos)
    end = pos + length
    if end > len(data):
        raise TubeMQProtocolError(f"{what} declares {length} bytes but only {len(data) - pos} remain")
    try:
        message.ParseFromString(data[pos:end])
    except DecodeError as exc:
        raise TubeMQProtocolError(f"cannot decode {what}: {exc}") from exc
    return end


def encode_request(
    method: int,
    body: bytes,
    *,
    timeout_ms: int,
    service_type: int = SERVICE_MASTER,
    protocol_version: int = DEFAULT_PROTOCOL_VERSION,
) -> bytes:
    """Build a request payload; ``timeout_ms`` must be positive or the master never answers."""
    if timeout_ms <= 0:
        raise ValueError(f"timeout_ms must be positive (a 0 timeout is never answered), got {timeout_ms}")
    return b"".join(
        (
            _delimited(rpc_pb.RpcConnHeader(flag=FLAG_REQUEST)),
            _delimited(rpc_pb.RequestHeader(serviceType=service_type, protocolVer=protocol_version)),
            _delimited(rpc_pb.RequestBody(method=method, timeout=timeout_ms, request=body)),
        )
    )


def decode_request(payload: bytes) -> RpcRequest:
    """Parse a request payload (used by servers and test doubles)."""
    conn = rpc_pb.RpcConnHeader()
    pos = _read_delimited(payload, 0, conn, "RpcConnHeader")
    if conn.flag != FLAG_REQUEST:
        raise TubeMQProtocolError(f"expected a request (flag 0), got flag {conn.flag}")
    header = rpc_pb.RequestHeader()
    pos = _read_delimited(payload, pos, header, "RequestHeader")
    body = rpc_pb.RequestBody()
    _read_delimited(payload, pos, body, "RequestBody")
    return RpcRequest(header.serviceType, header.protocolVer, body.method, body.timeout, body.request)


def encode_response(method: int, data: bytes, *, protocol_version: int = DEFAULT_PROTOCOL_VERSION) -> bytes:
    """Build a SUCCESS response payload carrying a serialized master message."""
    return b"".join(
        (
            _delimited(rpc_pb.RpcConnHeader(flag=FLAG_RESPONSE)),
            _delimited(
                rpc_pb.ResponseHeader(status=rpc_pb.ResponseHeader.SUCCESS, protocolVer=protocol_version)
            ),
            _delimited(rpc_pb.RspResponseBody(method=method, data=data)),
        )
    )


def encode_exception_response(
    status: Status,
    exception_name: str,
    message: str,
    *,
    protocol_version: int | None = DEFAULT_PROTOCOL_VERSION,
) -> bytes:
    """Build an ERROR/FATAL response payload (``protocol_version=None`` as in FATAL answers)."""
    if status == Status.SUCCESS:
        raise ValueError("an exception response needs status ERROR or FATAL")
    header = rpc_pb.ResponseHeader(status=status.name)
    if protocol_version is not None:
        header.protocolVer = protocol_version
    return b"".join(
        (
            _delimited(rpc_pb.RpcConnHeader(flag=FLAG_RESPONSE)),
            _delimited(header),
            _delimited(rpc_pb.RspExceptionBody(exceptionName=exception_name, stackTrace=message)),
        )
    )


def decode_response(payload: bytes) -> RpcResponse:
    """Parse a response payload into an :class:`RpcResponse`."""
    conn = rpc_pb.RpcConnHeader()
    pos = _read_delimited(payload, 0, conn, "RpcConnHeader")
    if conn.flag != FLAG_RESPONSE:
        raise TubeMQProtocolError(f"expected a response (flag 1), got flag {conn.flag}")
    header = rpc_pb.ResponseHeader()
    pos = _read_delimited(payload, pos, header, "ResponseHeader")
    try:
        status = Status(header.status)
    except ValueError as exc:
        raise TubeMQProtocolError(f"unknown response status {header.status}") from exc
    version = header.protocolVer if header.HasField("protocolVer") else None
    if status == Status.SUCCESS:
        body = rpc_pb.RspResponseBody()
        _read_delimited(payload, pos, body, "RspResponseBody")
        return RpcResponse(status, body.method, body.data, "", "", version)
    exc_body = rpc_pb.RspExceptionBody()
    if pos < len(payload):
        _read_delimited(payload, pos, exc_body, "RspExceptionBody")
    return RpcResponse(status, None, b"", exc_body.exceptionName, exc_body.stackTrace, version)
