"""Fuzzing the decoders: any input ends in a packet or a typed error, never a hang or a huge buffer.

Hangs are caught by pytest-timeout; there are no timing assertions. Hypothesis' per-example
deadline is off because the machine is shared and timings are noisy.
"""

from __future__ import annotations

import random
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamledger.protocol.tubemq.errors import FrameError, TubeMQProtocolError
from streamledger.protocol.tubemq.framing import BEGIN_TOKEN, FrameDecoder, decode_packet, encode_packet
from streamledger.protocol.tubemq.rpc import decode_request, decode_response, encode_request, encode_response

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_TOKEN = struct.pack(">I", BEGIN_TOKEN)


@st.composite
def _header_led(draw: st.DrawFn) -> bytes:
    """Inputs that start with a valid token, so the decoder gets past the first check."""
    serial = draw(st.integers(-(2**31), 2**31 - 1))
    count = draw(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 4))
    tail = draw(st.binary(max_size=300))
    return _TOKEN + struct.pack(">ii", serial, count) + tail


@FUZZ
@given(st.binary(max_size=400) | _header_led())
def test_decode_packet_random_input_gives_packet_or_frame_error(data: bytes) -> None:
    try:
        packet = decode_packet(data, max_payload=1 << 16)
    except FrameError:
        return
    assert len(packet.payload) <= len(data)


@FUZZ
@given(_header_led(), st.lists(st.integers(1, 64), max_size=20))
def test_incremental_decoder_stays_bounded(data: bytes, cuts: list[int]) -> None:
    limit = 1 << 12
    decoder = FrameDecoder(max_payload=limit)
    pos = 0
    try:
        for size in [*cuts, len(data)]:
            decoder.feed(data[pos : pos + size])
            pos += size
            # Never more buffered than one packet's limit plus its framing overhead.
            assert decoder.buffered <= limit + 12 + 4 + 64 + len(data)
    except FrameError:
        pass


@FUZZ
@given(st.binary(min_size=0, max_size=3 * 8192 + 100), st.integers(-(2**31), 2**31 - 1), st.data())
def test_every_truncation_of_a_valid_packet_is_a_typed_error(
    payload: bytes, serial: int, data: st.DataObject
) -> None:
    packet = encode_packet(serial, payload)
    cut = data.draw(st.integers(0, len(packet) - 1))
    try:
        decode_packet(packet[:cut])
    except FrameError as exc:
        assert "truncated" in str(exc)
    else:  # pragma: no cover - would be a decoder bug
        raise AssertionError("a truncated packet decoded")
    assert decode_packet(packet).payload == payload


@FUZZ
@given(st.binary(max_size=200))
def test_rpc_payload_decoders_raise_typed_errors(data: bytes) -> None:
    for decode in (decode_request, decode_response):
        try:
            decode(data)
        except TubeMQProtocolError:
            pass


def test_seeded_random_mutations_of_real_packets() -> None:
    rng = random.Random(20261122)
    valid = [
        encode_packet(1, encode_request(1, b"\x0a\x01x", timeout_ms=10000)),
        encode_packet(2, encode_response(2, b"\x08\x01" * 5000)),
    ]
    outcomes = {"packet": 0, "error": 0, "incomplete": 0}
    for _ in range(3000):
        data = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            del data[rng.randrange(len(data)) :]
        decoder = FrameDecoder(max_payload=1 << 20)
        try:
            packets = decoder.feed(bytes(data))
        except FrameError:
            outcomes["error"] += 1
            continue
        outcomes["packet" if packets else "incomplete"] += 1
        for packet in packets:
            try:
                decode_response(packet.payload)
            except TubeMQProtocolError:
                pass
    assert outcomes["error"] > 0 and outcomes["packet"] > 0
