"""Topology made over AMQP 1.0, checked through independent views: the stream protocol (our
StreamClient and rstream), the management HTTP API, and the official rabbitmq-amqp-python-client."""

from __future__ import annotations

import asyncio

import pytest

from streamledger.protocol.amqp10 import (
    Amqp10Error,
    Amqp10TlsError,
    AuthenticationFailed,
    BadRequest,
    Conflict,
    Management,
    NotFound,
    PartitionsUnknown,
    RemoteClosed,
    RequestTooLarge,
    StreamOptions,
)
from streamledger.protocol.amqp10.codec.types import Long
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.amqp10.conftest import Amqps, HttpApi, Names, amqp_url
from tests.support.rabbitmq import Broker

pytestmark = pytest.mark.rabbitmq

RESERVED = "a/b c%d;e=f?g#h&i+é"


def test_stream_lifecycle_seen_by_stream_protocol_and_http(
    management: Management, amqp_broker: Broker, http_api: HttpApi, names: Names
) -> None:
    name = names.queue("x") + RESERVED
    names.queues.append(name)
    options = StreamOptions(
        max_age="7D",
        max_length_bytes=2_000_000_000,
        max_segment_size_bytes=50_000_000,
        initial_cluster_size=1,
        leader_locator="balanced",
        filter_size_bytes=32,
    )
    info = management.declare_stream(name, options)
    assert (info.name, info.type, info.durable) == (name, "stream", True)
    node = f"rabbit{amqp_broker.version.replace('.', '')}@localhost"
    assert info.leader == node and info.members == (node,)

    seen = http_api.queue(name)
    assert seen["type"] == "stream" and seen["durable"] is True
    assert seen["arguments"] == {
        "x-queue-type": "stream",
        "x-max-age": "7D",
        "x-max-length-bytes": 2_000_000_000,
        "x-stream-max-segment-size-bytes": 50_000_000,
        "x-initial-cluster-size": 1,
        "x-queue-leader-locator": "balanced",
        "x-stream-filter-size-bytes": 32,
    }
    with StreamClient.connect(amqp_broker.url) as client:
        assert client.stream_exists(name)
        client.publish(name, [b"m%d" % i for i in range(5)])
        assert [r for b in client.read_range(name, 0, 5) for r in b.bodies] == [b"m%d" % i for i in range(5)]

    again = management.declare_stream(name, options)  # idempotent with the same arguments
    assert again.arguments == info.arguments
    assert management.get_queue(name).members == (node,)

    assert management.delete_queue(name) == 0
    assert http_api.queue(name) is None
    with StreamClient.connect(amqp_broker.url) as client:
        assert not client.stream_exists(name)
    with pytest.raises(NotFound, match=r"get queue .*: 404: queue .* not found"):
        management.get_queue(name)
    assert management.delete_queue(name) == 0  # absent: idempotent, as the broker answers 200


def test_many_requests_on_one_connection(management: Management, names: Names) -> None:
    """RabbitMQ starts its delivery counts just below 2**32: they wrap within a few hundred answers,
    and credit and session windows are topped up many times."""
    name = names.queue()
    management.declare_stream(name)
    for _ in range(300):
        assert management.queue_exists(name)
    assert not management.queue_exists(name + "-absent")


def test_errors_carry_status_and_broker_text(management: Management, names: Names) -> None:
    name = names.queue()
    management.declare_stream(name, StreamOptions(max_age="1D"))
    with pytest.raises(Conflict) as info:
        management.declare_stream(name, StreamOptions(max_age="2D"))
    assert info.value.status == 409 and "inequivalent arg 'x-max-age'" in (info.value.description or "")
    with pytest.raises(BadRequest) as bad:
        management.purge_queue(name)
    assert bad.value.status == 400 and "purge not supported" in str(bad.value)
    with pytest.raises(BadRequest, match="400: no exchange 't-amqp-no-such-exchange'"):
        management.bind("t-amqp-no-such-exchange", name, "k")
    # the connection is still usable after error answers
    assert management.get_queue(name).type == "stream"
    # a request the broker's node cannot handle ends the session: said at once on the next request
    with pytest.raises(RemoteClosed, match="the broker closed the session: amqp:internal-error"):
        management.connection.request("GET", f"/bindings?src={name}")
    with pytest.raises(RemoteClosed, match="the broker closed the session"):
        management.get_queue(name)


