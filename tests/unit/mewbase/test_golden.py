"""Golden frames: bytes written out by hand from the spec (BSON layout + the draft's frame fields).

Each frame is spelled element by element (type byte, C-string name, value) with its lengths counted by
hand, then checked three ways: the client's encoder produces exactly these bytes, pymongo's
``bson.encode`` of the same document does too, and the client's decoder reads server frames back.
"""

from __future__ import annotations

from typing import Any

import bson
import pytest
from bson.int64 import Int64

from streamledger.protocol.mewbase.frames import CLIENT_FRAMES, decode_frame, encode_frame


def le32(n: int) -> bytes:
    return n.to_bytes(4, "little", signed=True)


def le64(n: int) -> bytes:
    return n.to_bytes(8, "little", signed=True)


# CONNECT {version: "1.0", username: "tim", password: "1234"} (the draft's own example)
CONNECT = b"".join([
    b"\x59\x00\x00\x00",                                   # outer length 89
    b"\x02", b"type\x00", b"\x08\x00\x00\x00", b"CONNECT\x00",
    b"\x03", b"frame\x00",
    b"\x3b\x00\x00\x00",                                   # inner length 59
    b"\x02", b"version\x00", b"\x04\x00\x00\x00", b"1.0\x00",
    b"\x02", b"username\x00", b"\x04\x00\x00\x00", b"tim\x00",
    b"\x02", b"password\x00", b"\x05\x00\x00\x00", b"1234\x00",
    b"\x00",                                               # end of frame
    b"\x00",                                               # end of outer document
])

# PUBLISH {channel: "orders", event: {id: 7}, rID: 1, sessID: 3}: rID and sessID are int32 (0x10)
PUBLISH = b"".join([
    b"\x60\x00\x00\x00",                                   # 96
    b"\x02", b"type\x00", b"\x08\x00\x00\x00", b"PUBLISH\x00",
    b"\x03", b"frame\x00", b"\x42\x00\x00\x00",            # 66
    b"\x02", b"channel\x00", b"\x07\x00\x00\x00", b"orders\x00",
    b"\x03", b"event\x00", b"\x0d\x00\x00\x00", b"\x10", b"id\x00", le32(7), b"\x00",
    b"\x10", b"rID\x00", le32(1),
    b"\x10", b"sessID\x00", le32(3),
    b"\x00", b"\x00",
])

# SUBSCRIBE {channel: "orders", rID: 2, startPos: 1024 (int64, 0x12), durableID: "orders/p1"}
SUBSCRIBE = b"".join([
    b"\x6d\x00\x00\x00",                                   # 109
    b"\x02", b"type\x00", b"\x0a\x00\x00\x00", b"SUBSCRIBE\x00",
    b"\x03", b"frame\x00", b"\x4d\x00\x00\x00",            # 77
    b"\x02", b"channel\x00", b"\x07\x00\x00\x00", b"orders\x00",
    b"\x10", b"rID\x00", le32(2),
    b"\x12", b"startPos\x00", le64(1024),
    b"\x02", b"durableID\x00", b"\x0a\x00\x00\x00", b"orders/p1\x00",
    b"\x00", b"\x00",
])

# ACKEV {subID: 0, pos: 1024}: pos is our addition (conventions, choice 5), int64
ACKEV = b"".join([
    b"\x39\x00\x00\x00",                                   # 57
    b"\x02", b"type\x00", b"\x06\x00\x00\x00", b"ACKEV\x00",
    b"\x03", b"frame\x00", b"\x1d\x00\x00\x00",            # 29
    b"\x10", b"subID\x00", le32(0),
    b"\x12", b"pos\x00", le64(1024),
    b"\x00", b"\x00",
])

# QUERY {queryID: 1, binder: "_mb.durableSubs", matcher: {id: "orders/p1"}}
QUERY = b"".join([
    b"\x6a\x00\x00\x00",                                   # 106
    b"\x02", b"type\x00", b"\x06\x00\x00\x00", b"QUERY\x00",
    b"\x03", b"frame\x00", b"\x4e\x00\x00\x00",            # 78
    b"\x10", b"queryID\x00", le32(1),
    b"\x02", b"binder\x00", b"\x10\x00\x00\x00", b"_mb.durableSubs\x00",
    b"\x03", b"matcher\x00", b"\x17\x00\x00\x00",
    b"\x02", b"id\x00", b"\x0a\x00\x00\x00", b"orders/p1\x00", b"\x00",
    b"\x00", b"\x00",
])

# RESPONSE {ok: false, rID: 5, errCode: "NO_SUCH_CHANNEL", errMsg: "no channel x"}
RESPONSE = b"".join([
    b"\x68\x00\x00\x00",                                   # 104
    b"\x02", b"type\x00", b"\x09\x00\x00\x00", b"RESPONSE\x00",
    b"\x03", b"frame\x00", b"\x49\x00\x00\x00",            # 73
    b"\x08", b"ok\x00", b"\x00",
    b"\x10", b"rID\x00", le32(5),
    b"\x02", b"errCode\x00", b"\x10\x00\x00\x00", b"NO_SUCH_CHANNEL\x00",
    b"\x02", b"errMsg\x00", b"\x0d\x00\x00\x00", b"no channel x\x00",
    b"\x00", b"\x00",
])

