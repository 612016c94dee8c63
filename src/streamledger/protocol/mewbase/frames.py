"""mewbase frames: the protocol table, BSON encoding, and an incremental decoder with hard limits.

The connection carries BSON documents back to back, each ``{type: <name>, frame: <document>}``. A BSON
document begins with its total length as a little-endian int32 that counts itself, so the decoder
reads 4 bytes, checks the length against ``5 .. max_frame_size`` and only then waits for the rest:
a corrupt or hostile peer can make it raise :class:`FrameLengthError`, never allocate beyond the
limit or wait for a frame that could never be valid. BSON itself is pymongo's ``bson`` package.

Each frame type is declared once in :data:`FRAMES` (field name, wire type, mandatory?) and both
directions are checked against that table: :func:`encode_frame` refuses a missing mandatory field or
an out-of-range integer, :func:`decode_frame` refuses a server frame that breaks its declaration.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

from streamledger.protocol.mewbase import conventions as cv
from streamledger.protocol.mewbase.errors import FrameError, FrameLengthError, InvalidRequest

__all__ = [
    "CLIENT_FRAMES",
    "DECODE_OPTIONS",
    "FRAMES",
    "SERVER_FRAMES",
    "Field",
    "Frame",
    "FrameDecoder",
    "decode_event",
    "decode_frame",
    "encode_frame",
]

Kind = Literal["str", "int32", "int64", "bool", "doc", "code"]

# Frame type names.
CONNECT: Final = "CONNECT"
RESPONSE: Final = "RESPONSE"
PUBLISH: Final = "PUBLISH"
STARTTX: Final = "STARTTX"
COMMITTX: Final = "COMMITTX"
ABORTTX: Final = "ABORTTX"
SUBSCRIBE: Final = "SUBSCRIBE"
SUBRESPONSE: Final = "SUBRESPONSE"
UNSUBSCRIBE: Final = "UNSUBSCRIBE"
SUBCLOSE: Final = "SUBCLOSE"
RECEV: Final = "RECEV"
ACKEV: Final = "ACKEV"
QUERY: Final = "QUERY"
QUERYRESPONSE: Final = "QUERYRESPONSE"
QUERYRESULT: Final = "QUERYRESULT"
QUERYACK: Final = "QUERYACK"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: Kind
    mandatory: bool = False


def _f(name: str, kind: Kind, mandatory: bool = False) -> Field:
    return Field(name, kind, mandatory)


_RID = _f("rID", "int32", True)
_ERR = (_f("errCode", "code"), _f("errMsg", "str"))
_TX = (_f("sessID", "int32", True), _RID)
_SUB_REQ = (_f("subID", "int32", True), _RID)

CLIENT_FRAMES: Final[dict[str, tuple[Field, ...]]] = {
    CONNECT: (_f("version", "str", True), _f("username", "str"), _f("password", "str")),
    PUBLISH: (_f("channel", "str", True), _f("event", "doc", True), _RID, _f("sessID", "int32")),
    STARTTX: _TX,
    COMMITTX: _TX,
    ABORTTX: _TX,
    SUBSCRIBE: (
        _f("channel", "str", True),
        _RID,
        _f("startPos", "int64"),
        _f("startTimestamp", "int64"),
        _f("durableID", "str"),
        _f("matcher", "doc"),
    ),
    UNSUBSCRIBE: _SUB_REQ,
    SUBCLOSE: _SUB_REQ,
    ACKEV: (_f("subID", "int32", True), _f(cv.ACKEV_POS, "int64")),
    QUERY: (_f("queryID", "int32", True), _f("binder", "str", True), _f("matcher", "doc", True)),
    QUERYACK: (_f("queryID", "int32", True),),
}

SERVER_FRAMES: Final[dict[str, tuple[Field, ...]]] = {
    # rID is mandatory in the draft, but the answer to CONNECT (which has no rID) may lack it.
    RESPONSE: (_f("ok", "bool", True), _f("rID", "int32"), *_ERR),
    SUBRESPONSE: (_f("ok", "bool", True), _f("rID", "int32", True), *_ERR, _f("subID", "int32")),
    RECEV: (
        _f("subID", "int32", True),
        _f("timestamp", "int64", True),
        _f("pos", "int64", True),
        _f("event", "doc", True),
    ),
    QUERYRESPONSE: (
        _f("queryID", "int32", True),
        _f("ok", "bool", True),
        *_ERR,
        _f(cv.QUERYRESPONSE_NUM_RESULTS, "int32"),
    ),
    QUERYRESULT: (_f("queryID", "int32", True), _f("result", "doc", True), _f("last", "bool", True)),
}

FRAMES: Final[dict[str, tuple[Field, ...]]] = {**CLIENT_FRAMES, **SERVER_FRAMES}

# Decoding never fails on a datetime Python cannot represent (it stays a DatetimeMS then).
DECODE_OPTIONS: Final[CodecOptions[dict[str, Any]]] = CodecOptions(
    datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
_LENGTH = struct.Struct("<i")
_RANGES = {"int32": (cv.INT32_MIN, cv.INT32_MAX), "int64": (cv.INT64_MIN, cv.INT64_MAX)}


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded server frame; ``event`` holds a RECEV's event document exactly as received."""

    type: str
    body: dict[str, Any]
    size: int
    event: bytes | None = None


