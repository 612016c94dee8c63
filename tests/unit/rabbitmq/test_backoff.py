"""``with_backoff``: the broker client's retry of transient failures (connect, a stream without a leader)."""

from __future__ import annotations

import time

import pytest

from streamledger.protocol.rabbitmq.connection import Connection, with_backoff
from streamledger.protocol.rabbitmq.errors import ConnectionFailed
from streamledger.protocol.rabbitmq.url import parse_url


class Flaky(Exception):
    pass


def test_a_transient_failure_is_tried_again_after_a_growing_pause_then_succeeds() -> None:
    calls: list[float] = []

    def fn() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise Flaky("not yet")
        return "ok"

    assert with_backoff(fn, transient=lambda e: isinstance(e, Flaky), attempts=4) == "ok"
    assert len(calls) == 3
    first, second = calls[1] - calls[0], calls[2] - calls[1]
    assert 0.15 <= first < second, (first, second)  # 0.2 s, then 0.4 s


def test_the_last_failure_is_raised_as_it_is_after_the_attempts() -> None:
    calls = []

    def fn() -> None:
        calls.append(1)
        raise Flaky(f"attempt {len(calls)}")

    with pytest.raises(Flaky, match="attempt 2"):
        with_backoff(fn, transient=lambda e: isinstance(e, Flaky), attempts=2)
    assert len(calls) == 2


def test_a_failure_that_is_not_transient_is_raised_at_once() -> None:
    calls = []

    def fn() -> None:
        calls.append(1)
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        with_backoff(fn, transient=lambda e: isinstance(e, Flaky), attempts=5)
    assert calls == [1]


def test_connecting_to_a_closed_port_is_tried_attempts_times_then_refused() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again once the block ends: nothing listens there
    params = parse_url(f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/")
    t0 = time.monotonic()
    with pytest.raises(ConnectionFailed, match=f"127.0.0.1:{port}"):
        Connection.open(params, attempts=3)
    assert time.monotonic() - t0 >= 0.55  # paused 0.2 s and 0.4 s between the three attempts