# RECEV {subID: 0, timestamp: 1700000000000, pos: 4096, event: {id: 7}}: timestamp and pos int64
RECEV = b"".join([
    b"\x60\x00\x00\x00",                                   # 96
    b"\x02", b"type\x00", b"\x06\x00\x00\x00", b"RECEV\x00",
    b"\x03", b"frame\x00", b"\x44\x00\x00\x00",            # 68
    b"\x10", b"subID\x00", le32(0),
    b"\x12", b"timestamp\x00", b"\x00\x68\xe5\xcf\x8b\x01\x00\x00",
    b"\x12", b"pos\x00", b"\x00\x10\x00\x00\x00\x00\x00\x00",
    b"\x03", b"event\x00", b"\x0d\x00\x00\x00", b"\x10", b"id\x00", le32(7), b"\x00",
    b"\x00", b"\x00",
])

# QUERYRESULT {queryID: 1, result: {id: "orders/p1", lastAcked: 1024}, last: true}
QUERYRESULT = b"".join([
    b"\x6d\x00\x00\x00",                                   # 109
    b"\x02", b"type\x00", b"\x0c\x00\x00\x00", b"QUERYRESULT\x00",
    b"\x03", b"frame\x00", b"\x4b\x00\x00\x00",            # 75
    b"\x10", b"queryID\x00", le32(1),
    b"\x03", b"result\x00", b"\x2a\x00\x00\x00",           # 42
    b"\x02", b"id\x00", b"\x0a\x00\x00\x00", b"orders/p1\x00",
    b"\x12", b"lastAcked\x00", le64(1024), b"\x00",
    b"\x08", b"last\x00", b"\x01",
    b"\x00", b"\x00",
])

# STARTTX {sessID: 1, rID: 3} (COMMITTX / ABORTTX have the same fields)
STARTTX = b"".join([
    b"\x38\x00\x00\x00",                                   # 56
    b"\x02", b"type\x00", b"\x08\x00\x00\x00", b"STARTTX\x00",
    b"\x03", b"frame\x00", b"\x1a\x00\x00\x00",            # 26
    b"\x10", b"sessID\x00", le32(1),
    b"\x10", b"rID\x00", le32(3),
    b"\x00", b"\x00",
])

# SUBCLOSE {subID: 0, rID: 4} (UNSUBSCRIBE has the same fields)
SUBCLOSE = b"".join([
    b"\x38\x00\x00\x00",                                   # 56
    b"\x02", b"type\x00", b"\x09\x00\x00\x00", b"SUBCLOSE\x00",
    b"\x03", b"frame\x00", b"\x19\x00\x00\x00",            # 25
    b"\x10", b"subID\x00", le32(0),
    b"\x10", b"rID\x00", le32(4),
    b"\x00", b"\x00",
])

# QUERYACK {queryID: 1}
QUERYACK = b"".join([
    b"\x31\x00\x00\x00",                                   # 49
    b"\x02", b"type\x00", b"\x09\x00\x00\x00", b"QUERYACK\x00",
    b"\x03", b"frame\x00", b"\x12\x00\x00\x00",            # 18
    b"\x10", b"queryID\x00", le32(1),
    b"\x00", b"\x00",
])

# SUBRESPONSE {ok: true, rID: 2, subID: 0}
SUBRESPONSE = b"".join([
    b"\x40\x00\x00\x00",                                   # 64
    b"\x02", b"type\x00", b"\x0c\x00\x00\x00", b"SUBRESPONSE\x00",
    b"\x03", b"frame\x00", b"\x1e\x00\x00\x00",            # 30
    b"\x08", b"ok\x00", b"\x01",
    b"\x10", b"rID\x00", le32(2),
    b"\x10", b"subID\x00", le32(0),
    b"\x00", b"\x00",
])

# QUERYRESPONSE {queryID: 1, ok: true, numResults: 1}: numResults is our addition (choice 8)
QUERYRESPONSE = b"".join([
    b"\x4b\x00\x00\x00",                                   # 75
    b"\x02", b"type\x00", b"\x0e\x00\x00\x00", b"QUERYRESPONSE\x00",
    b"\x03", b"frame\x00", b"\x27\x00\x00\x00",            # 39
    b"\x10", b"queryID\x00", le32(1),
    b"\x08", b"ok\x00", b"\x01",
    b"\x10", b"numResults\x00", le32(1),
    b"\x00", b"\x00",
])

