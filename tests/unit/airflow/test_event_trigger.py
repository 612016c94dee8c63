"""The event trigger behind ``MessageQueueTrigger(scheme="rabbitmq-stream")``: dispatch, serialisation,
and its announce-once rule against the real 4.3 broker (tracking chunks included)."""

from __future__ import annotations

import asyncio
import importlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from streamledger.protocol.rabbitmq import StreamClient, parse_url
from streamledger.triggers.backlog import StreamPosition
from streamledger.triggers.new_data import (
    StreamDataEventTrigger,
    announced_reference,
    plan_announcement,
)


@pytest.fixture
def conn_id(monkeypatch: pytest.MonkeyPatch, rabbitmq_url: str) -> str:
    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_EVENT_RMQ", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": params.password, "schema": params.vhost}))
    return "event_rmq"


def _fresh(trigger: StreamDataEventTrigger) -> StreamDataEventTrigger:
    """What the triggerer does after every event: rebuild the trigger from its serialised form."""
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert isinstance(rebuilt, StreamDataEventTrigger)
    return rebuilt


def test_message_queue_trigger_dispatches_the_scheme_to_our_trigger() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.triggers.base import BaseEventTrigger

    mq = MessageQueueTrigger(scheme="rabbitmq-stream", super_stream="ev", pipeline="p",
                             rabbitmq_stream_conn_id="rmq", min_backlog=3, poll_interval=2)
    assert isinstance(mq.trigger, StreamDataEventTrigger) and isinstance(mq.trigger, BaseEventTrigger)
    classpath, kwargs = mq.serialize()
    assert classpath == "streamledger.triggers.new_data.StreamDataEventTrigger"
    assert kwargs["super_stream"] == "ev" and kwargs["min_backlog"] == 3 and kwargs["poll_interval"] == 2.0
    assert kwargs["settle"] == 1.0
    assert _fresh(mq.trigger).serialize() == (classpath, kwargs)
    # Airflow identifies watcher triggers by this hash: it must not change between parses
    assert BaseEventTrigger.hash(classpath, kwargs) == BaseEventTrigger.hash(*_fresh(mq.trigger).serialize())


def test_validation() -> None:
    with pytest.raises(ValueError, match="exactly one of stream= or super_stream="):
        StreamDataEventTrigger(pipeline="p")
    with pytest.raises(ValueError, match="min_backlog must be >= 1"):
        StreamDataEventTrigger(pipeline="p", stream="s", min_backlog=0)
    with pytest.raises(ValueError, match="pipeline is required"):
        StreamDataEventTrigger(pipeline="", stream="s")


@pytest.mark.parametrize("pipeline", ["p", "x" * 245, "x" * 246, "y" * 256, "é" * 128])
def test_announced_reference_fits_the_broker_limit(pipeline: str) -> None:
    ref = announced_reference(pipeline)
    assert 0 < len(ref.encode("utf-8")) <= 255 and ref.endswith(".announced")
    if len((pipeline + ".announced").encode()) <= 255:
        assert ref == pipeline + ".announced"
    else:  # distinct pipelines sharing a long prefix keep distinct references
        assert announced_reference(pipeline[:-1] + "z") != ref


def test_plan_counts_only_user_data_past_both_positions() -> None:
    # s0: pipeline at 10, tail 20, last user chunk at 15 -> 10 new; s1: only a tracking chunk after 7
    positions = [StreamPosition("s0", 10, 20, 15), StreamPosition("s1", 7, 8, 3)]
    plan = plan_announcement(positions, {"s0": None, "s1": None})
    assert plan["s0"].to_dict() == {"tail": 20, "backlog": 10, "new": 10, "from": 10}
    assert plan["s1"].to_dict() == {"tail": 8, "backlog": 0, "new": 0, "from": 7}
    # announced up to 14: only the chunk at 15 is new
    assert plan_announcement(positions, {"s0": 14})["s0"].new == 5
    # announced up to 15 (our tracking chunk landed at 16... no user chunk from 16): silent
    assert plan_announcement(positions, {"s0": 15})["s0"].new == 0


