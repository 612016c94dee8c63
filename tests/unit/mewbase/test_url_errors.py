"""URLs, error mapping and the documented conventions (no server needed)."""

from __future__ import annotations

import pytest

from streamledger.protocol.mewbase import (
    AuthenticationFailed,
    ChannelNotFound,
    InvalidRequest,
    MewbaseParams,
    ServerError,
    TransactionError,
    parse_url,
)
from streamledger.protocol.mewbase import conventions as cv
from streamledger.protocol.mewbase.errors import server_error
from streamledger.protocol.mewbase.log import _spec


def test_parse_url_with_and_without_credentials() -> None:
    p = parse_url("mewbase://alice:s%3Acret@db.example:7451")
    assert (p.host, p.port, p.username, p.password) == ("db.example", 7451, "alice", "s:cret")
    assert parse_url("mewbase://127.0.0.1:1234/") == MewbaseParams("127.0.0.1", 1234)
    assert parse_url("mewbase://[::1]:9").address == "[::1]:9"
    assert parse_url("mewbase://bob@h:1").password is None


def test_the_password_never_shows() -> None:
    p = parse_url("mewbase://alice:topsecret@h:1")
    assert "topsecret" not in repr(p) and "topsecret" not in p.redacted()
    assert p.redacted() == "mewbase://alice:***@h:1"


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("rabbitmq-stream://u:topsecret@h:1", "must start with mewbase://"),
        ("mewbase://u:topsecret@h", "has no port"),
        ("mewbase://u:topsecret@h:99999", "malformed"),
        ("mewbase://u:topsecret@h:1/path", "must not have a path"),
        ("mewbase://:topsecret@h:1", "password but no user name"),
        ("mewbase://u:topsecret@:1", "has no host"),
    ],
)
def test_bad_urls_are_one_line_errors_without_the_password(url: str, needle: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_url(url)
    text = str(info.value)
    assert needle in text and "topsecret" not in text and "\n" not in text


def test_server_errors_map_codes_to_types_and_stay_one_line() -> None:
    err = server_error("CONNECT to h:1", "AUTHENTICATION_FAILED", "bad\npassword\tgiven")
    assert isinstance(err, AuthenticationFailed) and err.err_code == "AUTHENTICATION_FAILED"
    assert str(err) == "CONNECT to h:1 refused by the server: AUTHENTICATION_FAILED: bad password given"
    assert isinstance(server_error("x", "NO_TX", None), TransactionError)
    # Numeric codes of later mewbase servers map onto the same names.
    numeric = server_error("SUBSCRIBE", 3, "no channel")
    assert isinstance(numeric, ChannelNotFound) and numeric.err_code == "NO_SUCH_CHANNEL"
    unknown = server_error("PUBLISH", None, None)
    assert type(unknown) is ServerError and "no errCode" in str(unknown)


def test_durable_id_is_one_to_one() -> None:
    assert cv.durable_id("orders", "pipe/1") == "orders/pipe/1"
    with pytest.raises(ValueError, match="no '/'"):
        cv.durable_id("a/b", "c")
    with pytest.raises(ValueError):
        cv.durable_id("a", "")


def test_position_specs() -> None:
    assert _spec("first") == ("first", None)
    assert _spec(" TAIL ") == ("next", None)
    assert _spec("timestamp:1700000000000") == ("timestamp", 1_700_000_000_000)
    assert _spec("42") == ("offset", 42)

    class Spec:
        kind, value = "timestamp", 5

    assert _spec(Spec()) == ("timestamp", 5)
    with pytest.raises(InvalidRequest, match="invalid position"):
        _spec("soon")
    with pytest.raises(InvalidRequest, match="outside"):
        _spec("-3")
    with pytest.raises(InvalidRequest, match="cannot resolve"):
        _spec(3.5)
