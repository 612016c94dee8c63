"""Frame encoding and decoding rules: declared fields, integer widths, hard length limits."""

from __future__ import annotations

import struct

import bson
import pytest
from bson.int64 import Int64

from streamledger.errors import StreamledgerError
from streamledger.protocol.mewbase import FrameError, FrameLengthError, InvalidRequest
from streamledger.protocol.mewbase.frames import FrameDecoder, decode_event, decode_frame, encode_frame


def frame(kind: str, body: dict[str, object]) -> bytes:
    return bson.encode({"type": kind, "frame": body})


RESPONSE_OK = frame("RESPONSE", {"ok": True, "rID": 1})


# -- encoding ---------------------------------------------------------------------------------------


def test_mandatory_fields_and_unknown_fields_are_refused() -> None:
    with pytest.raises(InvalidRequest, match=r"PUBLISH\.rID is mandatory"):
        encode_frame("PUBLISH", {"channel": "c", "event": {}})
    with pytest.raises(InvalidRequest, match="has no field"):
        encode_frame("ACKEV", {"subID": 1, "bytes": 10})
    with pytest.raises(InvalidRequest, match="unknown frame type"):
        encode_frame("PING", {})


def test_integer_widths_are_enforced() -> None:
    with pytest.raises(InvalidRequest, match="does not fit int32"):
        encode_frame("ACKEV", {"subID": 2**31})
    with pytest.raises(InvalidRequest, match="does not fit int64"):
        encode_frame("ACKEV", {"subID": 1, "pos": 2**63})
    with pytest.raises(InvalidRequest, match="must be an integer"):
        encode_frame("ACKEV", {"subID": True})
    # A small int64 field is still written as int64 (0x12), never narrowed to int32.
    data = encode_frame("ACKEV", {"subID": 1, "pos": 5})
    assert b"\x12pos\x00" in data
    assert bson.decode(data)["frame"]["pos"].__class__ is Int64


def test_invalid_event_bytes_and_values_are_refused_before_sending() -> None:
    with pytest.raises(InvalidRequest, match="not one BSON document"):
        encode_frame("PUBLISH", {"channel": "c", "event": b"\x05\x00\x00", "rID": 1})
    with pytest.raises(InvalidRequest, match="invalid BSON document"):
        encode_frame("PUBLISH", {"channel": "c", "event": b"\x06\x00\x00\x00\x09\x00", "rID": 1})
    with pytest.raises(InvalidRequest, match="cannot encode"):
        encode_frame("PUBLISH", {"channel": "c", "event": {"x": object()}, "rID": 1})
    with pytest.raises(InvalidRequest, match="NUL"):
        encode_frame("PUBLISH", {"channel": "c\x00d", "event": {}, "rID": 1})
    with pytest.raises(InvalidRequest, match="exceeds the 64-byte limit"):
        encode_frame("PUBLISH", {"channel": "c", "event": {"pad": "x" * 100}, "rID": 1}, max_size=64)


# -- decoding ---------------------------------------------------------------------------------------


def test_decoder_checks_the_length_prefix_before_waiting_for_more() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    # 4 bytes announcing 2 GiB: refused at once, nothing else read or allocated.
    with pytest.raises(FrameLengthError) as info:
        decoder.feed(struct.pack("<i", 2**31 - 1))
    assert info.value.length == 2**31 - 1 and info.value.limit == 1024
    assert decoder.buffered == 0
    assert "outside the accepted 5..1024" in str(info.value)
    # The decoder stays unusable: the stream position is lost.
    with pytest.raises(FrameError, match="unusable"):
        decoder.feed(RESPONSE_OK)


@pytest.mark.parametrize("length", [-1, 0, 4, 1025])
def test_lengths_below_5_or_above_the_maximum_are_typed_errors(length: int) -> None:
    with pytest.raises(FrameLengthError):
        FrameDecoder(max_frame_size=1024).feed(struct.pack("<i", length) + b"\x00" * 8)


def test_frame_length_errors_are_streamledger_errors() -> None:
    assert issubclass(FrameLengthError, FrameError)
    assert issubclass(FrameError, StreamledgerError)


def test_decoder_reassembles_frames_fed_byte_by_byte_and_many_at_once() -> None:
    recev = frame("RECEV", {"subID": 0, "timestamp": Int64(1), "pos": Int64(10), "event": {"a": 1}})
    stream = RESPONSE_OK + recev + RESPONSE_OK
    decoder = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got.extend(decoder.feed(stream[i : i + 1]))
        if i < 3:
            assert decoder.pending is None
    assert [f.type for f in got] == ["RESPONSE", "RECEV", "RESPONSE"]
    assert decoder.buffered == 0 and decoder.wanted() == 4
    assert [f.type for f in FrameDecoder().feed(stream)] == ["RESPONSE", "RECEV", "RESPONSE"]
    assert got[1].event == bson.encode({"a": 1})


