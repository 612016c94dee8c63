"""Wire layer: byte-exact frames from rabbitmq-stream.md section 11, primitive/frame round trips,
and broken input (truncated, corrupt, oversized) failing fast with a typed error."""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.connection import Connection, parse_version
from streamledger.protocol.rabbitmq.errors import (
    ConnectionClosed,
    FrameTooLarge,
    ProtocolError,
    StreamTimeout,
)
from streamledger.protocol.rabbitmq.offsets import OffsetSpec
from streamledger.protocol.rabbitmq.url import ConnectionParams
from streamledger.protocol.rabbitmq.wire import (
    FrameReader,
    Reader,
    Writer,
    close_frame,
    create_frame,
    credit_frame,
    declare_publisher_frame,
    decode_frame,
    encode_frame,
    exchange_command_versions_frame,
    heartbeat_frame,
    open_frame,
    peer_properties_frame,
    publish_frame,
    query_offset_frame,
    sasl_authenticate_frame,
    sasl_handshake_frame,
    store_offset_frame,
    stream_stats_frame,
    subscribe_frame,
    tune_frame,
)


def hx(text: str) -> bytes:
    return bytes.fromhex(text.replace("\n", " "))


AMQP_HELLO = hx("00 53 75 a0 05 68 65 6c 6c 6f")

# (builder output, bytes from the spec's section 11)
SPEC_VECTORS = [
    (peer_properties_frame(1, {"product": "mypy"}),
     "00 00 00 1b 00 11 00 01 00 00 00 01 00 00 00 01 00 07 70 72 6f 64 75 63 74 00 04 6d 79 70 79"),
    (sasl_handshake_frame(2), "00 00 00 08 00 12 00 01 00 00 00 02"),
    (sasl_authenticate_frame(3, "PLAIN", b"\0guest\0guest"),
     "00 00 00 1f 00 13 00 01 00 00 00 03 00 05 50 4c 41 49 4e 00 00 00 0c 00 67 75 65 73 74 00 67 75 65"
     " 73 74"),
    (tune_frame(1048576, 60), "00 00 00 0c 80 14 00 01 00 10 00 00 00 00 00 3c"),
    (open_frame(4, "/"), "00 00 00 0b 00 15 00 01 00 00 00 04 00 01 2f"),
    (declare_publisher_frame(8, 0, "", "s"), "00 00 00 0e 00 01 00 01 00 00 00 08 00 00 00 00 01 73"),
    (publish_frame(0, [(1, AMQP_HELLO)]),
     "00 00 00 1f 00 02 00 01 00 00 00 00 01 00 00 00 00 00 00 00 01 00 00 00 0a 00 53 75 a0 05 68 65 6c"
     " 6c 6f"),
    (subscribe_frame(5, 0, "s", OffsetSpec.first(), 10, None),
     "00 00 00 10 00 07 00 01 00 00 00 05 00 00 01 73 00 01 00 0a"),
    (subscribe_frame(6, 1, "s", OffsetSpec.offset(100), 10, {"name": "app"}),
     "00 00 00 27 00 07 00 01 00 00 00 06 01 00 01 73 00 04 00 00 00 00 00 00 00 64 00 0a"
     " 00 00 00 01 00 04 6e 61 6d 65 00 03 61 70 70"),
    (credit_frame(0, 1), "00 00 00 07 00 09 00 01 00 00 01"),
    (store_offset_frame("app", "s", 102),
     "00 00 00 14 00 0a 00 01 00 03 61 70 70 00 01 73 00 00 00 00 00 00 00 66"),
    (query_offset_frame(7, "app", "s"), "00 00 00 10 00 0b 00 01 00 00 00 07 00 03 61 70 70 00 01 73"),
    (exchange_command_versions_frame(10, [(c.DELIVER, 1, 2)]),
     "00 00 00 12 00 1b 00 01 00 00 00 0a 00 00 00 01 00 08 00 01 00 02"),
    (stream_stats_frame(11, "s"), "00 00 00 0b 00 1c 00 01 00 00 00 0b 00 01 73"),
    (create_frame(12, "s", {"max-length-bytes": "1000000"}),
     "00 00 00 2a 00 0d 00 01 00 00 00 0c 00 01 73 00 00 00 01 00 10 6d 61 78 2d 6c 65 6e 67"
     " 74 68 2d 62 79 74 65 73 00 07 31 30 30 30 30 30 30"),
    (heartbeat_frame(), "00 00 00 04 00 17 00 01"),
    (close_frame(9, 1, "OK"), "00 00 00 0e 00 16 00 01 00 00 00 09 00 01 00 02 4f 4b"),
]


@pytest.mark.parametrize("built, expected", SPEC_VECTORS, ids=[f"{i}" for i in range(len(SPEC_VECTORS))])
def test_request_frames_match_spec_bytes(built: bytes, expected: str) -> None:
    assert built == hx(expected)