def test_classic_queue_purge_and_bindings_with_arguments(
    management: Management, http_api: HttpApi, names: Names
) -> None:
    queue, exchange = names.queue("q") + "/1", names.queue("x") + "/1"
    names.queues.append(queue)
    names.exchanges.append(exchange)
    assert management.declare_queue(queue, arguments={"x-queue-type": "classic"}).type == "classic"
    management.declare_exchange(exchange, type="direct")
    assert http_api.exchange(exchange)["type"] == "direct"
    management.bind(exchange, queue, "k/1", arguments={"tag": "a"})
    management.bind(exchange, queue, "k/1", arguments={"tag": "b"})
    management.bind(exchange, queue, "k/1")
    got = [(b["routing_key"], b["arguments"]) for b in http_api.bindings_from(exchange)]
    assert sorted(got, key=str) == sorted(
        [("k/1", {"tag": "a"}), ("k/1", {"tag": "b"}), ("k/1", {})], key=str
    )
    assert len(management.binding_locations(exchange, queue, "k/1")) == 3

    assert management.unbind(exchange, queue, "k/1", arguments={"tag": "a"}) == 1
    assert management.unbind(exchange, queue, "k/1", arguments={}) == 1
    assert [(b["routing_key"], b["arguments"]) for b in http_api.bindings_from(exchange)] == [
        ("k/1", {"tag": "b"})
    ]
    assert management.unbind(exchange, queue, "k/1") == 1
    assert http_api.bindings_from(exchange) == []
    assert management.purge_queue(queue) == 0
    management.delete_exchange(exchange)
    assert http_api.exchange(exchange) is None


def _topology(http_api: HttpApi, super_stream: str) -> tuple[object, list[tuple[str, str, object]]]:
    x = http_api.exchange(super_stream)
    shape = (x["type"], x["durable"], x["auto_delete"], x["internal"], x["arguments"])
    bindings = [
        (b["destination"].removeprefix(super_stream), b["routing_key"], b["arguments"])
        for b in http_api.bindings_from(super_stream)
    ]
    return shape, bindings


def test_super_stream_is_indistinguishable_from_the_brokers_own(
    management: Management, amqp_broker: Broker, http_api: HttpApi, names: Names
) -> None:
    ours = names.super_stream("ours", partitions=3)
    theirs = names.super_stream("theirs", partitions=3)
    assert management.create_super_stream(ours, partitions=3) == [f"{ours}-{i}" for i in range(3)]
    with StreamClient.connect(amqp_broker.url) as client:
        client.create_super_stream(theirs, partitions=3)  # the stream protocol's CreateSuperStream
        assert client.partitions(ours) == [f"{ours}-{i}" for i in range(3)]
        assert client.route(ours, "2") == [f"{ours}-2"]
    assert _topology(http_api, ours) == _topology(http_api, theirs)
    shape, bindings = _topology(http_api, ours)
    assert shape == ("direct", True, False, False, {"x-super-stream": True})
    assert bindings == [(f"-{i}", str(i), {"x-stream-partition-order": i}) for i in range(3)]
    for i in range(3):
        assert http_api.queue(f"{ours}-{i}")["arguments"] == {"x-queue-type": "stream"}

    # rstream, another stream-protocol client, sees the same partitions and routes
    from rstream import Producer

    async def rstream_view() -> tuple[list[str], list[str]]:
        producer = Producer(
            host=amqp_broker.host, port=amqp_broker.stream_port, username="guest", password="guest"
        )
        await producer.start()
        try:
            client = await producer.default_client
            return await client.partitions(ours), await client.route("1", ours)
        finally:
            await producer.close()

    assert asyncio.run(rstream_view()) == ([f"{ours}-{i}" for i in range(3)], [f"{ours}-1"])

    # the stream protocol's DeleteSuperStream works on ours, and ours deletes theirs
    with StreamClient.connect(amqp_broker.url) as client:
        client.delete_super_stream(ours)
        assert not any(client.stream_exists(f"{ours}-{i}") for i in range(3))
    assert management.delete_super_stream(theirs) == [f"{theirs}-{i}" for i in range(3)]
    assert http_api.exchange(theirs) is None and http_api.queue(f"{theirs}-0") is None


def test_super_stream_by_binding_keys_with_reserved_characters(
    management: Management, amqp_broker: Broker, http_api: HttpApi, names: Names
) -> None:
    keys = ["eu/west", "us east", "a;b=c"]
    name = names.super_stream("keys", keys=keys)
    streams = management.create_super_stream(name, binding_keys=keys, options=StreamOptions(max_age="3D"))
    assert streams == [f"{name}-{k}" for k in keys]
    with StreamClient.connect(amqp_broker.url) as client:
        assert client.partitions(name) == streams
        assert client.route(name, "us east") == [f"{name}-us east"]
        assert client.route(name, "eu/west") == [f"{name}-eu/west"]
    assert http_api.queue(f"{name}-eu/west")["arguments"]["x-max-age"] == "3D"
    assert (
        management.create_super_stream(name, binding_keys=keys, options=StreamOptions(max_age="3D"))
        == streams
    )
    # Issue 20: unnamed keyed partitions are refused before anything is deleted (the exchange alone
    # used to go, leaving the partition streams where nothing names them any more).
    with pytest.raises(PartitionsUnknown, match="cannot list them"):
        management.delete_super_stream(name)
    assert http_api.exchange(name) is not None and management.exchange_exists(name)
    assert management.delete_super_stream(name, binding_keys=keys) == streams
    assert http_api.exchange(name) is None and not management.exchange_exists(name)
    assert http_api.exchange(name) is None  # the probe left nothing behind
    assert all(http_api.queue(s) is None for s in streams)


