"""URL parsing (and that no password ever shows), stream arguments, partition naming, path encoding."""

from __future__ import annotations

import pytest

from streamledger.protocol.amqp10 import (
    Amqp10Params,
    InvalidUrl,
    StreamOptions,
    parse_amqp_url,
    partition_names,
    segment,
)
from streamledger.protocol.amqp10.codec.types import Long
from streamledger.protocol.amqp10.errors import Conflict, ManagementError, NotFound, management_error


def test_parse_url_defaults_and_vhost() -> None:
    p = parse_amqp_url("amqp://alice:s%40cret@broker.example/")
    assert (p.host, p.port, p.vhost, p.username, p.password, p.tls, p.auth) == (
        "broker.example",
        5672,
        "/",
        "alice",
        "s@cret",
        False,
        "plain",
    )
    assert parse_amqp_url("amqp://u:p@h:5682/%2F").vhost == "/"
    assert parse_amqp_url("amqp://u:p@h/my%2Fvhost").vhost == "my/vhost"
    assert parse_amqp_url("amqps://u:p@h").port == 5671
    assert parse_amqp_url("amqp://h").auth == "anonymous"
    ext = parse_amqp_url(
        "amqps://h?auth=external&cert_file=/c.pem&key_file=/k.pem&ca_file=/ca.pem&verify=false"
    )
    assert (ext.auth, ext.cert_file, ext.key_file, ext.ca_file, ext.verify) == (
        "external",
        "/c.pem",
        "/k.pem",
        "/ca.pem",
        False,
    )


def test_password_never_shows() -> None:
    p = parse_amqp_url("amqp://alice:topsecret@h:5672/v")
    assert "topsecret" not in repr(p) and "topsecret" not in p.redacted()
    assert p.redacted() == "amqp://alice:***@h:5672/v"
    assert Amqp10Params(username=None, password=None).redacted() == "amqp://127.0.0.1:5672/"


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("http://u:pw1@h/", "unsupported URL scheme 'http'"),
        ("amqp://u:pw1@h:notaport/", "bad host or port"),
        ("amqp:///v", "no host"),
        ("amqp://u:pw1@h/?ca_file=/x", "only applies to amqps"),
        ("amqp://u:pw1@h/?bogus=1", "unknown AMQP URL query parameter"),
        ("amqp://u:pw1@h/?auth=kerberos", "use plain, anonymous or external"),
        ("amqp://h/?auth=plain", "needs a user name"),
        ("amqps://u:pw1@h/?auth=external", "client certificate"),
        ("amqps://u:pw1@h/?key_file=/k", "key_file needs cert_file"),
        ("amqps://u:pw1@h/?verify=maybe", "not a boolean"),
    ],
)
def test_bad_urls_are_one_line_and_secret_free(url: str, match: str) -> None:
    with pytest.raises(InvalidUrl, match=match) as info:
        parse_amqp_url(url)
    assert "pw1" not in str(info.value) and "\n" not in str(info.value)


def test_path_segments_escape_every_reserved_character() -> None:
    assert segment("a/b c%d;e=f?g#h&i") == "a%2Fb%20c%25d%3Be%3Df%3Fg%23h%26i"
    assert segment("plain-name_1.x~") == "plain-name_1.x~"
    assert segment("é") == "%C3%A9"


def test_stream_options_become_typed_arguments() -> None:
    args = StreamOptions(
        max_age="7D",
        max_length_bytes=10**9,
        max_segment_size_bytes=50_000_000,
        initial_cluster_size=3,
        leader_locator="balanced",
        filter_size_bytes=32,
    ).arguments()
    assert args == {
        "x-queue-type": "stream",
        "x-max-age": "7D",
        "x-max-length-bytes": 10**9,
        "x-stream-max-segment-size-bytes": 50_000_000,
        "x-initial-cluster-size": 3,
        "x-queue-leader-locator": "balanced",
        "x-stream-filter-size-bytes": 32,
    }
    assert all(
        type(v) is Long
        for k, v in args.items()
        if k not in ("x-queue-type", "x-max-age", "x-queue-leader-locator")
    )
    assert StreamOptions().arguments() == {"x-queue-type": "stream"}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (StreamOptions(max_age="7 days"), "not a RabbitMQ duration"),
        (StreamOptions(max_length_bytes=0), "x-max-length-bytes must be an integer"),
        (StreamOptions(max_segment_size_bytes=4_000_000_000), "x-stream-max-segment-size-bytes"),
        (StreamOptions(filter_size_bytes=8), "x-stream-filter-size-bytes"),
        (StreamOptions(initial_cluster_size=True), "x-initial-cluster-size"),  # type: ignore[arg-type]
        (StreamOptions(leader_locator="random"), "client-local or balanced"),  # type: ignore[arg-type]
    ],
)
def test_bad_stream_options(options: StreamOptions, match: str) -> None:
    with pytest.raises(InvalidUrl, match=match):
        options.arguments()


def test_partition_names_as_the_broker_names_them() -> None:
    assert partition_names("orders", partitions=3) == (["orders-0", "orders-1", "orders-2"], ["0", "1", "2"])
    assert partition_names("o", binding_keys=["eu", "us/east"]) == (["o-eu", "o-us/east"], ["eu", "us/east"])
    for kwargs in (
        {},
        {"partitions": 2, "binding_keys": ["a"]},
        {"partitions": 0},
        {"binding_keys": ["a", "a"]},
        {"binding_keys": [""]},
    ):
        with pytest.raises(InvalidUrl):
            partition_names("o", **kwargs)  # type: ignore[arg-type]


def test_management_errors_carry_status_and_description() -> None:
    err = management_error(409, "declare queue 'q'", "inequivalent arg 'x-max-age'")
    assert (
        isinstance(err, Conflict) and err.status == 409 and err.description == "inequivalent arg 'x-max-age'"
    )
    assert str(err) == "declare queue 'q': 409: inequivalent arg 'x-max-age'"
    assert isinstance(management_error(404, "get", None), NotFound)
    other = management_error(500, "get", None)
    assert type(other) is ManagementError and str(other) == "get: 500"