def test_announces_once_and_a_fresh_instance_stays_silent(conn_id: str, rabbitmq_url: str, stream_name: Any,
                                                           tmp_path: Path) -> None:
    stream = stream_name("h14-ev")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [b"a"] * 5)
    trigger = StreamDataEventTrigger(pipeline="h14-p", stream=stream, rabbitmq_stream_conn_id=conn_id,
                                     ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}", poll_interval=0.2)
    payload = trigger.check()
    assert payload is not None
    assert payload["streams"][stream] == {"tail": 5, "backlog": 5, "new": 5, "from": 0}
    assert payload["tail"] == {stream: 5} and payload["backlog"] == 5 and payload["new"] == 5
    assert not (tmp_path / "ledger.db").exists(), "polling must not create the ledger"

    with StreamClient.connect(rabbitmq_url) as client:
        assert client.query_offset(stream, "h14-p.announced") == 4
        assert client.query_offset(stream, "h14-p") is None, "the pipeline's own offset is not touched"
        assert client.committed_tail(stream) == 6, "the announcement took an offset (a tracking chunk)"
    # re-created after the event: silent, although the tail moved by the tracking chunk
    assert _fresh(trigger).check() is None
    assert _fresh(trigger).check() is None

    with StreamClient.connect(rabbitmq_url) as client:
        client.publish(stream, [b"b"] * 3)
    payload = _fresh(trigger).check()
    assert payload is not None
    # offsets 5 (our tracking chunk) .. 8: counted as offsets, announced from 5
    assert payload["streams"][stream]["from"] == 5 and payload["streams"][stream]["tail"] == 9
    assert payload["backlog"] == 9  # nothing processed yet: all offsets wait
    assert _fresh(trigger).check() is None


def test_data_the_pipeline_processed_is_never_announced(conn_id: str, rabbitmq_url: str, stream_name: Any,
                                                        tmp_path: Path) -> None:
    stream = stream_name("h14-done")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [b"a"] * 4)
        # a batch processed [0, 4) and stored its offset (no ledger file: the broker offset is the history)
        client.store_offset_verified(stream, "h14-q", 3)
        assert client.committed_tail(stream) == 5  # the batch's StoreOffset took offset 4
    trigger = StreamDataEventTrigger(pipeline="h14-q", stream=stream, rabbitmq_stream_conn_id=conn_id,
                                     ledger_url=f"sqlite:///{tmp_path / 'none.db'}")
    assert trigger.check() is None
    with StreamClient.connect(rabbitmq_url) as client:
        client.publish(stream, [b"b"] * 2)
    payload = trigger.check()
    assert payload is not None and payload["streams"][stream]["from"] == 4 and payload["backlog"] == 3


def test_super_stream_stores_announcements_only_where_data_arrived(conn_id: str, rabbitmq_url: str,
                                                                    stream_name: Any, tmp_path: Path) -> None:
    name = stream_name.super_stream("h14-ss")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=3)
        parts = client.partitions(name)
        client.publish(parts[1], [b"x"] * 7)
    trigger = StreamDataEventTrigger(pipeline="h14-s", super_stream=name, rabbitmq_stream_conn_id=conn_id,
                                     ledger_url=f"sqlite:///{tmp_path / 'l.db'}", min_backlog=5)
    payload = trigger.check()
    assert payload is not None and payload["super_stream"] == name
    assert {s: v["new"] for s, v in payload["streams"].items()} == {parts[0]: 0, parts[1]: 7, parts[2]: 0}
    with StreamClient.connect(rabbitmq_url) as client:
        stored = {p: client.query_offset(p, "h14-s.announced") for p in parts}
        tails = {p: client.committed_tail(p) for p in parts}
    assert stored == {parts[0]: None, parts[1]: 6, parts[2]: None}
    assert tails[parts[0]] == 0 and tails[parts[2]] == 0, "idle partitions get no tracking chunk"

    # below the threshold: silent, and nothing is marked announced
    with StreamClient.connect(rabbitmq_url) as client:
        client.publish(parts[0], [b"y"] * 2)
        client.publish(parts[2], [b"y"] * 2)
    assert _fresh(trigger).check() is None
    with StreamClient.connect(rabbitmq_url) as client:
        client.publish(parts[2], [b"z"])
    payload = _fresh(trigger).check()
    assert payload is not None and payload["new"] == 5


