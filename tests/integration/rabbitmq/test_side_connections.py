"""Issue 44 (red team): a ResolveOffsetSpec round over many streams spread over side connections
(``StreamClient._spread``) against the real 4.3 broker where the side connections cannot be had, and
what the client leaves behind: the answers stay the main connection's, no socket outlives ``close()``,
and no password reaches a log line."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from streamledger.protocol.rabbitmq import StreamClient
from streamledger.protocol.rabbitmq.offsets import OffsetSpec
from tests.support.balancer import RoundRobin
from tests.support.rabbitmq import Broker, StreamNames, TlsSetup

pytestmark = pytest.mark.rabbitmq

PASSWORD = "s1de-c0nn-" + uuid.uuid4().hex[:12]


def _sockets() -> set[str]:
    """The inodes of this process's open sockets."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


def _threads() -> set[threading.Thread]:
    """This process's live connection heartbeat and side-round threads."""
    return {t for t in threading.enumerate()
            if t.name.startswith(("rabbitmq-stream-heartbeat-", "streamledger-side-"))}


def _one_connections_answers(admin: StreamClient, names: list[str]) -> tuple[
        list[OffsetSpec], dict[str, list[int | None]], dict[str, tuple[int, int]], dict[str, int | None]]:
    """What one connection answers for ``names`` (from :func:`_streams`): the specs a spread round asks,
    each stream's resolutions of them, a probe of the tracking chunks past each stream's records
    (of all its offsets for ``names[4]``), and the probe's counts."""
    specs = [OffsetSpec.last(), OffsetSpec.timestamp(0)]
    want = {n: [admin.resolve_offset(n, s) for s in specs] for n in names}
    tails = admin.committed_tails(names)
    probe = {n: (1 + i % 3, tails[n]) for i, n in enumerate(names)}
    probe[names[4]] = (0, tails[names[4]])
    return specs, want, probe, admin.user_records_many(probe)


@contextlib.contextmanager
def _user_limited_to(broker: Broker, connections: int) -> Iterator[str]:
    """A broker URL for a fresh user the broker lets hold ``connections`` connections at a time."""
    user = f"sl-side-{uuid.uuid4().hex[:8]}"
    broker.cli("rabbitmqctl", "-q", "add_user", user, PASSWORD)
    try:
        broker.cli("rabbitmqctl", "-q", "set_permissions", "-p", "/", user, ".*", ".*", ".*")
        broker.cli("rabbitmqctl", "-q", "set_user_limits", user, json.dumps({"max-connections": connections}))
        yield f"rabbitmq-stream://{user}:{quote(PASSWORD, safe='')}@{broker.host}:{broker.stream_port}/"
    finally:
        broker.cli("rabbitmqctl", "-q", "delete_user", user)


@pytest.fixture
def limited_user(broker_43: Broker) -> Iterator[str]:
    """A broker URL for a fresh user the broker lets hold one connection at a time."""
    with _user_limited_to(broker_43, 1) as url:
        yield url


def _streams(client: StreamClient, stream_name: StreamNames, n: int) -> list[str]:
    names = [stream_name(f"side-{i}") for i in range(n)]
    for i, name in enumerate(names):
        client.create_stream(name)
        client.publish(name, [b"r%d" % j for j in range(1 + i % 3)])
        if i % 2:
            client.store_offset_verified(name, "p", i % 3)  # a tracking chunk after the records
    return names


def test_side_connections_the_broker_refuses_leave_the_round_to_the_main_connection_without_a_password_logged(
        broker_43: Broker, limited_user: str, stream_name: StreamNames,
        caplog: pytest.LogCaptureFixture) -> None:
    """A user the broker allows one connection (a per-user limit, a vhost limit, a full node): every
    side connection is refused by the broker itself. The round's answers are the main connection's,
    the probe counts what one connection counts, no refused socket stays open, and the debug line
    that reports each refusal names the URL without its password."""
    caplog.set_level(logging.DEBUG, logger="streamledger")
    with StreamClient.connect(broker_43.url) as admin:
        names = _streams(admin, stream_name, 12)
        specs, want, probe, counts = _one_connections_answers(admin, names)
    assert counts == {n: int(n == names[4]) for n in names}

    before = _sockets()
    with StreamClient.connect(limited_user) as client:
        client.spread_at, client.side_connections = 4, 3
        assert client.resolve_offsets(names, specs) == want
        assert client.last_side == []  # every side connection refused: none used
        assert client.user_records_many(probe, by_last_chunk=True) == counts
        assert client.resolve_offsets(names, specs) == want  # refused once: not spread again, same answers
        assert len(_sockets() - before) == 1  # the main connection only
    assert _sockets() - before == set()
    assert any("side connection" in r.getMessage() for r in caplog.records), "no refusal was logged"
    assert all(PASSWORD not in r.getMessage() and quote(PASSWORD, safe="") not in r.getMessage()
               for r in caplog.records)


