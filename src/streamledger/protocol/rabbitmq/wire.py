"""Primitive and frame encoding of the RabbitMQ Streams protocol, and a buffered frame reader.

Section 1 and 2 of rabbitmq-stream.md: big-endian integers, ``string`` (int16 length),
``bytes`` (int32 length), arrays and string maps (int32 count), and frames
``Size:uint32 Key:uint16 Version:uint16 Payload``.

:class:`FrameReader` reads the socket into one large ``bytearray`` with ``recv_into`` and hands
out frames as *positions* in that buffer (no copy), which is what lets the range reader pass
chunk bytes straight to the chunk decoder. A frame stays valid until the next call.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol

from streamledger.protocol.rabbitmq.errors import ConnectionClosed, FrameTooLarge, ProtocolError

_U8: Final = struct.Struct(">B")
_U16: Final = struct.Struct(">H")
_I16: Final = struct.Struct(">h")
_U32: Final = struct.Struct(">I")
_I32: Final = struct.Struct(">i")
_U64: Final = struct.Struct(">Q")
_I64: Final = struct.Struct(">q")
_HEADER: Final = struct.Struct(">IHH")  # size, key, version
_KEY_VERSION: Final = struct.Struct(">HH")


class Writer:
    """Appends protocol primitives to a growing buffer; :meth:`frame` adds the size prefix."""

    __slots__ = ("_buf",)

    def __init__(self, key: int | None = None, version: int = 1) -> None:
        self._buf = bytearray(b"\0\0\0\0")  # size placeholder, patched by frame()
        if key is not None:
            self._buf += _KEY_VERSION.pack(key, version)

    def u8(self, value: int) -> Writer:
        self._buf += _U8.pack(value)
        return self

    def u16(self, value: int) -> Writer:
        self._buf += _U16.pack(value)
        return self

    def i16(self, value: int) -> Writer:
        self._buf += _I16.pack(value)
        return self

    def u32(self, value: int) -> Writer:
        self._buf += _U32.pack(value)
        return self

    def i32(self, value: int) -> Writer:
        self._buf += _I32.pack(value)
        return self

    def u64(self, value: int) -> Writer:
        self._buf += _U64.pack(value)
        return self

    def i64(self, value: int) -> Writer:
        self._buf += _I64.pack(value)
        return self

    def raw(self, data: bytes | bytearray | memoryview) -> Writer:
        self._buf += data
        return self

    def string(self, value: str | None) -> Writer:
        if value is None:
            self._buf += b"\xff\xff"
            return self
        data = value.encode("utf-8")
        if len(data) > 0x7FFF:
            raise ProtocolError(f"string of {len(data)} UTF-8 bytes is too long for the protocol (max 32767)")
        self._buf += _U16.pack(len(data))
        self._buf += data
        return self

    def bytes_(self, value: bytes | None) -> Writer:
        if value is None:
            self._buf += b"\xff\xff\xff\xff"
            return self
        self._buf += _U32.pack(len(value))
        self._buf += value
        return self

    def string_map(self, values: Mapping[str, str] | None) -> Writer:
        items = list((values or {}).items())
        self._buf += _U32.pack(len(items))
        for key, value in items:
            self.string(key)
            self.string(value)
        return self

    def string_array(self, values: Iterable[str]) -> Writer:
        items = list(values)
        self._buf += _U32.pack(len(items))
        for value in items:
            self.string(value)
        return self

    def __len__(self) -> int:
        return len(self._buf)

    def frame(self) -> bytes:
        """The finished frame: ``Size`` (excluding itself) followed by the body."""
        _U32.pack_into(self._buf, 0, len(self._buf) - 4)
        return bytes(self._buf)


def encode_frame(key: int, version: int, payload: bytes = b"") -> bytes:
    """One frame from a key, a version and an already-encoded payload."""
    return _HEADER.pack(4 + len(payload), key, version) + payload


class Reader:
    """Reads protocol primitives from ``buf[pos:end]``; any overrun is a :class:`ProtocolError`."""

    __slots__ = ("buf", "end", "pos", "what")

    def __init__(
        self, buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None, what: str = "frame"
    ) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end
        self.what = what

    def _need(self, count: int) -> int:
        pos = self.pos
        if pos + count > self.end:
            raise ProtocolError(
                f"truncated {self.what}: needed {count} byte(s) at position {pos}, {self.end - pos} left"
            )
        self.pos = pos + count
        return pos

    def remaining(self) -> int:
        return self.end - self.pos

    def at_end(self) -> bool:
        return self.pos >= self.end

    def u8(self) -> int:
        return int(_U8.unpack_from(self.buf, self._need(1))[0])

    def u16(self) -> int:
        return int(_U16.unpack_from(self.buf, self._need(2))[0])

    def i16(self) -> int:
        return int(_I16.unpack_from(self.buf, self._need(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack_from(self.buf, self._need(4))[0])

    def i32(self) -> int:
        return int(_I32.unpack_from(self.buf, self._need(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack_from(self.buf, self._need(8))[0])

    def i64(self) -> int:
        return int(_I64.unpack_from(self.buf, self._need(8))[0])

    def raw(self, count: int) -> bytes:
        pos = self._need(count)
        return bytes(self.buf[pos : pos + count])

    def string(self) -> str:
        """A ``string``; the null length (-1) reads as the empty string (the server never sends it)."""
        length = self.i16()
        if length == -1:
            return ""
        if length < 0:
            raise ProtocolError(f"negative string length {length} in {self.what}")
        pos = self._need(length)
        try:
            return bytes(self.buf[pos : pos + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"string in {self.what} is not valid UTF-8") from None

    def bytes_(self) -> bytes | None:
        length = self.i32()
        if length == -1:
            return None
        if length < 0:
            raise ProtocolError(f"negative bytes length {length} in {self.what}")
        return self.raw(length)

    def count(self, min_element_size: int) -> int:
        """An array count, checked against the bytes left so a corrupt count cannot allocate."""
        number = self.i32()
        if number < 0 or number * min_element_size > self.end - self.pos:
            raise ProtocolError(f"array count {number} in {self.what} does not fit in the frame")
        return number

    def string_map(self) -> dict[str, str]:
        result: dict[str, str] = {}
        for _ in range(self.count(4)):
            key = self.string()
            result[key] = self.string()
        return result

    def string_array(self) -> list[str]:
        return [self.string() for _ in range(self.count(2))]


def decode_frame(data: bytes | bytearray | memoryview) -> tuple[int, int, Reader]:
    """Split one complete frame (with its size prefix) into key, version and a payload reader."""
    if len(data) < 8:
        raise ProtocolError(f"truncated frame: {len(data)} byte(s), a frame needs at least 8")
    size, key, version = _HEADER.unpack_from(data, 0)
    if size < 4:
        raise ProtocolError(f"frame size {size} is below the 4-byte minimum")
    if size + 4 != len(data):
        raise ProtocolError(f"frame size field says {size + 4} byte(s) but {len(data)} were given")
    return key, version, Reader(data, 8, len(data))


RecvInto = Callable[[memoryview], int]


class FrameReader:
    """Buffered frame reader over a ``recv_into`` callable (a socket method, or a test feed).

    ``next_frame()`` returns ``(key, version, body_pos, frame_end)``: the payload is
    ``buf[body_pos:frame_end]`` (after key and version). Frames larger than ``max_frame``
    raise :class:`FrameTooLarge` before anything is allocated for them.
    """

    __slots__ = ("_end", "_start", "buf", "max_frame", "recv_into", "view")

    def __init__(self, recv_into: RecvInto, *, buffer_size: int = 1 << 20, max_frame: int) -> None:
        self.recv_into = recv_into
        self.buf = bytearray(buffer_size)
        self.view = memoryview(self.buf)
        self._start = 0
        self._end = 0
        self.max_frame = max_frame

    def buffered(self) -> int:
        """Bytes already read from the socket but not yet handed out."""
        return self._end - self._start

    def _fill(self, need: int) -> None:
        """Make ``need`` bytes available from ``_start``, reading as much as the socket offers."""
        start = self._start
        if start + need > len(self.buf):
            avail = self._end - start
            if need > len(self.buf):
                new = bytearray(max(need, 2 * len(self.buf)))
                new[:avail] = self.view[start : self._end]
                self.view.release()
                self.buf = new
                self.view = memoryview(new)
            else:
                self.buf[:avail] = self.buf[start : self._end]
            self._start = 0
            self._end = avail
        view = self.view
        recv = self.recv_into
        while self._end - self._start < need:
            n = recv(view[self._end :])
            if n <= 0:
                raise ConnectionClosed("connection closed by the broker (EOF)")
            self._end += n

    def next_frame(self) -> tuple[int, int, int, int]:
        if self._start == self._end:
            self._start = self._end = 0
        if self._end - self._start < 8:
            self._fill(8)
        size, key, version = _HEADER.unpack_from(self.buf, self._start)
        if size < 4:
            raise ProtocolError(f"frame size {size} is below the 4-byte minimum")
        if size > self.max_frame:
            raise FrameTooLarge(f"incoming frame of {size} bytes exceeds the limit of {self.max_frame} bytes")
        total = size + 4
        if self._end - self._start < total:
            self._fill(total)
        pos = self._start
        self._start = pos + total
        return key, version, pos + 8, pos + total


# -- request frames (rabbitmq-stream.md section 7; byte-exact against the section 11 examples) -----

from streamledger.protocol.rabbitmq import constants as _c  # noqa: E402


class _SpecLike(Protocol):
    def encode(self, w: Writer) -> Writer: ...


def peer_properties_frame(corr: int, properties: Mapping[str, str]) -> bytes:
    return Writer(_c.PEER_PROPERTIES).u32(corr).string_map(properties).frame()


def sasl_handshake_frame(corr: int) -> bytes:
    return Writer(_c.SASL_HANDSHAKE).u32(corr).frame()


def sasl_authenticate_frame(corr: int, mechanism: str, payload: bytes) -> bytes:
    return Writer(_c.SASL_AUTHENTICATE).u32(corr).string(mechanism).bytes_(payload).frame()


def tune_frame(frame_max: int, heartbeat: int) -> bytes:
    """The client's Tune reply (key 0x8014, as the Java client sends it)."""
    return Writer(_c.TUNE | _c.RESPONSE_BIT).u32(frame_max).u32(heartbeat).frame()