CLIENT_CASES: list[tuple[str, dict[str, Any], dict[str, Any], bytes]] = [
    # (type, body given to encode_frame, the same document with explicit BSON types, golden bytes)
    ("CONNECT", {"version": "1.0", "username": "tim", "password": "1234"},
     {"version": "1.0", "username": "tim", "password": "1234"}, CONNECT),
    ("PUBLISH", {"channel": "orders", "event": {"id": 7}, "rID": 1, "sessID": 3},
     {"channel": "orders", "event": {"id": 7}, "rID": 1, "sessID": 3}, PUBLISH),
    ("SUBSCRIBE", {"channel": "orders", "rID": 2, "startPos": 1024, "durableID": "orders/p1"},
     {"channel": "orders", "rID": 2, "startPos": Int64(1024), "durableID": "orders/p1"}, SUBSCRIBE),
    ("ACKEV", {"subID": 0, "pos": 1024}, {"subID": 0, "pos": Int64(1024)}, ACKEV),
    ("QUERY", {"queryID": 1, "binder": "_mb.durableSubs", "matcher": {"id": "orders/p1"}},
     {"queryID": 1, "binder": "_mb.durableSubs", "matcher": {"id": "orders/p1"}}, QUERY),
    ("STARTTX", {"sessID": 1, "rID": 3}, {"sessID": 1, "rID": 3}, STARTTX),
    ("SUBCLOSE", {"subID": 0, "rID": 4}, {"subID": 0, "rID": 4}, SUBCLOSE),
    ("QUERYACK", {"queryID": 1}, {"queryID": 1}, QUERYACK),
]


@pytest.mark.parametrize(("kind", "body", "typed", "golden"), CLIENT_CASES, ids=[c[0] for c in CLIENT_CASES])
def test_client_frames_encode_to_the_golden_bytes(
    kind: str, body: dict[str, Any], typed: dict[str, Any], golden: bytes
) -> None:
    assert len(golden) == int.from_bytes(golden[:4], "little")
    assert bson.encode({"type": kind, "frame": typed}) == golden
    assert encode_frame(kind, body) == golden


def test_optional_fields_are_left_out_and_order_follows_the_declaration() -> None:
    # The same SUBSCRIBE given in another order and with explicit Nones encodes identically.
    body = {"durableID": "orders/p1", "matcher": None, "startPos": 1024, "startTimestamp": None,
            "rID": 2, "channel": "orders"}
    assert encode_frame("SUBSCRIBE", body) == SUBSCRIBE
    assert [f.name for f in CLIENT_FRAMES["SUBSCRIBE"]][:3] == ["channel", "rID", "startPos"]


def test_event_given_as_bson_bytes_is_embedded_unchanged() -> None:
    event = bson.encode({"id": 7})
    body = {"channel": "orders", "event": event, "rID": 1, "sessID": 3}
    assert encode_frame("PUBLISH", body) == PUBLISH


def test_server_frames_decode_from_the_golden_bytes() -> None:
    response = decode_frame(RESPONSE)
    assert response.type == "RESPONSE" and response.size == 104
    assert response.body == {"ok": False, "rID": 5, "errCode": "NO_SUCH_CHANNEL", "errMsg": "no channel x"}
    assert bson.decode(RESPONSE) == {"type": "RESPONSE", "frame": response.body}

    recev = decode_frame(RECEV)
    assert recev.body["pos"] == 4096 and recev.body["timestamp"] == 1_700_000_000_000
    assert isinstance(recev.body["pos"], Int64)
    # The event's bytes are handed over exactly as they were on the wire.
    assert recev.event == b"\x0d\x00\x00\x00\x10id\x00\x07\x00\x00\x00\x00"
    assert recev.event == bson.encode({"id": 7})

    result = decode_frame(QUERYRESULT)
    assert result.body == {"queryID": 1, "result": {"id": "orders/p1", "lastAcked": 1024}, "last": True}
    assert bson.encode({"type": "QUERYRESULT", "frame": {"queryID": 1, "result": {
        "id": "orders/p1", "lastAcked": Int64(1024)}, "last": True}}) == QUERYRESULT


def test_same_layout_frames_differ_only_in_their_type() -> None:
    for kind in ("COMMITTX", "ABORTTX"):
        data = encode_frame(kind, {"sessID": 1, "rID": 3})
        assert bson.decode(data) == {"type": kind, "frame": {"sessID": 1, "rID": 3}}
    unsubscribe = encode_frame("UNSUBSCRIBE", {"subID": 0, "rID": 4})
    assert unsubscribe[len(unsubscribe) - 27 :] == SUBCLOSE[len(SUBCLOSE) - 27 :]  # identical frame body


def test_subscription_and_query_answers_decode_from_the_golden_bytes() -> None:
    sub = decode_frame(SUBRESPONSE)
    assert sub.body == {"ok": True, "rID": 2, "subID": 0}
    assert bson.encode({"type": "SUBRESPONSE", "frame": sub.body}) == SUBRESPONSE
    query = decode_frame(QUERYRESPONSE)
    assert query.body == {"queryID": 1, "ok": True, "numResults": 1}
    assert bson.encode({"type": "QUERYRESPONSE", "frame": query.body}) == QUERYRESPONSE
