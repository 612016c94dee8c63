"""Command keys, response codes and offset-spec types of the RabbitMQ Streams protocol.

Kept in one table so that error messages, version gating and the wire code all speak the same
names (rabbitmq-stream.md sections 3, 4 and 7.7).
"""

from __future__ import annotations

from typing import Final

RESPONSE_BIT: Final = 0x8000

# -- command keys (section 3) -------------------------------------------------------------------
DECLARE_PUBLISHER: Final = 0x0001
PUBLISH: Final = 0x0002
PUBLISH_CONFIRM: Final = 0x0003
PUBLISH_ERROR: Final = 0x0004
QUERY_PUBLISHER_SEQUENCE: Final = 0x0005
DELETE_PUBLISHER: Final = 0x0006
SUBSCRIBE: Final = 0x0007
DELIVER: Final = 0x0008
CREDIT: Final = 0x0009
STORE_OFFSET: Final = 0x000A
QUERY_OFFSET: Final = 0x000B
UNSUBSCRIBE: Final = 0x000C
CREATE: Final = 0x000D
DELETE: Final = 0x000E
METADATA: Final = 0x000F
METADATA_UPDATE: Final = 0x0010
PEER_PROPERTIES: Final = 0x0011
SASL_HANDSHAKE: Final = 0x0012
SASL_AUTHENTICATE: Final = 0x0013
TUNE: Final = 0x0014
OPEN: Final = 0x0015
CLOSE: Final = 0x0016
HEARTBEAT: Final = 0x0017
ROUTE: Final = 0x0018
PARTITIONS: Final = 0x0019
CONSUMER_UPDATE: Final = 0x001A
EXCHANGE_COMMAND_VERSIONS: Final = 0x001B
STREAM_STATS: Final = 0x001C
CREATE_SUPER_STREAM: Final = 0x001D
DELETE_SUPER_STREAM: Final = 0x001E
RESOLVE_OFFSET_SPEC: Final = 0x001F

COMMAND_NAMES: Final[dict[int, str]] = {
    DECLARE_PUBLISHER: "DeclarePublisher",
    PUBLISH: "Publish",
    PUBLISH_CONFIRM: "PublishConfirm",
    PUBLISH_ERROR: "PublishError",
    QUERY_PUBLISHER_SEQUENCE: "QueryPublisherSequence",
    DELETE_PUBLISHER: "DeletePublisher",
    SUBSCRIBE: "Subscribe",
    DELIVER: "Deliver",
    CREDIT: "Credit",
    STORE_OFFSET: "StoreOffset",
    QUERY_OFFSET: "QueryOffset",
    UNSUBSCRIBE: "Unsubscribe",
    CREATE: "Create",
    DELETE: "Delete",
    METADATA: "Metadata",
    METADATA_UPDATE: "MetadataUpdate",
    PEER_PROPERTIES: "PeerProperties",
    SASL_HANDSHAKE: "SaslHandshake",
    SASL_AUTHENTICATE: "SaslAuthenticate",
    TUNE: "Tune",
    OPEN: "Open",
    CLOSE: "Close",
    HEARTBEAT: "Heartbeat",
    ROUTE: "Route",
    PARTITIONS: "Partitions",
    CONSUMER_UPDATE: "ConsumerUpdate",
    EXCHANGE_COMMAND_VERSIONS: "ExchangeCommandVersions",
    STREAM_STATS: "StreamStats",
    CREATE_SUPER_STREAM: "CreateSuperStream",
    DELETE_SUPER_STREAM: "DeleteSuperStream",
    RESOLVE_OFFSET_SPEC: "ResolveOffsetSpec",
}

# First server release that understands each client command (section 3, "Since"); used to
# decide what may be sent to a broker that cannot answer ExchangeCommandVersions (< 3.11).
COMMAND_SINCE: Final[dict[int, tuple[int, int, int]]] = {
    **{key: (3, 9, 0) for key in range(DECLARE_PUBLISHER, PARTITIONS + 1)},
    CONSUMER_UPDATE: (3, 11, 0),
    EXCHANGE_COMMAND_VERSIONS: (3, 11, 0),
    STREAM_STATS: (3, 12, 0),
    CREATE_SUPER_STREAM: (3, 13, 0),
    DELETE_SUPER_STREAM: (3, 13, 0),
    RESOLVE_OFFSET_SPEC: (4, 3, 0),
}


def command_name(key: int) -> str:
    """Human name of a command key (response bit ignored)."""
    base = key & 0x7FFF
    return COMMAND_NAMES.get(base, f"command 0x{base:04x}")


