"""String formats of the master (brokers, topic layouts, subscribe infos), master lists and auth."""

from __future__ import annotations

import pytest

from streamledger.protocol.tubemq import (
    Credentials,
    InvalidArgument,
    TubeMQProtocolError,
    parse_masters,
    sign,
)
from streamledger.protocol.tubemq._pb import tubemq_master_pb2 as mpb
from streamledger.protocol.tubemq.auth import AuthState
from streamledger.protocol.tubemq.errors import (
    CertificateFailure,
    MasterResponseError,
    ReRegisterRequired,
    StandbyMasterError,
    response_error,
)
from streamledger.protocol.tubemq.model import (
    BrokerInfo,
    parse_broker_info,
    parse_subscribe_info,
    parse_topic_info,
)


def test_broker_info_explicit_blank_and_tls_default_port() -> None:
    assert parse_broker_info("1:10.0.0.2:8123") == BrokerInfo(1, "10.0.0.2", 8123)
    assert parse_broker_info("7:broker-a:9000") == BrokerInfo(7, "broker-a", 9000)
    assert parse_broker_info("2:10.0.0.3: ").port == 8123
    assert parse_broker_info("2:10.0.0.3:").port == 8123
    assert parse_broker_info("2:10.0.0.3: ", default_port=8124).port == 8124


@pytest.mark.parametrize("raw", ["", "1:host", "x:host:8123", "1::8123", "1:h:port", "1:h:70000", "1:a:b:c"])
def test_broker_info_malformed(raw: str) -> None:
    with pytest.raises(TubeMQProtocolError, match="broker"):
        parse_broker_info(raw)


def test_topic_info_layout_and_partition_ids() -> None:
    info = parse_topic_info("demo#1:3:1,2:2:2#1048576")
    assert info.topic == "demo" and info.max_msg_size == 1048576
    assert [(x.broker_id, x.partitions, x.stores) for x in info.layouts] == [(1, 3, 1), (2, 2, 2)]
    brokers = {1: BrokerInfo(1, "a", 8123), 2: BrokerInfo(2, "b", 8123)}
    keys = [p.key for p in info.partitions(brokers)]
    assert keys == [
        "1:demo:0",
        "1:demo:1",
        "1:demo:2",
        "2:demo:0",
        "2:demo:1",
        "2:demo:10000",
        "2:demo:10001",
    ]
    # Brokers the producer does not know (yet) are skipped, not invented.
    assert [p.key for p in info.partitions({1: brokers[1]})] == ["1:demo:0", "1:demo:1", "1:demo:2"]


def test_topic_info_empty_size_segment_and_errors() -> None:
    assert parse_topic_info("demo#1:3:1#").max_msg_size is None
    assert parse_topic_info("demo#1:3:1").max_msg_size is None
    for raw in ["#1:3:1#5", "demo", "demo#1:3#5", "demo#1:x:1#5", "demo#1:3:1#big", "a#1:1:1#1#x"]:
        with pytest.raises(TubeMQProtocolError):
            parse_topic_info(raw)


def test_subscribe_info_round_trip() -> None:
    raw = "grp_10.0.0.1-1234-5-6-Pull-2.4.0@grp#1:10.0.0.2:8123#demo:10002"
    info = parse_subscribe_info(raw)
    assert info.group == "grp" and info.consumer_id.startswith("grp_10.0.0.1")
    assert info.partition.key == "1:demo:10002"
    assert info.partition.broker == BrokerInfo(1, "10.0.0.2", 8123)
    assert str(info) == raw
    for bad in ["no-at#1:h:1#t:0", "c@g#1:h:1", "c@g#1:h:1#t", "c@g#1:h:1#:0"]:
        with pytest.raises(TubeMQProtocolError):
            parse_subscribe_info(bad)


def test_parse_masters() -> None:
    assert parse_masters("h1:8715, h2:8716,") == [("h1", 8715), ("h2", 8716)]
    assert parse_masters("[::1]:8715") == [("::1", 8715)]
    for bad in ["", "h1", "h1:x", "h1:0", ":8715", "h1:99999"]:
        with pytest.raises(InvalidArgument):
            parse_masters(bad)


def test_signature_vectors() -> None:
    # HMAC-SHA1 -> Base64 -> Java URLEncoder form: '+' '/' '=' are percent-encoded.
    assert sign("alice", "s3cret", 1700000000000, 42) == "ZKqxfwKyaYSgaET%2F1YyEY008XR0%3D"
    assert sign("bob", "pw", 1, 0) == "YSvp5ku%2BnrszLQYsHyuOZhSpokI%3D"


def test_credentials_never_show_the_password() -> None:
    creds = Credentials("alice", "topsecret")
    assert "topsecret" not in repr(creds)
    with pytest.raises(ValueError):
        Credentials(" ", "x")


def test_auth_state_token_round_trip() -> None:
    assert AuthState(None).certificate() is None
    state = AuthState(Credentials("alice", "s3cret"))
    first = state.certificate()
    assert first is not None and first.HasField("authInfo") and not first.HasField("authorizedToken")
    info = first.authInfo
    assert info.userName == "alice" and info.othParams == "" and info.nonce >= 0
    assert info.signature == sign("alice", "s3cret", info.timestamp, info.nonce)
    state.update(mpb.MasterAuthorizedInfo(visitAuthorizedToken=1, authAuthorizedToken="tok"))
    with_token = state.certificate()
    assert (
        with_token is not None and with_token.authorizedToken == "tok" and not with_token.HasField("authInfo")
    )
    forced = state.certificate(force_full=True)
    assert forced is not None and forced.HasField("authInfo")
    state.update(None, require_auth=True)
    again = state.certificate()
    assert again is not None and again.HasField("authInfo")


def test_error_classes_carry_code_and_message() -> None:
    err = response_error("producer heartbeat", "m:1", 411, "Producer node x not found")
    assert isinstance(err, ReRegisterRequired) and err.err_code == 411
    assert "errCode 411" in str(err) and "m:1" in str(err)
    assert isinstance(response_error("register", "m:1", 415, "bad"), CertificateFailure)
    plain = response_error("register", "m:1", 431, "Topic not deployed")
    assert type(plain) is MasterResponseError and plain.err_msg == "Topic not deployed"
    standby = StandbyMasterError(
        "m:1", 1, "org.apache.inlong.tubemq.corerpc.exception.StandbyException", "no"
    )
    assert standby.fails_over