def test_request_size_limit_is_the_brokers_frame_size(
    management: Management, http_api: HttpApi, names: Names
) -> None:
    exchange = names.queue("big")
    names.exchanges.append(exchange)
    peer_max = management.connection.peer_max_frame_size
    assert peer_max >= 4096
    # fits one frame: accepted
    padding = "p" * (peer_max - 600)
    management.declare_exchange(exchange, type="fanout", arguments={"x-pad": padding, "x-n": Long(7)})
    assert http_api.exchange(exchange)["arguments"] == {"x-pad": padding, "x-n": 7}
    # does not fit: refused before sending (the broker's node ends the session on multi-frame requests)
    with pytest.raises(RequestTooLarge, match=f"does not fit the broker's max-frame-size of {peer_max}"):
        management.declare_exchange(exchange + "-2", arguments={"x-pad": "p" * peer_max})
    assert http_api.exchange(exchange + "-2") is None
    management.delete_exchange(exchange)  # the connection is still fine
    assert http_api.exchange(exchange) is None


def test_official_client_sees_our_topology_and_we_see_its(amqp_broker: Broker, names: Names) -> None:
    from rabbitmq_amqp_python_client import (
        Environment,
        ExchangeSpecification,
        ExchangeToQueueBindingSpecification,
        StreamSpecification,
    )

    ours, theirs, exchange = names.queue("ours"), names.queue("theirs"), names.queue("x")
    names.exchanges.append(exchange)
    env = Environment(uri=amqp_url(amqp_broker))
    conn = env.connection()
    conn.dial()
    peer = conn.management()
    try:
        with Management.connect(amqp_url(amqp_broker)) as m:
            m.declare_stream(ours, StreamOptions(max_length_bytes=123_456_789))
            info = peer.queue_info(ours)
            assert info.queue_type.value == "stream" and info.arguments["x-max-length-bytes"] == 123_456_789
            assert info.leader == m.get_queue(ours).leader and list(info.members) == list(
                m.get_queue(ours).members
            )

            peer.declare_queue(
                StreamSpecification(
                    name=theirs, max_len_bytes=987_654_321, stream_max_segment_size_bytes=10_000_000
                )
            )
            mine = m.get_queue(theirs)
            assert mine.type == "stream"
            assert mine.arguments["x-max-length-bytes"] == 987_654_321
            assert mine.arguments["x-stream-max-segment-size-bytes"] == 10_000_000

            peer.declare_exchange(ExchangeSpecification(name=exchange))
            peer.bind(
                ExchangeToQueueBindingSpecification(
                    source_exchange=exchange, destination_queue=theirs, binding_key="rk"
                )
            )
            assert len(m.binding_locations(exchange, theirs, "rk")) == 1
            assert m.unbind(exchange, theirs, "rk") == 1
            m.delete_queue(theirs)
            m.delete_exchange(exchange)
    finally:
        peer.close()
        conn.close()
        env.close()


def test_sasl_anonymous_and_refused_login(amqp_broker: Broker) -> None:
    with Management.connect(f"amqp://{amqp_broker.host}:{amqp_broker.amqp_port}/") as m:  # ANONYMOUS
        assert m.connection.server_version == m.connection.server_properties["version"]
        assert m.connection.server_version is not None
        assert m.connection.server_version.startswith(amqp_broker.version)
    with pytest.raises(AuthenticationFailed) as info:
        Management.connect(amqp_url(amqp_broker, password="wrong-pw-123"))
    assert "wrong-pw-123" not in str(info.value) and "login refused" in str(info.value)


def test_unknown_vhost_is_a_clear_error(amqp_broker: Broker) -> None:
    with pytest.raises(Amqp10Error) as info:
        Management.connect(f"amqp://guest:guest@{amqp_broker.host}:{amqp_broker.amqp_port}/no-such-vhost")
    assert "does vhost 'no-such-vhost' exist, and may this user access it?" in str(info.value)
    assert "\n" not in str(info.value)


def test_amqps_plain_external_and_wrong_ca(amqps: Amqps, names: Names, broker_43: Broker) -> None:
    name = names.queue("tls")
    with Management.connect(amqps.url) as m:
        assert m.declare_stream(name).type == "stream"
    with Management.connect(amqps.external_url) as m:  # SASL EXTERNAL: the certificate's CN logs in
        assert m.get_queue(name).type == "stream"
        m.delete_queue(name)
    with pytest.raises(Amqp10TlsError, match="CERTIFICATE_VERIFY_FAILED"):
        Management.connect(amqps.wrong_ca_url)