def test_timestamp_offset_spec_is_signed() -> None:
    frame = subscribe_frame(1, 0, "s", OffsetSpec.timestamp(-1), 1, None)
    assert frame.endswith(hx("00 05 ff ff ff ff ff ff ff ff 00 01"))


def test_decode_spec_responses() -> None:
    # Close from the server for an unknown key (spec 7.23).
    key, version, r = decode_frame(hx("00 00 00 19 00 16 00 01 00 00 00 01 00 0d 00 0d") + b"unknown frame")
    assert (key, version, r.u32(), r.u16(), r.string()) == (c.CLOSE, 1, 1, c.UNKNOWN_FRAME, "unknown frame")
    # QueryOffset answer 102 (section 11).
    key, _, r = decode_frame(hx("00 00 00 12 80 0b 00 01 00 00 00 07 00 01 00 00 00 00 00 00 00 66"))
    assert key == c.QUERY_OFFSET | c.RESPONSE_BIT
    assert (r.u32(), r.u16(), r.u64()) == (7, c.OK, 102)
    assert r.at_end()
    # Server Tune (section 5.4).
    key, _, r = decode_frame(hx("00 00 00 0c 00 14 00 01 00 10 00 00 00 00 00 3c"))
    assert (key, r.u32(), r.u32()) == (c.TUNE, 1048576, 60)


def test_code_and_command_names() -> None:
    assert c.code_name(0x13) == "NO_OFFSET"
    assert c.code_name(0x7E) == "UNKNOWN_CODE_0x7e"
    assert c.command_name(0x801C) == "StreamStats"
    assert set(c.RESPONSE_CODE_NAMES) == set(range(1, 0x16))


def test_parse_version() -> None:
    assert parse_version("4.3.6") == (4, 3, 6)
    assert parse_version("3.10.8") == (3, 10, 8)
    assert parse_version("4.1.0-rc.1") == (4, 1, 0)
    assert parse_version("") is None
    assert parse_version("x") is None


# -- round trips ------------------------------------------------------------------------------------

text = st.text(max_size=60)
u8 = st.integers(0, 2**8 - 1)
u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@given(u8, u16, u32, u64, i64, text, st.binary(max_size=100) | st.none(),
       st.dictionaries(text, text, max_size=5), st.lists(text, max_size=5))
def test_primitive_round_trip(a: int, b: int, d: int, e: int, f: int, s: str, blob: bytes | None,
                              mapping: dict[str, str], items: list[str]) -> None:
    frame = (Writer(0x0042, 3).u8(a).u16(b).u32(d).u64(e).i64(f).string(s).bytes_(blob)
             .string_map(mapping).string_array(items).frame())
    key, version, r = decode_frame(frame)
    assert (key, version) == (0x0042, 3)
    assert (r.u8(), r.u16(), r.u32(), r.u64(), r.i64(), r.string(), r.bytes_()) == (a, b, d, e, f, s, blob)
    assert r.string_map() == mapping
    assert r.string_array() == items
    assert r.at_end()


def test_string_length_is_utf8_bytes() -> None:
    frame = Writer(1).string("é€").frame()
    assert frame[8:10] == b"\x00\x05"  # 2 + 3 UTF-8 bytes, not 2 characters
    assert Reader(frame, 8).string() == "é€"


def test_null_string_reads_empty() -> None:
    assert Reader(b"\xff\xff").string() == ""
    assert Writer(None).string(None).frame()[4:] == b"\xff\xff"


def test_string_too_long_is_refused() -> None:
    with pytest.raises(ProtocolError, match="too long"):
        Writer(1).string("x" * 40_000)


