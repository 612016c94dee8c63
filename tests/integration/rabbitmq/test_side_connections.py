"""Issue 44 (red team): a ResolveOffsetSpec round over many streams spread over side connections
(``StreamClient._spread``) against the real 4.3 broker where the side connections cannot be had, and
what the client leaves behind: the answers stay the main connection's, no socket outlives ``close()``,
and no password reaches a log line."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from streamledger.protocol.rabbitmq import StreamClient
from streamledger.protocol.rabbitmq.offsets import OffsetSpec
from tests.support.rabbitmq import Broker, StreamNames

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


@pytest.fixture
def limited_user(broker_43: Broker) -> Iterator[str]:
    """A broker URL for a fresh user the broker lets hold one connection at a time."""
    user = f"sl-side-{uuid.uuid4().hex[:8]}"
    broker_43.cli("rabbitmqctl", "-q", "add_user", user, PASSWORD)
    try:
        broker_43.cli("rabbitmqctl", "-q", "set_permissions", "-p", "/", user, ".*", ".*", ".*")
        broker_43.cli("rabbitmqctl", "-q", "set_user_limits", user, '{"max-connections": 1}')
        yield f"rabbitmq-stream://{user}:{quote(PASSWORD, safe='')}@{broker_43.host}:{broker_43.stream_port}/"
    finally:
        broker_43.cli("rabbitmqctl", "-q", "delete_user", user)


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
        specs = [OffsetSpec.last(), OffsetSpec.timestamp(0)]
        want = {n: [admin.resolve_offset(n, s) for s in specs] for n in names}
        tails = admin.committed_tails(names)
        probe = {n: (1 + i % 3, tails[n]) for i, n in enumerate(names)}
        probe[names[4]] = (0, tails[names[4]])
        counts = admin.user_records_many(probe)
    assert counts == {n: int(n == names[4]) for n in names}

    before = _sockets()
    with StreamClient.connect(limited_user) as client:
        client.spread_at, client.side_connections = 4, 3
        assert client.resolve_offsets(names, specs) == want
        assert client._side == []  # every side connection refused: none kept
        assert client.user_records_many(probe, by_last_chunk=True) == counts
        assert client.resolve_offsets(names, specs) == want  # asked again: refused again, same answers
        assert len(_sockets() - before) == 1  # the main connection only
    assert _sockets() - before == set()
    assert any("side connection" in r.getMessage() for r in caplog.records), "no refusal was logged"
    assert all(PASSWORD not in r.getMessage() and quote(PASSWORD, safe="") not in r.getMessage()
               for r in caplog.records)


def test_closing_a_client_that_spread_a_round_closes_every_socket_it_opened(
        broker_43: Broker, stream_name: StreamNames) -> None:
    """Side connections are kept between rounds; ``close()`` (and leaving ``with``) closes them with
    the main connection, whether the round was a resolution, a probe or planning's resolve_offsets,
    and after a side connection broke and was replaced."""
    with StreamClient.connect(broker_43.url) as admin:
        names = _streams(admin, stream_name, 12)
        tails = admin.committed_tails(names)
    before = _sockets()
    for _ in range(3):
        with StreamClient.connect(broker_43.url) as client:
            client.spread_at, client.side_connections = 4, 3
            client.resolve_offsets(names, [OffsetSpec.last()])
            assert len(client._side) == 3
            client._side[0]._shutdown_socket()  # broken under the client: replaced next round
            client.user_records_many({n: (0, tails[n]) for n in names}, by_last_chunk=True)
            assert len(client._side) == 2  # the broken one closed, not kept
            client.resolve_offsets(names, [OffsetSpec.last()])
            assert len(client._side) == 3  # and replaced
            assert len(_sockets() - before) == 4
    assert _sockets() - before == set()