# -- encoding -------------------------------------------------------------------------------------


def _encode_value(frame_type: str, field: Field, value: Any) -> Any:
    kind = field.kind
    where = f"{frame_type}.{field.name}"
    if kind in ("int32", "int64"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(f"{where} must be an integer, got {type(value).__name__}")
        low, high = _RANGES[kind]
        if not low <= value <= high:
            raise InvalidRequest(f"{where} = {value} does not fit {kind}")
        return Int64(value) if kind == "int64" else int(value)
    if kind == "str":
        if not isinstance(value, str):
            raise InvalidRequest(f"{where} must be a string, got {type(value).__name__}")
        if "\x00" in value:
            raise InvalidRequest(f"{where} must not contain NUL characters")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidRequest(f"{where} must be a boolean")
        return value
    if kind == "doc":
        if isinstance(value, bytes | bytearray | memoryview):
            return _raw_document(where, bytes(value))
        if isinstance(value, RawBSONDocument | Mapping):
            return value
        raise InvalidRequest(
            f"{where} must be a document (mapping or BSON bytes), got {type(value).__name__}"
        )
    # "code": a string (the draft) or an integer (later servers)
    if isinstance(value, str | int) and not isinstance(value, bool):
        return value
    raise InvalidRequest(f"{where} must be a string or an integer")


def _raw_document(where: str, data: bytes) -> RawBSONDocument:
    """Embed already-encoded BSON as is, after checking it is one well-formed document."""
    if len(data) < cv.MIN_FRAME_SIZE or _LENGTH.unpack_from(data)[0] != len(data):
        raise InvalidRequest(f"{where}: {len(data)} bytes are not one BSON document")
    try:
        bson.decode(data, DECODE_OPTIONS)
    except Exception as exc:  # pymongo raises several types for malformed input
        raise InvalidRequest(f"{where}: invalid BSON document ({_reason(exc)})") from None
    return RawBSONDocument(data)


def encode_frame(frame_type: str, body: Mapping[str, Any], *, max_size: int | None = None) -> bytes:
    """``{type, frame: body}`` as BSON, checked against the frame's declaration.

    ``None`` values are left out (optional fields); unknown fields are refused, so a typo never
    reaches the wire. ``max_size`` refuses a frame the peer would reject as too large.
    """
    fields = FRAMES.get(frame_type)
    if fields is None:
        raise InvalidRequest(f"unknown frame type {frame_type!r}")
    declared = {f.name for f in fields}
    unknown = [k for k in body if k not in declared]
    if unknown:
        raise InvalidRequest(f"{frame_type} has no field(s) {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    for field in fields:
        value = body.get(field.name)
        if value is None:
            if field.mandatory:
                raise InvalidRequest(f"{frame_type}.{field.name} is mandatory")
            continue
        out[field.name] = _encode_value(frame_type, field, value)
    try:
        data = bson.encode({"type": frame_type, "frame": out})
    except Exception as exc:  # InvalidDocument, OverflowError, ... for unencodable event values
        raise InvalidRequest(f"{frame_type}: cannot encode as BSON ({_reason(exc)})") from None
    if max_size is not None and len(data) > max_size:
        raise InvalidRequest(f"{frame_type} frame of {len(data)} bytes exceeds the {max_size}-byte limit")
    return data


# -- decoding -------------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def _check_value(frame_type: str, field: Field, value: Any) -> None:
    kind = field.kind
    where = f"{frame_type}.{field.name}"
    if kind in ("int32", "int64"):
        # Either BSON integer width is accepted; the value must still fit the declared one.
        if isinstance(value, bool) or not isinstance(value, int):
            raise FrameError(f"{where} is {type(value).__name__}, expected {kind}")
        low, high = _RANGES[kind]
        if not low <= value <= high:
            raise FrameError(f"{where} = {value} does not fit {kind}")
    elif kind == "str":
        if type(value) is not str:  # BSON JavaScript code decodes to a str subclass (bson.code.Code)
            raise FrameError(f"{where} is {type(value).__name__}, expected a string")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise FrameError(f"{where} is {type(value).__name__}, expected a boolean")
    elif kind == "doc":
        if not isinstance(value, dict):
            raise FrameError(f"{where} is {type(value).__name__}, expected a document")
    elif isinstance(value, bool) or not (type(value) is str or isinstance(value, int)):
        raise FrameError(f"{where} is {type(value).__name__}, expected a string or an integer")


def decode_frame(data: bytes, *, table: Mapping[str, tuple[Field, ...]] = SERVER_FRAMES) -> Frame:
    """Decode one complete frame and check it against ``table`` (server frames by default)."""
    if len(data) < cv.MIN_FRAME_SIZE:
        raise FrameError(f"{len(data)} bytes cannot hold a BSON document")
    (length,) = _LENGTH.unpack_from(data)
    if length != len(data):
        raise FrameError(f"length prefix {length} does not match the {len(data)} bytes given")
    try:
        doc = bson.decode(data, DECODE_OPTIONS)
    except Exception as exc:  # InvalidBSON and friends: malformed input from the peer
        raise FrameError(f"invalid BSON frame of {len(data)} bytes: {_reason(exc)}") from None
    frame_type = doc.get("type")
    if type(frame_type) is not str:  # not JavaScript code (bson.code.Code, an unhashable str subclass)
        raise FrameError("frame without a string 'type'")
    fields = table.get(frame_type)
    if fields is None:
        raise FrameError(f"unexpected frame type {frame_type[:40]!r}")
    body = doc.get("frame")
    if not isinstance(body, dict):
        raise FrameError(f"{frame_type} frame without a 'frame' document")
    for field in fields:
        value = body.get(field.name)
        if value is None:
            if field.mandatory:
                raise FrameError(f"{frame_type} frame lacks mandatory field {field.name}")
            continue
        _check_value(frame_type, field, value)
    event = None
    if frame_type == RECEV:
        event = _event_bytes(data)
    return Frame(frame_type, body, len(data), event)


# Bytes after an element's name, for the BSON types of fixed size (the others are measured below).
_FIXED = {
    0x01: 8,
    0x06: 0,
    0x07: 12,
    0x08: 1,
    0x09: 8,
    0x0A: 0,
    0x10: 4,
    0x11: 8,
    0x12: 8,
    0x13: 16,
    0x7F: 0,
    0xFF: 0,
}


def _element_end(data: bytes, kind: int, pos: int) -> int:
    """Where the value of a ``kind`` element starting at ``pos`` ends (input already validated)."""
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return pos + fixed
    if kind == 0x0B:  # regex: two C strings
        return data.index(b"\x00", data.index(b"\x00", pos) + 1) + 1
    length: int = _LENGTH.unpack_from(data, pos)[0]
    if kind in (0x02, 0x0D, 0x0E):  # string, code, symbol: int32 length + bytes
        return pos + 4 + length
    if kind in (0x03, 0x04, 0x0F):  # document, array, code with scope: int32 total length
        return pos + length
    if kind == 0x05:  # binary: int32 length + subtype + bytes
        return pos + 5 + length
    if kind == 0x0C:  # DBPointer: string + 12-byte id
        return pos + 4 + length + 12
    raise ValueError(f"BSON type 0x{kind:02x}")


def _find(data: bytes, start: int, end: int, name: bytes, kind: int) -> tuple[int, int]:
    """The value span of the element ``name`` (of type ``kind``) in the document at ``start``."""
    pos = start + 4
    while pos < end - 1:
        element = data[pos]
        name_end = data.index(b"\x00", pos + 1)
        value_end = _element_end(data, element, name_end + 1)
        if element == kind and data[pos + 1 : name_end] == name:
            return name_end + 1, value_end
        pos = value_end
    raise ValueError(f"no {name!r}")


def _event_bytes(data: bytes) -> bytes:
    """A RECEV's event document, sliced from the validated frame without decoding it again."""
    try:
        frame_start, frame_end = _find(data, 0, len(data), b"frame", 0x03)
        event_start, event_end = _find(data, frame_start, frame_end, b"event", 0x03)
    except (ValueError, IndexError, struct.error) as exc:  # pragma: no cover - bson.decode accepted it
        raise FrameError(f"RECEV frame: cannot locate the event ({exc})") from None
    return data[event_start:event_end]


def decode_event(data: bytes) -> dict[str, Any]:
    """An event document as a dict (int64 values stay ``bson.int64.Int64``, an ``int`` subclass)."""
    try:
        return bson.decode(data, DECODE_OPTIONS)
    except Exception as exc:
        raise FrameError(f"invalid BSON event of {len(data)} bytes: {_reason(exc)}") from None


class FrameDecoder:
    """Incremental frame decoder with hard limits.

    ``feed(data)`` returns the frames completed by ``data``. The length prefix is checked as soon as
    its 4 bytes are in, before any more is read or allocated. After a :class:`FrameError` the stream
    position is lost, so the decoder refuses further input (the connection must be closed).
    """

    def __init__(
        self,
        *,
        max_frame_size: int = cv.DEFAULT_MAX_FRAME_SIZE,
        table: Mapping[str, tuple[Field, ...]] = SERVER_FRAMES,
    ) -> None:
        if max_frame_size < cv.MIN_FRAME_SIZE:
            raise InvalidRequest(f"max_frame_size must be at least {cv.MIN_FRAME_SIZE}, got {max_frame_size}")
        self.max_frame_size = max_frame_size
        self._table = table
        self._buf = bytearray()
        self._need: int | None = None  # length of the frame being assembled, once its prefix is in
        self._failed: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that belong to an incomplete frame."""
        return len(self._buf)

    @property
    def pending(self) -> int | None:
        """The declared length of the frame being assembled (None between frames)."""
        return self._need

    def feed(self, data: bytes) -> list[Frame]:
        if self._failed is not None:
            raise FrameError(f"decoder unusable after an earlier framing error ({self._failed})")
        try:
            return self._feed(data)
        except FrameError as exc:
            self._failed = exc
            self._buf.clear()
            raise

    def _feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        while True:
            avail = len(buf) - pos
            if self._need is None:
                if avail < 4:
                    break
                (length,) = _LENGTH.unpack_from(buf, pos)
                if not cv.MIN_FRAME_SIZE <= length <= self.max_frame_size:
                    raise FrameLengthError(length, self.max_frame_size)
                self._need = length
            if avail < self._need:
                break
            frames.append(decode_frame(bytes(buf[pos : pos + self._need]), table=self._table))
            pos += self._need
            self._need = None
        if pos:
            del buf[:pos]
        return frames

    def wanted(self) -> int:
        """How many more bytes complete the current frame (or its length prefix)."""
        if self._need is None:
            return 4 - len(self._buf) if len(self._buf) < 4 else 0
        return max(0, self._need - len(self._buf))
