"""TubeMQ packet framing: begin token, serial number, and a list of length-prefixed blocks.

Wire layout (big-endian)::

    BeginToken:uint32 = 0xFF7FF4FE | SerialNo:int32 | ListSize:int32 | (Length:int32 Bytes)*ListSize

The blocks only exist for the transport: senders cut the RPC payload into 8192-byte pieces and
receivers concatenate them. The decoder is incremental (it accepts whatever ``recv`` returned) and
checks every declared size *before* waiting for the bytes, so a hostile or corrupt peer can make it
raise :class:`FrameError` but never allocate beyond ``max_payload`` nor wait for data that could
never be valid.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from streamledger.protocol.tubemq.errors import FrameError

__all__ = [
    "BEGIN_TOKEN",
    "BLOCK_SIZE",
    "HEADER_SIZE",
    "MAX_LIST_SIZE",
    "MAX_PAYLOAD",
    "FrameDecoder",
    "Packet",
    "decode_packet",
    "encode_packet",
]

BEGIN_TOKEN = 0xFF7FF4FE
BLOCK_SIZE = 8192
# (20 MiB + 8 MiB) / 8192: the Java decoder rejects larger block counts.
MAX_LIST_SIZE = 3584
MAX_PAYLOAD = MAX_LIST_SIZE * BLOCK_SIZE
HEADER_SIZE = 12

_HEADER = struct.Struct(">Iii")
_LENGTH = struct.Struct(">i")
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_TOKEN_BYTES = BEGIN_TOKEN.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class Packet:
    """One decoded packet: the serial number that correlates request and response, and the payload."""

    serial: int
    payload: bytes


def encode_packet(serial: int, payload: bytes, *, block_size: int = BLOCK_SIZE) -> bytes:
    """Frame ``payload`` under ``serial``, cut into ``block_size`` pieces (the last one shorter)."""
    if not _INT32_MIN <= serial <= _INT32_MAX:
        raise FrameError(f"serial number {serial} does not fit a signed 32-bit integer")
    if block_size <= 0:
        raise FrameError(f"block size must be positive, got {block_size}")
    blocks = [payload[i : i + block_size] for i in range(0, len(payload), block_size)]
    if len(blocks) > MAX_LIST_SIZE:
        raise FrameError(
            f"payload of {len(payload)} bytes needs {len(blocks)} blocks, "
            f"more than the {MAX_LIST_SIZE} allowed"
        )
    parts = [_HEADER.pack(BEGIN_TOKEN, serial, len(blocks))]
    for block in blocks:
        parts.append(_LENGTH.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


class FrameDecoder:
    """Incremental packet decoder with hard limits.

    ``feed(data)`` returns the packets completed by ``data``. After a :class:`FrameError` the
    stream position is lost, so the decoder refuses further input (the connection must be closed,
    as the Java peer does on a bad token).
    """

    def __init__(self, *, max_payload: int = MAX_PAYLOAD, max_list_size: int = MAX_LIST_SIZE) -> None:
        if max_payload < 0 or max_list_size < 0:
            raise ValueError("limits must not be negative")
        self._max_payload = max_payload
        self._max_list_size = max_list_size
        self._buf = bytearray()
        self._pos = 0
        self._failed: FrameError | None = None
        # State of the packet being assembled (None until its header arrived).
        self._serial: int | None = None
        self._blocks_left = 0
        self._block_len: int | None = None
        self._parts: list[bytes] = []
        self._size = 0

    @property
    def buffered(self) -> int:
        """Bytes held that belong to an incomplete packet (0 between packets)."""
        return len(self._buf) + self._size + (HEADER_SIZE if self._serial is not None else 0)

    def feed(self, data: bytes) -> list[Packet]:
        """Consume ``data`` and return every packet it completes, in order."""
        if self._failed is not None:
            raise FrameError(f"decoder unusable after an earlier framing error ({self._failed})")
        self._buf += data
        self._pos = 0
        packets: list[Packet] = []
        try:
            while True:
                packet = self._step()
                if packet is None:
                    break
                packets.append(packet)
        except FrameError as exc:
            self._failed = exc
            self._buf.clear()
            self._parts.clear()
            raise
        # Compact once per feed: slicing per block would be quadratic on large payloads.
        del self._buf[: self._pos]
        self._pos = 0
        return packets

    def _step(self) -> Packet | None:
        buf, pos = self._buf, self._pos
        if self._serial is None:
            avail = len(buf) - pos
            if avail < HEADER_SIZE:
                # Reject a wrong token as early as its first bytes allow.
                seen = bytes(buf[pos : pos + min(avail, 4)])
                if seen != _TOKEN_BYTES[: len(seen)]:
                    raise FrameError(f"bad begin token {seen.hex()} (expected ff7ff4fe)")
                return None
            token, serial, count = _HEADER.unpack_from(buf, pos)
            if token != BEGIN_TOKEN:
                raise FrameError(f"bad begin token 0x{token:08x} (expected 0x{BEGIN_TOKEN:08x})")
            if not 0 <= count <= self._max_list_size:
                raise FrameError(f"list size {count} outside 0..{self._max_list_size} (serial {serial})")
            pos += HEADER_SIZE
            self._serial, self._blocks_left, self._size = serial, count, 0
        while self._blocks_left > 0:
            if self._block_len is None:
                if len(buf) - pos < 4:
                    self._pos = pos
                    return None
                (length,) = _LENGTH.unpack_from(buf, pos)
                if length < 0:
                    raise FrameError(f"negative block length {length} (serial {self._serial})")
                if self._size + length > self._max_payload:
                    raise FrameError(
                        f"payload exceeds the {self._max_payload}-byte limit "
                        f"(block of {length} after {self._size} bytes, serial {self._serial})"
                    )
                pos += 4
                self._block_len = length
            if len(buf) - pos < self._block_len:
                self._pos = pos
                return None
            self._parts.append(bytes(buf[pos : pos + self._block_len]))
            pos += self._block_len
            self._size += self._block_len
            self._block_len = None
            self._blocks_left -= 1
        self._pos = pos
        packet = Packet(self._serial, b"".join(self._parts))
        self._serial, self._parts, self._size = None, [], 0
        return packet


def decode_packet(data: bytes, *, max_payload: int = MAX_PAYLOAD) -> Packet:
    """Decode exactly one complete packet; truncated input or trailing bytes raise :class:`FrameError`."""
    decoder = FrameDecoder(max_payload=max_payload)
    packets = decoder.feed(data)
    if not packets:
        raise FrameError(f"truncated packet: {len(data)} bytes do not complete a frame")
    if len(packets) > 1 or decoder.buffered:
        raise FrameError("trailing bytes after the packet")
    return packets[0]