class Feed:
    """A recv_into source handing out pre-recorded bytes in given slice sizes."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data = data
        self.pos = 0
        self.sizes = sizes or [len(data) or 1]
        self.i = 0
        self.calls = 0

    def __call__(self, view: memoryview) -> int:
        self.calls += 1
        if self.pos >= len(self.data):
            return 0
        step = self.sizes[self.i % len(self.sizes)]
        self.i += 1
        n = min(step, len(view), len(self.data) - self.pos)
        view[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


frames_strategy = st.lists(
    st.tuples(st.integers(0, 0xFFFF), st.integers(0, 3), st.binary(max_size=3000)), min_size=1, max_size=12
)


@settings(max_examples=150)
@given(frames_strategy, st.lists(st.integers(1, 700), min_size=1, max_size=5),
       st.sampled_from([16, 64, 4096]))
def test_frame_reader_reassembles_any_split(
    frames: list[tuple[int, int, bytes]], sizes: list[int], buffer_size: int
) -> None:
    stream = b"".join(encode_frame(k, v, p) for k, v, p in frames)
    reader = FrameReader(Feed(stream, sizes), buffer_size=buffer_size, max_frame=1 << 20)
    for key, version, payload in frames:
        k, v, pos, end = reader.next_frame()
        assert (k, v, bytes(reader.buf[pos:end])) == (key, version, payload)
    with pytest.raises(ConnectionClosed):
        reader.next_frame()


@given(st.binary(min_size=0, max_size=200), st.integers(0, 199))
def test_truncated_frames_give_typed_errors(payload: bytes, cut: int) -> None:
    frame = encode_frame(0x8011, 1, payload)
    cut = min(cut, len(frame) - 1)
    with pytest.raises(ProtocolError):
        decode_frame(frame[:cut])
    reader = FrameReader(Feed(frame[:cut], [7]), max_frame=1 << 20)
    with pytest.raises(ConnectionClosed):
        reader.next_frame()


@given(st.binary(max_size=64))
def test_reader_overrun_is_protocol_error(payload: bytes) -> None:
    r = Reader(payload, 0, len(payload), "test frame")
    with pytest.raises(ProtocolError, match="truncated test frame"):
        for _ in range(100):
            r.u64()


def test_corrupt_counts_and_lengths() -> None:
    # An array count of 2**31-1 in a 10-byte frame must not allocate or loop.
    with pytest.raises(ProtocolError, match="does not fit"):
        Reader(hx("7f ff ff ff 00 00")).string_array()
    with pytest.raises(ProtocolError, match="negative"):
        Reader(hx("80 00")).string()
    with pytest.raises(ProtocolError, match="negative"):
        Reader(hx("80 00 00 00")).bytes_()
    with pytest.raises(ProtocolError, match="UTF-8"):
        Reader(hx("00 02 ff fe")).string()
    with pytest.raises(ProtocolError, match="minimum"):
        FrameReader(Feed(hx("00 00 00 02 00 17 00 01"), [8]), max_frame=100).next_frame()
    with pytest.raises(ProtocolError, match="size field"):
        decode_frame(hx("00 00 00 09 00 17 00 01"))


def test_oversized_length_prefix_fails_before_allocating() -> None:
    feed = Feed(hx("7f ff ff ff 00 08 00 01") + b"\0" * 100, [1 << 20])
    reader = FrameReader(feed, buffer_size=64, max_frame=1 << 20)
    started = time.perf_counter()
    with pytest.raises(FrameTooLarge, match="exceeds"):
        reader.next_frame()
    assert time.perf_counter() - started < 1.0
    assert len(reader.buf) == 64  # nothing was grown for the bogus 2 GiB frame
    assert feed.calls == 1


def _pair_connection(frame_max: int, timeout: float = 0.5) -> tuple[Connection, socket.socket]:
    ours, theirs = socket.socketpair()
    conn = Connection(ConnectionParams(), ours, timeout=timeout)
    conn._opened = True  # as after a real Open: the negotiated limit applies
    conn.frame_max = frame_max
    return conn, theirs


def test_outgoing_frames_honour_frame_max() -> None:
    conn, peer = _pair_connection(4096)
    try:
        ok = encode_frame(c.HEARTBEAT, 1, b"\0" * (4096 - 4))  # Size == frame_max is allowed
        conn.send(ok)
        assert peer.recv(8192) == ok
        with pytest.raises(FrameTooLarge, match="4097 bytes exceeds the negotiated frame max 4096"):
            conn.send(encode_frame(c.HEARTBEAT, 1, b"\0" * (4096 - 3)))
    finally:
        conn._shutdown_socket()
        peer.close()


def test_request_answers_server_close_and_times_out() -> None:
    conn, peer = _pair_connection(4096)
    try:
        # Nothing answers: a typed timeout, not a hang.
        started = time.perf_counter()
        with pytest.raises(StreamTimeout, match="the StreamStats response"):
            conn.request(c.STREAM_STATS, 5, stream_stats_frame(5, "s"), timeout=0.2)
        assert time.perf_counter() - started < 2.0
        # The server closes instead of answering (as 3.10 does for an unknown key).
        peer.sendall(hx("00 00 00 19 00 16 00 01 00 00 00 01 00 0d 00 0d") + b"unknown frame")
        with pytest.raises(ConnectionClosed, match="UNKNOWN_FRAME"):
            conn.request(c.STREAM_STATS, 6, stream_stats_frame(6, "s"))
        peer.settimeout(1)
        data = peer.recv(4096)
        assert hx("00 00 00 0a 80 16 00 01 00 00 00 01 00 01") in data  # our Close reply
        assert conn.closed
    finally:
        conn._shutdown_socket()
        peer.close()


def test_route_response_without_response_bit_is_accepted() -> None:
    """3.10.8 answers Route/Partitions with keys 0x0018/0x0019 (spec section 2)."""
    conn, peer = _pair_connection(4096)
    try:
        answer = Writer(c.PARTITIONS).u32(3).u16(c.OK).string_array(["x-0", "x-1"]).frame()
        peer.sendall(answer)
        code, r = conn.request(c.PARTITIONS, 3, Writer(c.PARTITIONS).u32(3).string("x").frame())
        assert (code, r.string_array()) == (c.OK, ["x-0", "x-1"])
    finally:
        conn._shutdown_socket()
        peer.close()