def open_frame(corr: int, vhost: str) -> bytes:
    return Writer(_c.OPEN).u32(corr).string(vhost).frame()


def close_frame(corr: int, code: int, reason: str) -> bytes:
    return Writer(_c.CLOSE).u32(corr).u16(code).string(reason).frame()


def heartbeat_frame() -> bytes:
    return encode_frame(_c.HEARTBEAT, 1)


def exchange_command_versions_frame(corr: int, commands: Iterable[tuple[int, int, int]]) -> bytes:
    items = list(commands)
    w = Writer(_c.EXCHANGE_COMMAND_VERSIONS).u32(corr).u32(len(items))
    for key, low, high in items:
        w.u16(key).u16(low).u16(high)
    return w.frame()


def declare_publisher_frame(corr: int, publisher_id: int, reference: str, stream: str) -> bytes:
    return Writer(_c.DECLARE_PUBLISHER).u32(corr).u8(publisher_id).string(reference).string(stream).frame()


PUBLISH_HEAD: Final = struct.Struct(">IHHBI")  # size, key, version, publisher id, count
PUBLISH_ENTRY: Final = struct.Struct(">QI")  # publishing id, simple-entry size (top bit 0)


def publish_frame(publisher_id: int, messages: Iterable[tuple[int, bytes]]) -> bytes:
    """Publish v1 with simple entries: ``(publishing id, message bytes)`` pairs."""
    parts: list[bytes] = []
    count = 0
    for publishing_id, message in messages:
        parts.append(PUBLISH_ENTRY.pack(publishing_id, len(message)))
        parts.append(message)
        count += 1
    body = b"".join(parts)
    return PUBLISH_HEAD.pack(9 + len(body), _c.PUBLISH, 1, publisher_id, count) + body