def test_server_frames_must_follow_their_declaration() -> None:
    with pytest.raises(FrameError, match="lacks mandatory field pos"):
        decode_frame(frame("RECEV", {"subID": 0, "timestamp": 1, "event": {}}))
    with pytest.raises(FrameError, match=r"RESPONSE\.ok is str"):
        decode_frame(frame("RESPONSE", {"ok": "yes", "rID": 1}))
    with pytest.raises(FrameError, match="expected int32"):
        decode_frame(frame("RESPONSE", {"ok": True, "rID": 1.5}))
    with pytest.raises(FrameError, match="does not fit int32"):
        decode_frame(frame("RESPONSE", {"ok": True, "rID": Int64(2**40)}))
    with pytest.raises(FrameError, match="unexpected frame type 'PUBLISH'"):
        decode_frame(frame("PUBLISH", {"channel": "c", "event": {}, "rID": 1}))
    with pytest.raises(FrameError, match="without a string 'type'"):
        decode_frame(bson.encode({"frame": {}}))
    with pytest.raises(FrameError, match="without a 'frame' document"):
        decode_frame(bson.encode({"type": "RESPONSE", "frame": 3}))
    with pytest.raises(FrameError, match="invalid BSON"):
        decode_frame(b"\x0a\x00\x00\x00\x02a\x00\xff\xff\x00")


def test_javascript_code_is_no_string_in_a_frame() -> None:
    """BSON JavaScript code (type 0x0D) decodes to ``bson.code.Code``, a ``str`` subclass that is not
    hashable: as a frame's 'type' it raised TypeError out of the decoder (found by
    test_fuzz.py::test_incremental_decoder_gives_frames_or_frame_error), and as a string field it
    passed for a string. A BSON string is exactly ``str``."""
    from bson.code import Code

    with pytest.raises(FrameError, match="without a string 'type'"):
        decode_frame(bson.encode({"type": Code("RESPONSE"), "frame": {"ok": True, "rID": 1}}))
    with pytest.raises(FrameError, match=r"RESPONSE\.errMsg is Code, expected a string"):
        decode_frame(frame("RESPONSE", {"ok": False, "rID": 1, "errMsg": Code("x")}))
    with pytest.raises(FrameError, match=r"RESPONSE\.errCode is Code, expected a string or an integer"):
        decode_frame(frame("RESPONSE", {"ok": False, "rID": 1, "errCode": Code("x")}))


def test_either_integer_width_is_accepted_and_errcode_may_be_numeric() -> None:
    body = decode_frame(frame("RESPONSE", {"ok": False, "rID": Int64(7), "errCode": 3})).body
    assert body["rID"] == 7 and body["errCode"] == 3
    recev = decode_frame(frame("RECEV", {"subID": 0, "timestamp": 5, "pos": 9, "event": {}}))
    assert recev.body["pos"] == 9


def test_decode_event_turns_bad_bytes_into_frame_errors() -> None:
    assert decode_event(bson.encode({"k": "v"})) == {"k": "v"}
    with pytest.raises(FrameError):
        decode_event(b"\x05\x00\x00\x00\x01")
    # Datetimes outside Python's range do not break decoding.
    far = decode_event(b"\x10\x00\x00\x00\x09d\x00" + struct.pack("<q", 2**62) + b"\x00")
    assert int(far["d"]) == 2**62


def test_event_slicing_skips_every_bson_type_before_it() -> None:
    import datetime
    import re

    from bson import Code, DBRef, Decimal128, MaxKey, MinKey, ObjectId, Regex, Timestamp

    extra = {
        "f": 1.5,
        "s": "str",
        "d": {"n": 1},
        "a": [1, "x"],
        "b": b"\x00\x01",
        "oid": ObjectId(),
        "t": True,
        "dt": datetime.datetime(2026, 1, 1),
        "n": None,
        "re": Regex("a.*", "i"),
        "re2": re.compile("b+"),
        "code": Code("f()"),
        "scoped": Code("g()", {"x": 1}),
        "i32": 7,
        "ts": Timestamp(1, 2),
        "i64": Int64(9),
        "dec": Decimal128("1.5"),
        "min": MinKey(),
        "max": MaxKey(),
        "ref": DBRef("c", 1),
    }
    event = {"payload": "x" * 10}
    data = frame("RECEV", {**extra, "subID": 0, "timestamp": Int64(1), "pos": Int64(2), "event": event})
    assert decode_frame(data).event == bson.encode(event)