def test_a_spread_round_closes_every_socket_and_thread_it_opened_before_it_returns(
        broker_43: Broker, stream_name: StreamNames) -> None:
    """Side connections live for one round, whether it was a resolution, a probe or planning's
    resolve_offsets: after each round only the main connection is open, and leaving ``with``
    closes that one too."""
    with StreamClient.connect(broker_43.url) as admin:
        names = _streams(admin, stream_name, 12)
        tails = admin.committed_tails(names)
    before, threads_before = _sockets(), _threads()
    for _ in range(3):
        with StreamClient.connect(broker_43.url) as client:
            client.spread_at, client.side_connections = 4, 3
            client.resolve_offsets(names, [OffsetSpec.last()])
            assert len(client.last_side) == 3 and all(conn.closed for conn in client.last_side)
            assert len(_sockets() - before) == 1  # the main connection only
            client.user_records_many({n: (0, tails[n]) for n in names}, by_last_chunk=True)
            assert len(client.last_side) == 3 and len(_sockets() - before) == 1
            client.resolve_offsets(names, [OffsetSpec.last()])
            assert len(_sockets() - before) == 1
    assert _sockets() - before == set()
    deadline = time.monotonic() + 5  # the heartbeat threads of the side connections end with them
    while (left := _threads() - threads_before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, left


@pytest.fixture
def other_vhost(broker_43: Broker) -> Iterator[str]:
    """A fresh vhost guest may use; its name."""
    vhost = f"sl-side-{uuid.uuid4().hex[:8]}"
    broker_43.cli("rabbitmqctl", "-q", "add_vhost", vhost)
    try:
        broker_43.cli("rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield vhost
    finally:
        broker_43.cli("rabbitmqctl", "-q", "delete_vhost", vhost)


def test_side_connections_ask_in_the_url_vhost_not_the_default_one(
        broker_43: Broker, other_vhost: str) -> None:
    """Streams of the same names in ``/`` and in the URL's vhost, with other contents: a round spread
    over side connections answers from the URL's vhost, as the main connection alone does (a side
    connection in ``/`` would answer other offsets, not errors, so nothing would fall back)."""
    names = [f"sl-side-vh-{uuid.uuid4().hex[:6]}-{i}" for i in range(12)]
    url = broker_43.url.rstrip("/") + "/" + quote(other_vhost, safe="")
    with StreamClient.connect(broker_43.url) as default, StreamClient.connect(url) as client:
        try:
            for i, name in enumerate(names):
                default.create_stream(name)
                default.publish(name, [b"d"] * (20 + i))  # more records and chunks in "/"
                default.publish(name, [b"e"])
                default.store_offset_verified(name, "p", 19)
                client.create_stream(name)
                client.publish(name, [b"v"] * (1 + i % 3))
            specs = [OffsetSpec.last(), OffsetSpec.timestamp(0)]
            want = {n: [client.resolve_offset(n, s) for s in specs] for n in names}
            tails = client.committed_tails(names)
            other = {n: [default.resolve_offset(n, s) for s in specs] for n in names}
            assert all(want[n][0] < 3 <= 20 <= other[n][0] for n in names)  # the last user chunks differ
            probe = {n: (0, tails[n]) for n in names}
            counts = client.user_records_many(probe)
            assert client.last_side == []
            client.spread_at, client.side_connections = 4, 3
            assert client.resolve_offsets(names, specs) == want
            assert len(client.last_side) == 3
            assert all(conn.params.vhost == other_vhost for conn in client.last_side)
            assert client.user_records_many(probe, by_last_chunk=True) == counts
        finally:
            for name in names:
                for c in (default, client):
                    c.delete_stream(name)


def test_side_connections_use_the_main_connections_tls_and_certificate_login(
        rabbitmq_tls: TlsSetup, stream_name: StreamNames) -> None:
    """Over TLS with SASL EXTERNAL (a client certificate, no password), every side connection is a TLS
    connection logged in with the same certificate, and the spread round answers as one connection."""
    query = (f"ca_file={rabbitmq_tls.ca_file}&cert_file={rabbitmq_tls.client_cert}"
             f"&key_file={rabbitmq_tls.client_key}&auth=external")
    url = f"rabbitmq-stream+tls://ignored:ignored@{rabbitmq_tls.host}:{rabbitmq_tls.port}/?{query}"
    with StreamClient.connect(url) as client:
        names = _streams(client, stream_name, 12)
        specs = [OffsetSpec.last(), OffsetSpec.timestamp(0)]
        want = {n: [client.resolve_offset(n, s) for s in specs] for n in names}
        client.spread_at, client.side_connections = 4, 3
        assert client.resolve_offsets(names, specs) == want
        assert len(client.last_side) == 3
        assert all(isinstance(conn._sock, ssl.SSLSocket) and conn.params.auth == "external"
                   for conn in client.last_side)


@pytest.mark.parametrize("version", ["4.0", "3.10"])
def test_brokers_without_resolve_offset_spec_answer_many_stream_rounds_without_side_connections(
        version: str, broker_40: Broker, broker_310: Broker, stream_name: StreamNames) -> None:
    """RabbitMQ 4.0 and 3.10 have no ResolveOffsetSpec: the spread is never asked for, no side
    connection is opened, and resolutions and the probe answer as before (one at a time)."""
    broker = broker_40 if version == "4.0" else broker_310
    names = [stream_name(f"old-{i}", broker=broker) for i in range(12)]
    with StreamClient.connect(broker.url) as client:
        for i, name in enumerate(names):
            client.create_stream(name)
            client.publish(name, [b"r%d" % j for j in range(1 + i % 3)])
            if i % 2:
                client.store_offset_verified(name, "p", i % 3)
        specs = [OffsetSpec.last(), OffsetSpec.first()]
        want = {n: [client.resolve_offset(n, s) for s in specs] for n in names}
        tails = client.committed_tails(names)
        probe = {n: (1 + i % 3, tails[n]) for i, n in enumerate(names)}
        probe[names[4]] = (0, tails[names[4]])
        client.spread_at, client.side_connections = 4, 3
        assert client.resolve_offsets(names, specs) == want
        assert client.user_records_many(probe, by_last_chunk=True) == {n: int(n == names[4]) for n in names}
        assert client.last_side == []


def test_side_connections_on_a_broker_without_resolve_offset_spec_leave_their_part_to_the_main_one(
        broker_43: Broker, broker_40: Broker, stream_name: StreamNames) -> None:
    """A load balancer in front of nodes of two versions (a rolling upgrade: the main connection on
    4.3, side connections on 4.0 and 4.3 in turn): a 4.0 node neither knows ResolveOffsetSpec nor
    holds these streams. The round's answers and the probe's counts stay the main connection's."""
    lb = RoundRobin([broker_43.stream_port, broker_40.stream_port])
    try:
        with StreamClient.connect(broker_43.url) as admin:
            names = _streams(admin, stream_name, 12)
            specs, want, probe, counts = _one_connections_answers(admin, names)
        with StreamClient.connect(f"rabbitmq-stream://guest:guest@127.0.0.1:{lb.port}/") as client:
            assert client.connection.advertised_address == (broker_43.host, broker_43.stream_port)
            client.spread_at, client.side_connections = 4, 3
            for _ in range(2):
                assert client.resolve_offsets(names, specs) == want
                assert client.user_records_many(probe, by_last_chunk=True) == counts
            assert client.last_side, "no side connection reached the 4.3 broker"
            assert all(conn.advertised_address == (broker_43.host, broker_43.stream_port)
                       for conn in client.last_side)  # the 4.0 ones closed (UNKNOWN_FRAME), not kept
    finally:
        lb.close()


def test_a_client_that_spread_a_round_still_reads_within_the_connection_limit_it_fitted_before(
        broker_43: Broker, stream_name: StreamNames) -> None:
    """A user allowed 3 connections: a client (1) and a range read beside it (1) fit, as they did
    before side connections. After one spread round the client still reads a range."""
    with StreamClient.connect(broker_43.url) as admin:
        names = _streams(admin, stream_name, 12)
    with _user_limited_to(broker_43, 3) as url, StreamClient.connect(url) as client:
        assert sum(len(b) for b in client.read_range(names[0], 0, 1, prefer="url")) == 1
        client.resolve_offsets(names, [OffsetSpec.last()])  # below spread_at: one connection
        assert sum(len(b) for b in client.read_range(names[0], 0, 1, prefer="url")) == 1
        client.spread_at = 4
        client.resolve_offsets(names, [OffsetSpec.last()])  # a batch of 256 partitions and more
        assert sum(len(b) for b in client.read_range(names[0], 0, 1, prefer="url")) == 1