def subscribe_frame(
    corr: int, sub_id: int, stream: str, spec: _SpecLike, credit: int, properties: Mapping[str, str] | None
) -> bytes:
    w = Writer(_c.SUBSCRIBE).u32(corr).u8(sub_id).string(stream)
    spec.encode(w).u16(credit)
    if properties:
        w.string_map(properties)
    return w.frame()


def credit_frame(sub_id: int, credit: int) -> bytes:
    return Writer(_c.CREDIT).u8(sub_id).u16(credit).frame()


def unsubscribe_frame(corr: int, sub_id: int) -> bytes:
    return Writer(_c.UNSUBSCRIBE).u32(corr).u8(sub_id).frame()


def store_offset_frame(reference: str, stream: str, offset: int) -> bytes:
    return Writer(_c.STORE_OFFSET).string(reference).string(stream).u64(offset).frame()


def query_offset_frame(corr: int, reference: str, stream: str) -> bytes:
    return Writer(_c.QUERY_OFFSET).u32(corr).string(reference).string(stream).frame()


def stream_stats_frame(corr: int, stream: str) -> bytes:
    return Writer(_c.STREAM_STATS).u32(corr).string(stream).frame()


def metadata_frame(corr: int, streams: Iterable[str]) -> bytes:
    return Writer(_c.METADATA).u32(corr).string_array(streams).frame()


def create_frame(corr: int, stream: str, arguments: Mapping[str, str]) -> bytes:
    return Writer(_c.CREATE).u32(corr).string(stream).string_map(arguments).frame()
