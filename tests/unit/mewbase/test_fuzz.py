"""Fuzzing the frame decoder: any input ends in frames or a typed FrameError, never a hang, another
exception, or a buffer beyond the configured limit.

Hangs are caught by pytest-timeout; Hypothesis' per-example deadline is off (shared, noisy machine).
"""

from __future__ import annotations

import struct

import bson
from bson.int64 import Int64
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamledger.protocol.mewbase.errors import FrameError
from streamledger.protocol.mewbase.frames import FrameDecoder, decode_frame

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMIT = 4096

_VALID = [
    bson.encode({"type": "RESPONSE", "frame": {"ok": True, "rID": 1}}),
    bson.encode({"type": "SUBRESPONSE", "frame": {"ok": True, "rID": 2, "subID": 0}}),
    bson.encode(
        {
            "type": "RECEV",
            "frame": {
                "subID": 0,
                "timestamp": Int64(1),
                "pos": Int64(2),
                "event": {"a": [1, 2.5, "x", None, True]},
            },
        }
    ),
    bson.encode({"type": "QUERYRESPONSE", "frame": {"queryID": 1, "ok": True, "numResults": 1}}),
    bson.encode({"type": "QUERYRESULT", "frame": {"queryID": 1, "result": {"id": "x"}, "last": True}}),
]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    """Valid frames with bytes flipped, cut or inserted: they get past the length check."""
    data = bytearray(b"".join(draw(st.lists(st.sampled_from(_VALID), min_size=1, max_size=4))))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[i : i + draw(st.integers(1, 8))]
        else:
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@st.composite
def _length_led(draw: st.DrawFn) -> bytes:
    length = draw(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 64))
    return struct.pack("<i", length) + draw(st.binary(max_size=200))


@FUZZ
@given(st.binary(max_size=300) | _mutated() | _length_led(), st.lists(st.integers(1, 97), max_size=30))
def test_incremental_decoder_gives_frames_or_frame_error(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_frame_size=LIMIT)
    pos = 0
    try:
        for size in [*cuts, len(data)]:
            for f in decoder.feed(data[pos : pos + size]):
                assert f.size <= LIMIT and isinstance(f.body, dict)
                if f.type == "RECEV":
                    assert f.event is not None
            pos += size
            assert decoder.buffered <= LIMIT + 97 + len(data)
            if decoder.pending is not None:
                assert 5 <= decoder.pending <= LIMIT
    except FrameError:
        pass


@FUZZ
@given(_mutated() | st.binary(max_size=200))
def test_decode_frame_gives_a_frame_or_frame_error(data: bytes) -> None:
    try:
        decoded = decode_frame(data)
    except FrameError:
        return
    assert decoded.size == len(data)


@FUZZ
@given(st.lists(st.sampled_from(_VALID), min_size=1, max_size=8), st.lists(st.integers(1, 50), max_size=40))
def test_valid_streams_decode_identically_however_they_are_cut(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frames)
    decoder = FrameDecoder(max_frame_size=LIMIT)
    got = []
    pos = 0
    for size in [*cuts, len(stream)]:
        got.extend(decoder.feed(stream[pos : pos + size]))
        pos += size
    assert [f.size for f in got] == [len(f) for f in frames]
    assert [bson.encode({"type": f.type, "frame": f.body}) for f in got] == frames
    assert decoder.buffered == 0


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text("abc", max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


@FUZZ
@given(
    st.dictionaries(st.text("xyz", min_size=1, max_size=4), _VALUES, max_size=4),
    st.dictionaries(st.text("ab", max_size=4), _VALUES, max_size=4),
)
def test_recev_event_bytes_are_sliced_exactly(extra: dict[str, object], event: dict[str, object]) -> None:
    """Whatever fields a server puts around the event, the event's bytes come out unchanged."""
    body = {**extra, "subID": 1, "timestamp": Int64(2), "pos": Int64(3), "event": event}
    decoded = FrameDecoder(max_frame_size=1 << 20).feed(bson.encode({"type": "RECEV", "frame": body}))
    assert decoded[0].event == bson.encode(event)
