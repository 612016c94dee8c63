"""Interop with rstream as an independent peer (test-only): what rstream publishes - AMQP, raw and
sub-entry batches (gzip and uncompressed) - we read exactly; what we publish rstream reads; stored
offsets cross over in both directions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rstream import (
    AMQPMessage,
    CompressionType,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
    amqp_decoder,
)
from rstream import Consumer as RConsumer

from streamledger.protocol.rabbitmq import StreamClient
from tests.support.rabbitmq import Broker, StreamNames

pytestmark = pytest.mark.rabbitmq

AUTH = {"username": "guest", "password": "guest"}


async def _rstream_publish(broker: Broker, stream: str) -> list[tuple[bytes, dict[str, Any] | None]]:
    """Publish a mix and return the expected (body, application properties) per offset."""
    expected: list[tuple[bytes, dict[str, Any] | None]] = []
    confirmed = 0
    total = 0

    async def on_confirm(status: Any) -> None:
        nonlocal confirmed
        if status.is_confirmed:
            confirmed += 1

    async with Producer(broker.host, broker.stream_port, **AUTH) as producer:
        amqp = [AMQPMessage(body=b"amqp-%d" % i, application_properties={"i": i}) for i in range(40)]
        await producer.send_batch(stream, amqp, on_publish_confirm=on_confirm)
        expected += [(b"amqp-%d" % i, {"i": i}) for i in range(40)]
        total += 40
        raw = [b"raw-%d" % i for i in range(30)]
        await producer.send_batch(stream, raw, on_publish_confirm=on_confirm)
        expected += [(body, None) for body in raw]
        total += 30
        for compression in (CompressionType.Gzip, CompressionType.No):
            sub = [AMQPMessage(body=b"sub-%s-%d" % (compression.name.encode(), i),
                               application_properties={"c": compression.name})
                   for i in range(25)]
            await producer.send_sub_entry(stream, sub, compression_type=compression,
                                          on_publish_confirm=on_confirm)
            expected += [(m.body, {"c": compression.name}) for m in sub]
            total += 1  # one publishing id (one confirm) per sub-entry batch
        for _ in range(200):
            if confirmed >= total:
                break
            await asyncio.sleep(0.05)
    assert confirmed >= total
    return expected


def test_we_read_what_rstream_publishes(broker_43: Broker, stream_name: StreamNames) -> None:
    name = stream_name("from-rstream")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        expected = asyncio.run(_rstream_publish(broker_43, name))
        tail = client.committed_tail(name)
        assert tail == len(expected)
        batches = list(client.read_range(name, 0, tail))
        got = [(o, body, app) for b in batches
               for o, body, app in zip(b.offsets, b.bodies, b.application_properties or [], strict=True)]
        assert [o for o, _, _ in got] == list(range(len(expected)))
        assert [(body, app) for _, body, app in got] == expected
        # A range that starts and ends inside the gzip sub-entry batch.
        gzip_start = 70
        part = [o for b in client.read_range(name, gzip_start + 3, gzip_start + 11) for o in b.offsets]
        assert part == list(range(gzip_start + 3, gzip_start + 11))
        raw = [body for b in client.read_range(name, 40, 70, decode="raw") for body in b.bodies]
        assert raw == [b"raw-%d" % i for i in range(30)]


async def _rstream_consume(broker: Broker, stream: str, count: int, *, amqp: bool) -> list[tuple[int, Any]]:
    got: list[tuple[int, Any]] = []
    done = asyncio.Event()

    async def on_msg(msg: Any, ctx: Any) -> None:
        got.append((ctx.offset, msg))
        if len(got) >= count:
            done.set()

    consumer = RConsumer(broker.host, broker.stream_port, **AUTH)
    await consumer.start()
    try:
        await consumer.subscribe(
            stream, on_msg, decoder=amqp_decoder if amqp else None,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
        )
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await consumer.close()
    return got


def test_rstream_reads_what_we_publish(broker_43: Broker, stream_name: StreamNames) -> None:
    amqp_stream = stream_name("to-rstream-amqp")
    raw_stream = stream_name("to-rstream-raw")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(amqp_stream)
        client.create_stream(raw_stream)
        bodies = [b"ours-%d" % i for i in range(1200)]
        client.publish(amqp_stream, bodies, application_properties={"src": "streamledger"}, batch_size=300)
        client.publish(raw_stream, bodies, amqp=False, batch_size=300)
    got = asyncio.run(_rstream_consume(broker_43, amqp_stream, len(bodies), amqp=True))
    assert [o for o, _ in got] == list(range(len(bodies)))
    assert [m.body for _, m in got] == bodies
    # rstream's decoder returns AMQP strings as bytes.
    assert all(m.application_properties == {b"src": b"streamledger"} for _, m in got)
    got_raw = asyncio.run(_rstream_consume(broker_43, raw_stream, len(bodies), amqp=False))
    assert [bytes(m) for _, m in got_raw] == bodies


async def _rstream_offsets(broker: Broker, stream: str, store: int) -> int:
    consumer = RConsumer(broker.host, broker.stream_port, **AUTH)
    await consumer.start()
    try:
        seen = await consumer.query_offset(stream, "ours")
        await consumer.store_offset(stream, "theirs", store)
        return seen
    finally:
        await consumer.close()


def test_offsets_cross_over(broker_43: Broker, stream_name: StreamNames) -> None:
    name = stream_name("offsets")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        client.publish(name, [b"x"] * 10)
        client.store_offset_verified(name, "ours", 7)
        seen_by_rstream = asyncio.run(_rstream_offsets(broker_43, name, 3))
        assert seen_by_rstream == 7
        for _ in range(50):
            if client.query_offset(name, "theirs") == 3:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert client.query_offset(name, "theirs") == 3
