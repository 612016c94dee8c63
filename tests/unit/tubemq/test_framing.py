"""Packet framing: block cutting, incremental decoding and the hard limits."""

from __future__ import annotations

import struct

import pytest

from streamledger.protocol.tubemq.errors import FrameError
from streamledger.protocol.tubemq.framing import (
    BLOCK_SIZE,
    MAX_LIST_SIZE,
    FrameDecoder,
    Packet,
    decode_packet,
    encode_packet,
)


def _blocks(packet: bytes) -> list[int]:
    _, _, count = struct.unpack_from(">Iii", packet)
    sizes, pos = [], 12
    for _ in range(count):
        (size,) = struct.unpack_from(">i", packet, pos)
        sizes.append(size)
        pos += 4 + size
    assert pos == len(packet)
    return sizes


def test_payload_is_cut_into_8192_byte_blocks() -> None:
    payload = bytes(range(256)) * 80  # 20480 bytes
    packet = encode_packet(7, payload)
    assert _blocks(packet) == [BLOCK_SIZE, BLOCK_SIZE, 20480 - 2 * BLOCK_SIZE]
    assert decode_packet(packet) == Packet(7, payload)


def test_small_and_empty_payloads() -> None:
    assert _blocks(encode_packet(1, b"x" * BLOCK_SIZE)) == [BLOCK_SIZE]
    empty = encode_packet(2, b"")
    assert empty == bytes.fromhex("ff7ff4fe 00000002 00000000")
    assert decode_packet(empty) == Packet(2, b"")


def test_negative_serial_round_trips() -> None:
    packet = encode_packet(-5, b"abc")
    assert packet[4:8] == b"\xff\xff\xff\xfb"
    assert decode_packet(packet).serial == -5
    with pytest.raises(FrameError, match="32-bit"):
        encode_packet(2**31, b"")


def test_decoder_accepts_byte_by_byte_and_several_packets_per_feed() -> None:
    stream = encode_packet(1, b"first" * 3000) + encode_packet(2, b"") + encode_packet(3, b"third")
    decoder = FrameDecoder()
    got: list[Packet] = []
    for i in range(len(stream)):
        got.extend(decoder.feed(stream[i : i + 1]))
    assert [p.serial for p in got] == [1, 2, 3]
    assert got[0].payload == b"first" * 3000
    assert decoder.buffered == 0
    decoder2 = FrameDecoder()
    assert [p.serial for p in decoder2.feed(stream)] == [1, 2, 3]


def test_receiver_does_not_rely_on_block_sizes() -> None:
    # A sender may cut differently; only the concatenation counts.
    packet = struct.pack(">Iii", 0xFF7FF4FE, 9, 3) + b"".join(
        struct.pack(">i", len(b)) + b for b in (b"ab", b"", b"cde")
    )
    assert decode_packet(packet) == Packet(9, b"abcde")


def test_bad_begin_token_is_rejected_from_the_first_byte() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match="begin token"):
        decoder.feed(b"\x00")
    with pytest.raises(FrameError, match="unusable"):
        decoder.feed(encode_packet(1, b""))
    with pytest.raises(FrameError, match="begin token"):
        decode_packet(b"\xff\x7f\xf4\xff" + bytes(8))


def test_list_size_limit() -> None:
    too_many = struct.pack(">Iii", 0xFF7FF4FE, 1, MAX_LIST_SIZE + 1)
    with pytest.raises(FrameError, match="list size"):
        FrameDecoder().feed(too_many)
    with pytest.raises(FrameError, match="list size"):
        FrameDecoder().feed(struct.pack(">Iii", 0xFF7FF4FE, 1, -1))
    with pytest.raises(FrameError, match="blocks"):
        encode_packet(1, b"\0" * (MAX_LIST_SIZE * BLOCK_SIZE + 1))


def test_block_length_limits_are_checked_before_reading_the_block() -> None:
    header = struct.pack(">Iii", 0xFF7FF4FE, 1, 1)
    with pytest.raises(FrameError, match="negative block length"):
        FrameDecoder().feed(header + struct.pack(">i", -3))
    # 2 GiB declared: rejected at once, nothing is allocated or awaited.
    with pytest.raises(FrameError, match="limit"):
        FrameDecoder().feed(header + struct.pack(">i", 2**31 - 1))
    small = FrameDecoder(max_payload=10)
    with pytest.raises(FrameError, match="10-byte limit"):
        small.feed(
            struct.pack(">Iii", 0xFF7FF4FE, 1, 2) + struct.pack(">i", 6) + b"x" * 6 + struct.pack(">i", 5)
        )


def test_truncated_and_trailing_input() -> None:
    packet = encode_packet(3, b"hello world")
    for cut in range(len(packet)):
        with pytest.raises(FrameError, match="truncated"):
            decode_packet(packet[:cut])
    with pytest.raises(FrameError, match="trailing"):
        decode_packet(packet + b"\xff")