# -- response codes (section 4) -----------------------------------------------------------------
OK: Final = 0x01
STREAM_DOES_NOT_EXIST: Final = 0x02
SUBSCRIPTION_ID_ALREADY_EXISTS: Final = 0x03
SUBSCRIPTION_ID_DOES_NOT_EXIST: Final = 0x04
STREAM_ALREADY_EXISTS: Final = 0x05
STREAM_NOT_AVAILABLE: Final = 0x06
SASL_MECHANISM_NOT_SUPPORTED: Final = 0x07
AUTHENTICATION_FAILURE: Final = 0x08
SASL_ERROR: Final = 0x09
SASL_CHALLENGE: Final = 0x0A
SASL_AUTHENTICATION_FAILURE_LOOPBACK: Final = 0x0B
VIRTUAL_HOST_ACCESS_FAILURE: Final = 0x0C
UNKNOWN_FRAME: Final = 0x0D
FRAME_TOO_LARGE: Final = 0x0E
INTERNAL_ERROR: Final = 0x0F
ACCESS_REFUSED: Final = 0x10
PRECONDITION_FAILED: Final = 0x11
PUBLISHER_DOES_NOT_EXIST: Final = 0x12
NO_OFFSET: Final = 0x13
SASL_CANNOT_CHANGE_MECHANISM: Final = 0x14
SASL_CANNOT_CHANGE_USERNAME: Final = 0x15

RESPONSE_CODE_NAMES: Final[dict[int, str]] = {
    OK: "OK",
    STREAM_DOES_NOT_EXIST: "STREAM_DOES_NOT_EXIST",
    SUBSCRIPTION_ID_ALREADY_EXISTS: "SUBSCRIPTION_ID_ALREADY_EXISTS",
    SUBSCRIPTION_ID_DOES_NOT_EXIST: "SUBSCRIPTION_ID_DOES_NOT_EXIST",
    STREAM_ALREADY_EXISTS: "STREAM_ALREADY_EXISTS",
    STREAM_NOT_AVAILABLE: "STREAM_NOT_AVAILABLE",
    SASL_MECHANISM_NOT_SUPPORTED: "SASL_MECHANISM_NOT_SUPPORTED",
    AUTHENTICATION_FAILURE: "AUTHENTICATION_FAILURE",
    SASL_ERROR: "SASL_ERROR",
    SASL_CHALLENGE: "SASL_CHALLENGE",
    SASL_AUTHENTICATION_FAILURE_LOOPBACK: "SASL_AUTHENTICATION_FAILURE_LOOPBACK",
    VIRTUAL_HOST_ACCESS_FAILURE: "VIRTUAL_HOST_ACCESS_FAILURE",
    UNKNOWN_FRAME: "UNKNOWN_FRAME",
    FRAME_TOO_LARGE: "FRAME_TOO_LARGE",
    INTERNAL_ERROR: "INTERNAL_ERROR",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    PUBLISHER_DOES_NOT_EXIST: "PUBLISHER_DOES_NOT_EXIST",
    NO_OFFSET: "NO_OFFSET",
    SASL_CANNOT_CHANGE_MECHANISM: "SASL_CANNOT_CHANGE_MECHANISM",
    SASL_CANNOT_CHANGE_USERNAME: "SASL_CANNOT_CHANGE_USERNAME",
}


def code_name(code: int) -> str:
    """Name of a response code; unknown codes are shown in hex rather than rejected."""
    return RESPONSE_CODE_NAMES.get(code, f"UNKNOWN_CODE_0x{code:02x}")


# -- offset specification types (section 7.7) ---------------------------------------------------
OFFSET_TYPE_FIRST: Final = 1
OFFSET_TYPE_LAST: Final = 2
OFFSET_TYPE_NEXT: Final = 3
OFFSET_TYPE_OFFSET: Final = 4
OFFSET_TYPE_TIMESTAMP: Final = 5

# -- chunk types (osiris-chunk.md section 2) ----------------------------------------------------
CHUNK_TYPE_USER: Final = 0

# -- defaults -----------------------------------------------------------------------------------
DEFAULT_PORT: Final = 5552
DEFAULT_TLS_PORT: Final = 5551
DEFAULT_FRAME_MAX: Final = 1_048_576
DEFAULT_HEARTBEAT: Final = 60
# Since 4.3.5 the server drops pre-Open frames above 8192 bytes (section 2).
PRE_OPEN_FRAME_MAX: Final = 8192
# Inbound Deliver frames are not bounded by frame_max (a chunk is sent whole); this ceiling
# only stops a corrupt length prefix from making us allocate without bound.
DEFAULT_MAX_INBOUND_FRAME: Final = 256 * 1024 * 1024
