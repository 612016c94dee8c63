"""StreamClient against real brokers: the 4.3 / 4.0 / 3.10 matrix for stream management, offsets,
offset resolution, super streams and publishing, with the degradations 3.10 needs."""

from __future__ import annotations

import time

import pytest

from streamledger.protocol.rabbitmq import (
    AuthenticationError,
    ConnectionClosed,
    ConnectionFailed,
    FrameTooLarge,
    InvalidRequest,
    OffsetSpec,
    PreconditionFailed,
    PublishRejected,
    PublishResult,
    StreamAlreadyExists,
    StreamClient,
    StreamNotFound,
    UnsupportedByBroker,
)
from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.publisher import _send_all
from tests.support.rabbitmq import Broker, StreamNames, make_super_stream_310

pytestmark = pytest.mark.rabbitmq


def _with(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


def test_connect_reports_version_and_capabilities(any_broker: Broker) -> None:
    with StreamClient.connect(any_broker.url) as client:
        assert client.server_version is not None
        assert client.server_version.startswith(any_broker.version + ".")
        conn = client.connection
        assert conn.advertised_address is not None
        assert conn.frame_max > 0 and conn.heartbeat > 0
        if any_broker.version == "3.10":
            # ExchangeCommandVersions would make 3.10 close the connection: never sent.
            assert conn.server_commands is None and conn.deliver_version == 1
            assert not client.supports(c.STREAM_STATS)
            assert client.supports(c.QUERY_OFFSET)
        else:
            assert conn.deliver_version == 2
            assert client.supports(c.STREAM_STATS) and client.supports(c.CREATE_SUPER_STREAM)
            assert client.supports(c.RESOLVE_OFFSET_SPEC) == (any_broker.version == "4.3")


def test_stream_lifecycle(any_broker: Broker, stream_name: StreamNames) -> None:
    name = stream_name("life")
    with StreamClient.connect(any_broker.url) as client:
        assert not client.stream_exists(name)
        client.create_stream(name, max_age="1h", max_length_bytes=10_000_000)
        client.create_stream(name, max_age="1h", max_length_bytes=10_000_000, exists_ok=True)
        with pytest.raises(StreamAlreadyExists, match=name):
            client.create_stream(name, max_age="1h", max_length_bytes=10_000_000)
        with pytest.raises(PreconditionFailed):
            client.create_stream(name, max_age="2h")
        assert client.stream_exists(name)
        meta = client.metadata([name, name + "-missing"])
        assert meta[name].exists and meta[name].leader is not None
        assert meta[name + "-missing"].code_name == "STREAM_DOES_NOT_EXIST"
        client.delete_stream(name)
        client.delete_stream(name, missing_ok=True)
        with pytest.raises(StreamNotFound, match=f"Delete on stream '{name}' failed: STREAM_DOES_NOT_EXIST"):
            client.delete_stream(name)
        with pytest.raises(InvalidRequest, match="max_age"):
            client.create_stream(name, max_age="banana")  # crashes 4.0's connection if sent


def test_offsets_and_tail(any_broker: Broker, stream_name: StreamNames) -> None:
    name = stream_name("offs")
    with StreamClient.connect(any_broker.url) as client:
        client.create_stream(name)
        assert (client.first_offset(name), client.committed_tail(name)) == (0, 0)
        assert client.query_offset(name, "app") is None
        result = client.publish(name, [b"m%d" % i for i in range(10)])
        assert (result.published, result.confirmed, result.errors) == (10, 10, [])
        client.store_offset_verified(name, "app", 4)
        assert client.query_offset(name, "app") == 4
        # The idle StoreOffset became a tracking chunk at offset 10; the next records start at 11.
        client.publish(name, [b"n%d" % i for i in range(5)], amqp=False)
        tail = client.committed_tail(name)
        assert client.first_offset(name) == 0
        assert tail == 16
        records = [o for b in client.read_range(name, 0, tail, decode="raw") for o in b.offsets]
        assert records == [*range(10), *range(11, 16)]
        with pytest.raises(StreamNotFound):
            client.query_offset(name + "-missing", "app")


def test_stream_stats_matrix(any_broker: Broker, stream_name: StreamNames) -> None:
    name = stream_name("stats")
    with StreamClient.connect(any_broker.url) as client:
        client.create_stream(name)
        client.publish(name, [b"x"] * 3)
        if any_broker.version == "3.10":
            with pytest.raises(UnsupportedByBroker, match=r"StreamStats is not supported by RabbitMQ 3\.10"):
                client.stream_stats(name)
            assert client.connection.closed is False  # nothing was sent, the connection lives on
            return
        stats = client.stream_stats(name)
        # One publish frame is normally one chunk, but a busy broker may cut it in two.
        assert stats.first_chunk_id == 0 and stats.committed_chunk_id in (0, 1, 2)
        assert client.committed_tail(name, stats=stats) == 3
        if any_broker.version == "4.3":
            assert stats.committed_offset == 2
        else:
            assert stats.committed_offset is None and "committed_offset" not in stats.raw


def test_resolve_offset(any_broker: Broker, stream_name: StreamNames) -> None:
    name = stream_name("resolve")
    with StreamClient.connect(any_broker.url) as client:
        client.create_stream(name)
        assert client.resolve_offset(name, OffsetSpec.timestamp(0)) == 0  # empty: the tail
        client.publish(name, [b"a"] * 3)                      # chunk 0..2
        time.sleep(0.05)
        middle = int(time.time() * 1000)
        time.sleep(0.05)
        client.publish(name, [b"b"] * 4)                      # chunk 3..6
        assert client.resolve_offset(name, OffsetSpec.first()) == 0
        assert client.resolve_offset(name, OffsetSpec.next()) == 7
        # "last" is the first offset of the last chunk. One publish frame is normally one chunk
        # (3..6), but a busy broker may cut it (seen on 4.0: 3..4 and 5..6): where the broker
        # reports its chunks, the answer must be exactly its last chunk's id.
        last = client.resolve_offset(name, OffsetSpec.last())
        assert 3 <= last <= 6
        if any_broker.version != "3.10":
            assert last == client.stream_stats(name).last_chunk_id
        assert client.resolve_offset(name, OffsetSpec.offset(5)) == 5
        assert client.resolve_offset(name, OffsetSpec.offset(99)) == 7
        assert client.resolve_offset(name, OffsetSpec.timestamp(0)) == 0
        assert client.resolve_offset(name, OffsetSpec.timestamp(middle)) == 3
        assert client.resolve_offset(name, OffsetSpec.timestamp(int(time.time() * 1000) + 60_000)) == 7


def test_super_streams(any_broker: Broker, stream_name: StreamNames) -> None:
    name = stream_name.super_stream("ss")
    keyed = stream_name.super_stream("kk")
    with StreamClient.connect(any_broker.url) as client:
        if any_broker.version == "3.10":
            with pytest.raises(UnsupportedByBroker, match=r"CreateSuperStream .* 3\.10"):
                client.create_super_stream(name, partitions=3)
            with pytest.raises(UnsupportedByBroker, match="DeleteSuperStream"):
                client.delete_super_stream(name)
            # Made with the broker CLI; 3.10 answers Partitions/Route without the response bit.
            make_super_stream_310(any_broker, name, 3)
            assert client.partitions(name) == [f"{name}-0", f"{name}-1", f"{name}-2"]
            assert client.route(name, "1") == [f"{name}-1"]
            return
        client.create_super_stream(name, partitions=3, arguments={"max_age": "1h"})
        client.create_super_stream(name, partitions=3, arguments={"max_age": "1h"}, exists_ok=True)
        assert client.partitions(name) == [f"{name}-0", f"{name}-1", f"{name}-2"]
        assert client.route(name, "2") == [f"{name}-2"]
        assert client.route(name, "nope") == []
        client.create_super_stream(keyed, binding_keys=["eu", "us"])
        assert client.partitions(keyed) == [f"{keyed}-eu", f"{keyed}-us"]
        client.delete_super_stream(keyed)
        client.delete_super_stream(name)
        client.delete_super_stream(name, missing_ok=True)
        with pytest.raises(StreamNotFound):
            client.partitions(name)
        assert not client.stream_exists(f"{name}-0")
        with pytest.raises(InvalidRequest, match="exactly one"):
            client.create_super_stream(name, partitions=2, binding_keys=["a", "b"])


def test_publish_dedup_by_reference(any_broker: Broker, stream_name: StreamNames) -> None:
    name = stream_name("dedup")
    with StreamClient.connect(any_broker.url) as client:
        client.create_stream(name)
        first = client.publish(name, [b"a", b"b", b"c"], publisher_ref="loader", first_publishing_id=1)
        assert (first.first_publishing_id, first.last_publishing_id) == (1, 3)
        # A retried publish with the same ids is confirmed but not stored again.
        again = client.publish(name, [b"a", b"b", b"c"], publisher_ref="loader", first_publishing_id=1)
        assert again.confirmed == 3
        # Without explicit ids the publisher continues after QueryPublisherSequence.
        more = client.publish(name, [b"d"], publisher_ref="loader")
        assert more.first_publishing_id == 4
        tail = client.committed_tail(name)
        bodies = [body for b in client.read_range(name, 0, tail) for body in b.bodies]
        assert bodies == [b"a", b"b", b"c", b"d"]


def test_publish_respects_small_frame_max(broker_43: Broker, stream_name: StreamNames) -> None:
    """4.3 closes the connection on any frame above the negotiated frame max: batches must split."""
    name = stream_name("fmax")
    with StreamClient.connect(_with(broker_43.url, "frame_max=4096")) as client:
        assert client.connection.frame_max == 4096
        client.create_stream(name)
        bodies = [bytes([65 + i % 26]) * 1000 for i in range(200)]
        result = client.publish(name, bodies, batch_size=500)
        assert result.confirmed == 200
        with pytest.raises(FrameTooLarge, match="does not fit in one frame"):
            client.publish(name, [b"x" * 5000])
        got = [body for b in client.read_range(name, 0, client.committed_tail(name)) for body in b.bodies]
        assert got == bodies


def test_heartbeats_keep_an_idle_connection_alive(broker_43: Broker, stream_name: StreamNames) -> None:
    """With heartbeat=2 the broker drops a silent connection after ~6 s; ours must survive."""
    name = stream_name("hb")
    with StreamClient.connect(_with(broker_43.url, "heartbeat=2")) as client:
        assert client.connection.heartbeat == 2
        time.sleep(7)
        client.create_stream(name)
        assert client.stream_exists(name)


def test_bad_credentials_and_vhost_are_clear(broker_43: Broker) -> None:
    url = broker_43.url.replace("guest:guest@", "guest:Wr0ngPassw0rd@")
    with pytest.raises(AuthenticationError, match="AUTHENTICATION_FAILURE") as info:
        StreamClient.connect(url)
    assert "Wr0ngPassw0rd" not in str(info.value)
    with pytest.raises(AuthenticationError, match="VIRTUAL_HOST_ACCESS_FAILURE"):
        StreamClient.connect(broker_43.url.rstrip("/") + "/no-such-vhost")
    with pytest.raises(ConnectionFailed, match=r"cannot connect to 127\.0\.0\.1:1"):
        StreamClient.connect("rabbitmq-stream://guest:guest@127.0.0.1:1/", timeout=2)


def test_why_3_10_is_never_sent_new_commands(broker_310: Broker) -> None:
    """Forcing ExchangeCommandVersions onto 3.10 shows what the version gate prevents: the broker
    closes the connection (Close UNKNOWN_FRAME), which we answer and report, never hang on."""
    client = StreamClient.connect(broker_310.url)
    try:
        with pytest.raises(ConnectionClosed, match=r"closed the connection .*UNKNOWN_FRAME") as info:
            client.connection._exchange_command_versions()
        assert info.value.code_name == "UNKNOWN_FRAME"
        assert client.connection.closed
        with pytest.raises(ConnectionClosed):
            client.stream_exists("anything")
    finally:
        client.close()


def test_publish_error_is_reported(broker_43: Broker, stream_name: StreamNames) -> None:
    """PublishError frames (here: an undeclared publisher id, code 0x12) are collected per id."""
    name = stream_name("puberr")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        result = PublishResult()
        _send_all(client.connection, 99, name, [b"a", b"b"], result, 1, amqp=False, batch_size=10,
                  app_props=None, timeout=5.0, window=100)
        assert result.errors == [(1, "PUBLISHER_DOES_NOT_EXIST"), (2, "PUBLISHER_DOES_NOT_EXIST")]
        assert result.confirmed == 0
        error = PublishRejected(name, result.errors)
        assert "2 message(s) rejected (first: publishing id 1, PUBLISHER_DOES_NOT_EXIST)" in str(error)


def test_a_url_naming_more_nodes_connects_through_the_next_when_the_first_is_down(
    broker_43: Broker, stream_name: StreamNames,
) -> None:
    """A cluster's URL names one node; ``nodes=`` names the others, tried in order when it refuses
    (a stopped node must not stop every batch that starts meanwhile). A connection to a stream's
    member (leader, replica) never falls back to another node: it must reach that member."""
    name = stream_name("nodes")
    down = broker_43.url.replace(f":{broker_43.stream_port}", ":1")
    with StreamClient.connect(_with(down, f"nodes=127.0.0.1:2,localhost:{broker_43.stream_port}")) as client:
        assert client.connection.params.address == f"localhost:{broker_43.stream_port}"
        client.create_stream(name)
        client.publish(name, [b"a", b"b"])
        got = [body for b in client.read_range(name, 0, client.committed_tail(name)) for body in b.bodies]
        assert got == [b"a", b"b"]
    with pytest.raises(ConnectionFailed, match=r"cannot connect to 127\.0\.0\.1:1, 127\.0\.0\.1:2: "):
        StreamClient.connect(_with(down, "nodes=127.0.0.1:2"), timeout=2)
    for bad in ("nodes=127.0.0.1", "nodes=127.0.0.1:99999", "nodes=:5552", "nodes="):
        with pytest.raises(InvalidRequest, match="nodes"):
            StreamClient.connect(_with(down, bad))