def test_run_fires_one_event_then_ends(conn_id: str, rabbitmq_url: str, stream_name: Any,
                                       tmp_path: Path) -> None:
    stream = stream_name("h14-run")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
    trigger = StreamDataEventTrigger(pipeline="h14-r", stream=stream, rabbitmq_stream_conn_id=conn_id,
                                     ledger_url=f"sqlite:///{tmp_path / 'l.db'}", poll_interval=0.2)

    async def collect() -> list[dict[str, Any]]:
        async def publish_later() -> None:
            await asyncio.sleep(1.0)
            with StreamClient.connect(rabbitmq_url) as client:
                client.publish(stream, [b"x"] * 2)

        task = asyncio.create_task(publish_later())
        events = [e.payload async for e in trigger.run()]
        await task
        return events

    events = asyncio.run(asyncio.wait_for(collect(), 30))
    assert len(events) == 1 and events[0]["new"] == 2


def test_errors_are_retried_not_announced(conn_id: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    trigger = StreamDataEventTrigger(pipeline="h14-e", stream="h14-no-such-stream",
                                     rabbitmq_stream_conn_id=conn_id,
                                     ledger_url=f"sqlite:///{tmp_path / 'l.db'}", poll_interval=0.2)

    async def first() -> Any:
        async for event in trigger.run():
            return event
        return None

    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(first(), 1.5))
    logged = capsys.readouterr().out  # the trigger logs through Airflow's structlog
    assert "pipeline h14-e on h14-no-such-stream: check failed, retrying" in logged
    assert "STREAM_DOES_NOT_EXIST" in logged


def test_polling_ledger_is_shared_and_never_migrated(tmp_path: Path) -> None:
    from streamledger.hooks.ledger import polling_ledger
    from streamledger.ledger import Ledger, LedgerError

    missing = tmp_path / "missing.db"
    assert polling_ledger(f"sqlite:///{missing}") is None and not missing.exists()

    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(LedgerError, match="no ledger schema"):
        polling_ledger(f"sqlite:///{empty}")
    with sqlite3.connect(empty) as db:
        assert db.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,), "polling migrated"

    Ledger(f"sqlite:///{empty}", create=True).close()  # an upgrade later is picked up (errors not cached)
    first = polling_ledger(f"sqlite:///{empty}")
    assert first is not None and polling_ledger(f"sqlite:///{empty}") is first


def test_a_burst_over_partitions_settles_into_one_announcement(conn_id: str, rabbitmq_url: str,
                                                               stream_name: Any, tmp_path: Path) -> None:
    name = stream_name.super_stream("h14-burst")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=2)
        parts = client.partitions(name)
    trigger = StreamDataEventTrigger(pipeline="h14-b", super_stream=name, rabbitmq_stream_conn_id=conn_id,
                                     ledger_url=f"sqlite:///{tmp_path / 'l.db'}", poll_interval=0.1,
                                     settle=1.0)
    assert trigger.check(announce=False) is None

    async def first_event() -> dict[str, Any]:
        async def publish() -> None:  # the second partition lands after the trigger saw the first
            with StreamClient.connect(rabbitmq_url) as client:
                client.publish(parts[0], [b"a"] * 3)
                await asyncio.sleep(0.5)
                client.publish(parts[1], [b"b"] * 4)

        task = asyncio.create_task(publish())
        async for event in trigger.run():
            await task
            return dict(event.payload)
        raise AssertionError("no event")

    payload = asyncio.run(asyncio.wait_for(first_event(), 30))
    assert {s: v["new"] for s, v in payload["streams"].items()} == {parts[0]: 3, parts[1]: 4}
    assert _fresh(trigger).check() is None
    # a dry check writes nothing
    with StreamClient.connect(rabbitmq_url) as client:
        client.publish(parts[0], [b"c"])
    assert trigger.check(announce=False) is not None and trigger.check(announce=False) is not None
