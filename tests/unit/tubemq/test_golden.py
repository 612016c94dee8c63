"""Byte-exact vectors from the spec's worked example (specs/tubemq.md section 13)."""

from __future__ import annotations

from streamledger.protocol.tubemq._pb import tubemq_master_pb2 as mpb
from streamledger.protocol.tubemq.framing import decode_packet, encode_packet
from streamledger.protocol.tubemq.model import parse_broker_info
from streamledger.protocol.tubemq.rpc import (
    Method,
    Status,
    decode_request,
    decode_response,
    encode_exception_response,
    encode_request,
    encode_response,
)


def _hex(text: str) -> bytes:
    return bytes.fromhex("".join(line.split(":", 1)[-1] for line in text.strip().splitlines()))


REQUEST_BODY = _hex(
    """
    0a 17 31 30 2e 30 2e 30 2e 31 2d 34 32 34 32 2d 31 2d 31 2d 32 2e 34 2e 30
    12 04 64 65 6d 6f
    18 ff ff ff ff ff ff ff ff ff 01
    22 08 31 30 2e 30 2e 30 2e 31
    """
)

REQUEST_PACKET = _hex(
    """
    0000: ff 7f f4 fe 00 00 00 01 00 00 00 01 00 00 00 44
    0010: 02 08 00 04 08 01 10 03 3b 08 01 10 90 4e 1a 34
    0020: 0a 17 31 30 2e 30 2e 30 2e 31 2d 34 32 34 32 2d
    0030: 31 2d 31 2d 32 2e 34 2e 30 12 04 64 65 6d 6f 18
    0040: ff ff ff ff ff ff ff ff ff 01 22 08 31 30 2e 30
    0050: 2e 30 2e 31
    """
)

RESPONSE_PAYLOAD = _hex(
    """
    02 08 01 04 08 00 18 03 34 08 01 12 30
    08 01 10 c8 01 1a 03 4f 4b 21 20 80 d0 95 ff bc 31
    2a 0f 31 3a 31 30 2e 30 2e 30 2e 32 3a 38 31 32 33
    2a 0c 32 3a 31 30 2e 30 2e 30 2e 33 3a 20
    """
)


def _register_request() -> mpb.RegisterRequestP2M:
    return mpb.RegisterRequestP2M(
        clientId="10.0.0.1-4242-1-1-2.4.0", topicList=["demo"], brokerCheckSum=-1, hostName="10.0.0.1"
    )


def test_register_request_message_bytes() -> None:
    body = _register_request().SerializeToString()
    assert len(body) == 52
    assert body == REQUEST_BODY


def test_register_request_packet_is_byte_exact() -> None:
    payload = encode_request(Method.PRODUCER_REGISTER, REQUEST_BODY, timeout_ms=10000)
    assert len(payload) == 68
    assert encode_packet(1, payload) == REQUEST_PACKET


def test_register_request_packet_decodes() -> None:
    packet = decode_packet(REQUEST_PACKET)
    assert packet.serial == 1
    request = decode_request(packet.payload)
    assert (request.service_type, request.protocol_version, request.method, request.timeout_ms) == (
        1,
        3,
        1,
        10000,
    )
    parsed = mpb.RegisterRequestP2M.FromString(request.body)
    assert parsed == _register_request()


def test_register_response_payload_is_byte_exact() -> None:
    message = mpb.RegisterResponseM2P(
        success=True,
        errCode=200,
        errMsg="OK!",
        brokerCheckSum=1700000000000,
        brokerInfos=["1:10.0.0.2:8123", "2:10.0.0.3: "],
    )
    assert encode_response(Method.PRODUCER_REGISTER, message.SerializeToString()) == RESPONSE_PAYLOAD


def test_register_response_decodes_with_blank_default_port() -> None:
    response = decode_response(RESPONSE_PAYLOAD)
    assert response.status is Status.SUCCESS
    assert response.method == 1
    assert response.protocol_version == 3
    message = mpb.RegisterResponseM2P.FromString(response.data)
    assert (message.success, message.errCode, message.errMsg) == (True, 200, "OK!")
    assert message.brokerCheckSum == 1700000000000
    brokers = [parse_broker_info(raw) for raw in message.brokerInfos]
    assert [(b.broker_id, b.host, b.port) for b in brokers] == [(1, "10.0.0.2", 8123), (2, "10.0.0.3", 8123)]
    assert parse_broker_info("2:10.0.0.3: ", default_port=8124).port == 8124


def test_standby_exception_payload_prefix() -> None:
    name = "org.apache.inlong.tubemq.corerpc.exception.StandbyException"
    text = "10.0.0.5:8715 is not master now. the connecting client id is x"
    payload = encode_exception_response(Status.ERROR, name, text)
    assert payload.startswith(
        bytes.fromhex("02 08 01 04 08 01 18 03") + bytes([len(payload) - 9, 0x0A, 0x3B])
    )
    assert payload[11 : 11 + 0x3B] == name.encode()
    response = decode_response(payload)
    assert response.status is Status.ERROR
    assert (response.exception_name, response.exception_message) == (name, text)
