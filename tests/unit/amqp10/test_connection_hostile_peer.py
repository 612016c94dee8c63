"""The connection against hostile or wrong peers on a loopback socket: every wait ends by its
deadline, absurd frame sizes are refused before allocation, and a non-AMQP-1.0 peer is named."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from streamledger.protocol.amqp10 import (
    Amqp10Connection,
    Amqp10ConnectionError,
    Amqp10Timeout,
    AuthenticationFailed,
    FrameTooLarge,
    NotAmqp10Broker,
)
from streamledger.protocol.amqp10 import frames as fr
from streamledger.protocol.amqp10.codec.types import Symbol, UByte


@pytest.fixture
def peer() -> Iterator[Callable[[Callable[[socket.socket], None]], int]]:
    """Start a one-connection TCP server running ``script(conn)``; returns its port."""
    servers: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def start(script: Callable[[socket.socket], None]) -> int:
        srv = socket.create_server(("127.0.0.1", 0))
        servers.append(srv)

        def run() -> None:
            conn, _ = srv.accept()
            with conn:
                try:
                    script(conn)
                except OSError:
                    pass

        t = threading.Thread(target=run, daemon=True)
        t.start()
        threads.append(t)
        return int(srv.getsockname()[1])

    yield start
    for srv in servers:
        srv.close()
    for t in threads:
        t.join(timeout=5)


def _read_header(conn: socket.socket) -> bytes:
    data = b""
    while len(data) < 8:
        data += conn.recv(8 - len(data))
    return data


def _sasl_ok_until_open(conn: socket.socket) -> None:
    _read_header(conn)
    conn.sendall(fr.SASL_HEADER + fr.encode_frame(fr.FRAME_SASL, 0, "sasl-mechanisms", [Symbol("PLAIN")]))
    conn.recv(4096)  # sasl-init
    conn.sendall(fr.encode_frame(fr.FRAME_SASL, 0, "sasl-outcome", [UByte(0)]))
    _read_header(conn)
    conn.sendall(fr.AMQP_HEADER)
    conn.recv(4096)  # open


def test_amqp091_peer_is_named(peer: Callable[[Callable[[socket.socket], None]], int]) -> None:
    def script(conn: socket.socket) -> None:
        _read_header(conn)
        conn.sendall(b"AMQP\x00\x00\x09\x01")

    port = peer(script)
    with pytest.raises(NotAmqp10Broker, match=r"speaks AMQP 0-9-1 only.*needs RabbitMQ 4\.0"):
        Amqp10Connection.open(f"amqp://u:pw@127.0.0.1:{port}/", timeout=5)


def test_huge_frame_is_refused_before_allocation(
    peer: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    def script(conn: socket.socket) -> None:
        _sasl_ok_until_open(conn)
        conn.sendall(b"\xff\xff\xff\xf0\x02\x00\x00\x00")  # claims ~4 GiB, then nothing
        time.sleep(2)

    port = peer(script)
    started = time.monotonic()
    with pytest.raises(FrameTooLarge, match="exceeds the max-frame-size of 65536"):
        Amqp10Connection.open(f"amqp://u:pw@127.0.0.1:{port}/", timeout=5, max_frame_size=65536)
    assert time.monotonic() - started < 2


def test_silent_peer_times_out(peer: Callable[[Callable[[socket.socket], None]], int]) -> None:
    def script(conn: socket.socket) -> None:
        _read_header(conn)
        time.sleep(3)

    port = peer(script)
    started = time.monotonic()
    with pytest.raises(Amqp10Timeout, match=r"no answer within 0\.5s while waiting for the protocol header"):
        Amqp10Connection.open(f"amqp://u:pw@127.0.0.1:{port}/", timeout=0.5)
    assert time.monotonic() - started < 2


def test_refused_login_is_one_line_without_password(
    peer: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    def script(conn: socket.socket) -> None:
        _read_header(conn)
        conn.sendall(fr.SASL_HEADER + fr.encode_frame(fr.FRAME_SASL, 0, "sasl-mechanisms", [Symbol("PLAIN")]))
        conn.recv(4096)
        conn.sendall(fr.encode_frame(fr.FRAME_SASL, 0, "sasl-outcome", [UByte(1)]))

    port = peer(script)
    with pytest.raises(AuthenticationFailed) as info:
        Amqp10Connection.open(f"amqp://u:hunter2@127.0.0.1:{port}/", timeout=5)
    assert "hunter2" not in str(info.value) and "outcome auth" in str(info.value)


def test_mechanism_not_offered(peer: Callable[[Callable[[socket.socket], None]], int]) -> None:
    def script(conn: socket.socket) -> None:
        _read_header(conn)
        conn.sendall(fr.SASL_HEADER + fr.encode_frame(fr.FRAME_SASL, 0, "sasl-mechanisms", [Symbol("PLAIN")]))
        time.sleep(1)

    port = peer(script)
    with pytest.raises(AuthenticationFailed, match=r"does not offer SASL ANONYMOUS \(offered: PLAIN\)"):
        Amqp10Connection.open(f"amqp://127.0.0.1:{port}/", timeout=5)


def test_peer_hangs_up(peer: Callable[[Callable[[socket.socket], None]], int]) -> None:
    port = peer(_read_header)  # reads our header, then hangs up
    with pytest.raises(Amqp10ConnectionError, match="closed the connection"):
        Amqp10Connection.open(f"amqp://u:pw@127.0.0.1:{port}/", timeout=5)
