"""Golden frames (hand-assembled from the spec's layout, and bytes captured from RabbitMQ 4.3.6),
codec round trips, and a fuzz of the frame decoder: malformed input only ever raises the typed
protocol error, and sizes are refused before anything is allocated."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamledger.protocol.amqp10 import frames as fr
from streamledger.protocol.amqp10.codec import decode_message, decode_value, encode_value
from streamledger.protocol.amqp10.codec.encoder import encode_value_message
from streamledger.protocol.amqp10.codec.types import Described, Long, Symbol, UInt, ULong
from streamledger.protocol.amqp10.errors import Amqp10ProtocolError, FrameTooLarge


def h(text: str) -> bytes:
    return bytes.fromhex("".join(part.split("#")[0] for part in text.strip().splitlines()).replace(" ", ""))


OPEN = h("""
00000022 02 00 0000       # size 34, doff 2, type AMQP, channel 0
00 53 10                  # described, smallulong descriptor 0x10 = open
c0 15 04                  # list8: 21 bytes follow, 4 fields
a1 01 63                  # container-id "c"
a1 07 76686f73743a2f      # hostname "vhost:/"
70 00010000               # max-frame-size uint 65536
60 0000                   # channel-max ushort 0
""")

# what RabbitMQ 4.3.6 answers to the SASL header on its plain listener (captured)
RABBIT_SASL_MECHANISMS = h("""
00000034 02 01 0000                       # size 52, doff 2, type SASL, channel 0
00 53 40                                  # sasl-mechanisms
c0 27 01                                  # list8, 1 field
e0 24 03 b3                               # array8 of 3 sym32
00000005 504c41494e                       # PLAIN
00000008 414d51504c41494e                 # AMQPLAIN
00000009 414e4f4e594d4f5553               # ANONYMOUS
""")


def test_open_frame_matches_the_spec_layout() -> None:
    assert fr.open_frame("c", "vhost:/", 65536, 0, None) == OPEN
    frame = fr.parse_frame(OPEN)
    assert frame.type == fr.FRAME_AMQP and frame.channel == 0 and frame.payload == b""
    assert frame.performative == fr.Performative(
        "open", {"container-id": "c", "hostname": "vhost:/", "max-frame-size": 65536, "channel-max": 0}
    )


def test_rabbitmq_sasl_mechanisms_frame() -> None:
    frame = fr.parse_frame(RABBIT_SASL_MECHANISMS)
    assert frame.type == fr.FRAME_SASL
    assert frame.performative is not None and frame.performative.name == "sasl-mechanisms"
    assert fr.symbols(frame.performative.get("sasl-server-mechanisms")) == ["PLAIN", "AMQPLAIN", "ANONYMOUS"]
    # a single symbol is as legal as an array for a multiple field
    assert fr.symbols(Symbol("PLAIN")) == ["PLAIN"] and fr.symbols(None) == []


def test_sasl_init_plain_bytes() -> None:
    frame = fr.sasl_init("PLAIN", b"\0guest\0guest", "localhost")
    assert frame == h("""
        0000002e 02 01 0000               # size 46, doff 2, type SASL, channel 0
        00 53 41                          # sasl-init
        c0 21 03                          # list8: 33 bytes follow, 3 fields
        a3 05 504c41494e                  # mechanism: symbol PLAIN
        a0 0c 006775657374006775657374    # initial-response: binary NUL guest NUL guest
        a1 09 6c6f63616c686f7374          # hostname "localhost"
    """)


def test_heartbeat_is_an_empty_frame() -> None:
    beat = fr.encode_frame(fr.FRAME_AMQP, 0, None)
    assert beat == h("00000008 02 00 0000")
    assert fr.parse_frame(beat).performative is None


def test_extended_header_is_skipped() -> None:
    body = encode_value(Described(ULong(0x17), []))  # end
    frame = struct.pack(">IBBH", 12 + len(body), 3, 0, 5) + b"\xaa\xbb\xcc\xdd" + body
    parsed = fr.parse_frame(frame)
    assert parsed.channel == 5 and parsed.performative == fr.Performative("end", {})


def test_transfer_keeps_its_payload() -> None:
    message = encode_value_message(
        {"durable": True},
        properties={"message-id": "m1", "to": "/queues/q", "subject": "PUT", "reply-to": "$me"},
    )
    frame = fr.parse_frame(fr.transfer_frame(0, 0, 7, b"\0\0\0\7", settled=True, more=False, payload=message))
    assert frame.performative is not None
    assert frame.performative.fields["delivery-id"] == 7 and frame.performative.fields["settled"] is True
    decoded = decode_message(frame.payload)
    assert decoded.properties == {"message-id": "m1", "to": "/queues/q", "subject": "PUT", "reply-to": "$me"}
    assert decoded.body_type == "value" and decoded.value == {"durable": True}


def test_continuation_transfer_omits_delivery_fields() -> None:
    frame = fr.parse_frame(fr.transfer_frame(0, 3, None, None, settled=True, more=True, payload=b"xyz"))
    assert frame.performative is not None
    assert frame.performative.fields == {
        "handle": 3,
        "delivery-id": None,
        "delivery-tag": None,
        "message-format": None,
        "settled": None,
        "more": True,
    }
    assert frame.payload == b"xyz"


def test_error_text_is_one_line_and_bounded() -> None:
    error = Described(ULong(fr.ERROR), [Symbol("amqp:internal-error"), "line one\n   line two" + "x" * 500])
    condition, description = fr.error_text(error)
    assert condition == "amqp:internal-error"
    assert description is not None and "\n" not in description and len(description) == 300
    assert description.startswith("line one line two")
    assert fr.error_text(None) == (None, None)


def test_close_frame_round_trip() -> None:
    p = fr.parse_frame(fr.close_frame("amqp:connection:forced", "bye")).performative
    assert p is not None and p.name == "close"
    assert fr.error_text(p.get("error")) == ("amqp:connection:forced", "bye")


@pytest.mark.parametrize(
    ("header", "limit", "error", "match"),
    [
        (
            h("ffffffff 02 00 0000"),
            1 << 20,
            FrameTooLarge,
            "4294967295 bytes exceeds the max-frame-size of 1048576",
        ),
        (h("00000007 02 00 0000"), 1 << 20, Amqp10ProtocolError, "below the 8-byte header"),
        (h("00000010 01 00 0000"), 1 << 20, Amqp10ProtocolError, "data offset 1"),
        (h("00000010 05 00 0000"), 1 << 20, Amqp10ProtocolError, "data offset 5"),
        (h("000000"), 1 << 20, Amqp10ProtocolError, "truncated frame header"),
    ],
)
def test_frame_size_checks_come_before_allocation(
    header: bytes, limit: int, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        fr.frame_size(header, limit)


def test_bad_frames_are_typed_errors() -> None:
    with pytest.raises(Amqp10ProtocolError, match="unknown frame type 7"):
        fr.parse_frame(h("0000000b 02 07 0000 005345"))
    with pytest.raises(Amqp10ProtocolError, match="unknown performative descriptor 0x99"):
        fr.parse_frame(h("0000000c 02 00 0000 00539945"))
    with pytest.raises(Amqp10ProtocolError, match="not a described performative"):
        fr.parse_frame(h("00000009 02 00 0000 45"))
    with pytest.raises(Amqp10ProtocolError, match="size field says 12"):
        fr.parse_frame(h("0000000c 02 00 0000 0053"))
    with pytest.raises(Amqp10ProtocolError, match="bad performative"):
        fr.parse_frame(h("0000000c 02 00 0000 0053 10 c0"))  # list8 without its size


@given(
    next_in=st.integers(0, 2**32 - 1),
    window=st.integers(0, 2**32 - 1),
    next_out=st.integers(0, 2**32 - 1),
    handle=st.none() | st.integers(0, 2**32 - 1),
    credit=st.none() | st.integers(0, 2**32 - 1),
)
def test_flow_round_trip(
    next_in: int, window: int, next_out: int, handle: int | None, credit: int | None
) -> None:
    raw = fr.flow_frame(
        1,
        next_incoming_id=next_in,
        incoming_window=window,
        next_outgoing_id=next_out,
        outgoing_window=window,
        handle=handle,
        delivery_count=0 if handle is not None else None,
        link_credit=credit,
    )
    p = fr.parse_frame(raw).performative
    assert p is not None and p.name == "flow"
    assert (p.get("next-incoming-id"), p.get("incoming-window"), p.get("next-outgoing-id")) == (
        next_in,
        window,
        next_out,
    )
    assert p.get("handle") == handle and p.get("link-credit") == credit


management_bodies = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(management_bodies, st.text(min_size=1, max_size=30))
def test_management_message_round_trip(body: object, path: str) -> None:
    raw = encode_value_message(
        body, properties={"message-id": "id-1", "to": path, "subject": "GET", "reply-to": "$me"}
    )
    decoded = decode_message(raw)
    assert decoded.value == body and decoded.properties is not None and decoded.properties["to"] == path


def test_typed_arguments_keep_their_types() -> None:
    # stream arguments must reach the broker as long (it refuses other integer types for them)
    assert encode_value(Long(5)) == h("55 05") and encode_value(Long(10**9)) == h("81 000000003b9aca00")
    assert encode_value(UInt(3)) == h("52 03")
    assert decode_value(encode_value({"x-max-length-bytes": Long(5), "n": UInt(3)}))[0] == {
        "x-max-length-bytes": 5,
        "n": 3,
    }


frames = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda body, doff, t: struct.pack(">IBBH", 8 + len(body), doff, t, 0) + body,
        st.binary(max_size=200),
        st.integers(0, 8),
        st.integers(0, 2),
    ),
    st.builds(
        lambda body, cut: (struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body)[: 8 + cut],
        st.sampled_from(
            [
                OPEN[8:],
                RABBIT_SASL_MECHANISMS[8:],
                fr.transfer_frame(0, 1, 2, b"t", settled=True, more=False, payload=b"p")[8:],
            ]
        ),
        st.integers(0, 60),
    ),
    st.builds(
        lambda prefix, junk: prefix + junk,
        st.sampled_from([b"\x00\x53\x10", b"\x00\x53\x14\xd0", b"\x00\x53\x12\xc0\xff"]),
        st.binary(max_size=40),
    ).map(lambda body: struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body),
)


@settings(max_examples=600)
@given(frames)
def test_fuzz_frame_decoder_raises_only_typed_errors(data: bytes) -> None:
    try:
        frame = fr.parse_frame(data, max_frame_size=1 << 16)
    except Amqp10ProtocolError:
        return
    assert frame.type in (fr.FRAME_AMQP, fr.FRAME_SASL)
    if frame.performative is not None:
        assert frame.performative.name in {name for name, _f in fr.PERFORMATIVES.values()}
