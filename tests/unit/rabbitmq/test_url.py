"""Broker URLs: defaults, percent-decoding, TLS options, and credentials kept out of text."""

from __future__ import annotations

import pytest

from streamledger.protocol.rabbitmq import ConnectionParams, InvalidRequest, OffsetSpec, parse_url


def test_defaults() -> None:
    p = parse_url("rabbitmq-stream://localhost")
    assert (p.host, p.port, p.vhost, p.username, p.password, p.tls) == (
        "localhost", 5552, "/", "guest", "guest", False)
    assert parse_url("rabbitmq-stream+tls://h/").port == 5551


def test_percent_decoding_and_vhost() -> None:
    p = parse_url("rabbitmq-stream://us%40er:p%3Ass%2Fw%40rd@10.0.0.1:6000/my%2Fvhost")
    assert (p.username, p.password, p.vhost, p.port) == ("us@er", "p:ss/w@rd", "my/vhost", 6000)
    assert parse_url("rabbitmq-stream://u:p@h:1/%2F").vhost == "/"
    assert parse_url("rabbitmq-stream://u:p@h:1/prod").vhost == "prod"


def test_tls_query_parameters() -> None:
    p = parse_url(
        "rabbitmq-stream+tls://u:p@broker:5551/?ca_file=/a/ca.pem&cert_file=/a/c.pem&key_file=/a/c.key"
        "&verify=false&server_hostname=rabbit.local&auth=external"
    )
    assert p.tls and p.ca_file == "/a/ca.pem" and p.cert_file == "/a/c.pem" and p.key_file == "/a/c.key"
    assert p.verify is False and p.server_hostname == "rabbit.local" and p.auth == "external"


@pytest.mark.parametrize(
    "url, message",
    [
        ("amqp://u:p@h/", "unsupported URL scheme"),
        ("rabbitmq-stream://u:p@h/?ca_file=/x", "only applies to rabbitmq-stream\\+tls"),
        ("rabbitmq-stream://u:p@h/?auth=external", "needs a TLS URL"),
        ("rabbitmq-stream+tls://u:p@h/?auth=kerberos", "use plain or external"),
        ("rabbitmq-stream+tls://u:p@h/?verify=maybe", "not a boolean"),
        ("rabbitmq-stream://u:p@h/?colour=red", "unknown broker URL query parameter"),
        ("rabbitmq-stream://u:s3cret@h:notaport/", "its port is not a number in 0..65535"),
        ("rabbitmq-stream+tls://u:p@h/?key_file=/k", "needs cert_file"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as info:
        parse_url(url)
    assert "s3cret" not in str(info.value)


def test_password_never_in_repr() -> None:
    p = parse_url("rabbitmq-stream://admin:Sup3r%24ecret@h:5552/v")
    assert p.password == "Sup3r$ecret"
    for text in (repr(p), str(p), p.redacted(), f"{p!r}"):
        assert "Sup3r" not in text
    assert p.redacted() == "rabbitmq-stream://admin:***@h:5552/v"
    assert "ecret" not in repr(ConnectionParams(password="Sup3r$ecret"))


def test_offset_spec_values() -> None:
    assert OffsetSpec.first().wire_type == 1
    assert OffsetSpec.last().wire_type == 2
    assert OffsetSpec.next().wire_type == 3
    assert OffsetSpec.offset(5) == OffsetSpec("offset", 5)
    assert OffsetSpec.parse("earliest") == OffsetSpec.first()
    assert OffsetSpec.parse("timestamp:1700000000000") == OffsetSpec.timestamp(1_700_000_000_000)
    assert OffsetSpec.parse("42") == OffsetSpec.offset(42)
    with pytest.raises(InvalidRequest):
        OffsetSpec.offset(-1)
    with pytest.raises(InvalidRequest):
        OffsetSpec("first", 3)
    with pytest.raises(InvalidRequest, match="invalid offset spec"):
        OffsetSpec.parse("yesterday")
