"""The Airflow and Dagster adapters over a mewbase channel (TEST DOUBLE server, issue 20 item 6).

The emulator (tests/support/mewbase_emulator.py) listens on a real TCP port of 127.0.0.1; the
Airflow side reaches it through a ``mewbase`` Airflow connection (from the environment), the Dagster
side through the source resource's ``mewbase://`` URL. Everything else is the product: the backlog
sensor and triggers (one poll each), the stream batch asset under Dagster's ``materialize`` with
local Spark and a SQLite ledger, its audit check and the backlog sensor.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import bson
import pyarrow.parquet as pq
import pytest

from tests.support.mewbase_emulator import MewbaseServerEmulator


def seed(emulator: MewbaseServerEmulator, channel: str, ids: range) -> list[int]:
    """Events ``{"id": i}`` (positions are byte offsets, so they have gaps)."""
    return [emulator.append(channel, {"id": i}) for i in ids]


@pytest.fixture
def mewbase_conn(monkeypatch: pytest.MonkeyPatch, emulator: MewbaseServerEmulator) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_MB_SOURCE", json.dumps(
        {"conn_type": "mewbase", "host": emulator.host, "port": emulator.port}))
    return "mb_source"


def test_airflow_sensor_and_triggers_poll_a_mewbase_channel(
    mewbase_conn: str, emulator: MewbaseServerEmulator, tmp_path: Path
) -> None:
    from streamledger.sensors.backlog import StreamBacklogSensor
    from streamledger.triggers.backlog import StreamBacklogTrigger, measure_backlog
    from streamledger.triggers.new_data import StreamDataEventTrigger

    positions = seed(emulator, "orders", range(5))
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    common: dict[str, Any] = {"pipeline": "mb", "rabbitmq_stream_conn_id": mewbase_conn,
                              "ledger_url": ledger_url}
    backlog = positions[-1] + 1 - positions[0]  # positions, not events: the channel has gaps
    assert measure_backlog(stream="orders", super_stream=None, ledger_conn_id=None, **common) == {
        "orders": backlog}

    sensor = StreamBacklogSensor(task_id="wait", stream="orders", min_backlog=backlog, **common)
    assert sensor.poke({}) is True  # type: ignore[arg-type]
    trigger = StreamBacklogTrigger(stream="orders", min_backlog=backlog, poll_interval=0.1, **common)

    async def first_event() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("trigger ended without an event")

    assert asyncio.run(asyncio.wait_for(first_event(), 30)) == {
        "status": "ready", "backlog": backlog, "streams": {"orders": backlog}}

    # the event trigger announces once (its announcement is stored on the server), then again on new data;
    # the common-messaging provider dispatches the mewbase scheme to it
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    event = MessageQueueTrigger(scheme="mewbase", stream="orders", poll_interval=0.1, settle=0,
                                **common).trigger
    assert isinstance(event, StreamDataEventTrigger)
    payload = event.check()
    assert payload is not None and payload["new"] == backlog
    assert payload["tail"] == {"orders": positions[-1] + 1}
    assert event.check() is None
    more = seed(emulator, "orders", range(5, 7))
    again = event.check()
    assert again is not None and again["new"] == more[-1] + 1 - (positions[-1] + 1)

    # super streams stay RabbitMQ's: refused in one line before anything is read
    with pytest.raises(Exception, match="super_stream is only available for rabbitmq sources"):
        measure_backlog(stream=None, super_stream="orders", ledger_conn_id=None, **common)


def _written(root: Path) -> Counter[int]:
    return Counter(
        bson.decode(body)["id"]
        for part in sorted(root.glob("**/*.parquet"))
        for body in pq.read_table(part, columns=["body"]).column("body").to_pylist()
    )


@pytest.mark.spark
@pytest.mark.dagster
def test_dagster_asset_materialized_twice_and_sensor_over_mewbase(
    emulator: MewbaseServerEmulator, tmp_path: Path, spark: Any
) -> None:
    from dagster import DagsterInstance, SensorResult, build_sensor_context, materialize

    from streamledger.dagster import (
        StreamLedgerResource,
        StreamSourceResource,
        StreamSparkResource,
        build_ledger_audit_check,
        build_stream_backlog_sensor,
        build_stream_batch_asset,
    )
    from streamledger.ledger import Ledger

    out = tmp_path / "out"
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    asset = build_stream_batch_asset(pipeline="mb-dg", stream="orders", output_root=str(out))
    check = build_ledger_audit_check(asset, pipeline="mb-dg")
    sensor = build_stream_backlog_sensor(asset, pipeline="mb-dg", stream="orders")
    resources = {"rabbitmq": StreamSourceResource(url=emulator.url()),
                 "ledger": StreamLedgerResource(url=ledger_url), "spark": StreamSparkResource()}
    instance = DagsterInstance.ephemeral()

    def tick() -> SensorResult:
        result = sensor(build_sensor_context(instance=instance, resources=resources))
        assert isinstance(result, SensorResult)
        return result

    first_positions = seed(emulator, "orders", range(0, 40))
    assert len(tick().run_requests) == 1
    first = materialize([asset, check], resources=resources, instance=instance)
    assert first.success and first.get_asset_check_evaluations()[0].passed
    assert not tick().run_requests  # everything read: nothing waits

    second_positions = seed(emulator, "orders", range(40, 65))
    assert len(tick().run_requests) == 1
    second = materialize([asset, check], resources=resources, instance=instance)
    assert second.success and second.get_asset_check_evaluations()[0].passed

    ranges = sorted((r.start, r.end, r.records) for r in Ledger(ledger_url).ranges("mb-dg")
                    if str(r.status) == "committed")
    tail1, tail2 = first_positions[-1] + 1, second_positions[-1] + 1
    assert ranges == [(first_positions[0], tail1, 40), (tail1, tail2, 25)]  # the second read only new data
    assert _written(out) == Counter(range(65))  # every event exactly once
    with emulator_log(emulator) as log:
        assert log.query_offset("orders", "mb-dg") == second_positions[-1]  # stored: the last event


def emulator_log(emulator: MewbaseServerEmulator) -> Any:
    from streamledger.sources import connect_log

    return connect_log(emulator.url(), timeout=3.0)


def test_source_connections_pick_their_hook_by_type(
    monkeypatch: pytest.MonkeyPatch, make_emulator: Any
) -> None:
    from streamledger.hooks.mewbase import MewbaseHook
    from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook
    from streamledger.hooks.source import source_hook
    from streamledger.protocol.mewbase import parse_url
    from streamledger.sources import UnsupportedSource

    server = make_emulator(users={"svc": "p@ss/word"})
    monkeypatch.setenv("AIRFLOW_CONN_MB_URI", server.url("svc", "p%40ss%2Fword"))  # the plain-URL form
    monkeypatch.setenv("AIRFLOW_CONN_MB_JSON", json.dumps(
        {"conn_type": "mewbase", "host": server.host, "port": server.port, "login": "svc",
         "password": "p@ss/word", "extra": {"timeout": 3}}))
    monkeypatch.setenv("AIRFLOW_CONN_RMQ", "rabbitmq-stream://guest:guest@127.0.0.1:5552/")
    monkeypatch.setenv("AIRFLOW_CONN_HTTP", "http://example.com")
    for conn_id in ("mb_uri", "mb_json"):
        hook = source_hook(conn_id)
        assert isinstance(hook, MewbaseHook)
        params = parse_url(hook.get_url())
        assert (params.host, params.port, params.username, params.password) == (
            server.host, server.port, "svc", "p@ss/word")
        ok, message = hook.test_connection()  # type: ignore[attr-defined]
        assert ok and message == f"Connected to mewbase at mewbase://{server.host}:{server.port}"
    assert source_hook("mb_json").timeout == 3.0
    assert isinstance(source_hook("rmq"), RabbitMQStreamHook)
    with pytest.raises(UnsupportedSource, match=r"^connection 'http' has type 'http'; a source connection "
                                                r"has type rabbitmq_stream or mewbase$"):
        source_hook("http")
    # RabbitMQ-only calls (topology, super stream management) refuse a mewbase connection in one line
    with pytest.raises(UnsupportedSource, match="connection 'mb_json' names a mewbase channel; this needs a "
                                                "rabbitmq_stream connection"):
        RabbitMQStreamHook("mb_json").get_topology()
    monkeypatch.setenv("AIRFLOW_CONN_MB_NOPORT", json.dumps({"conn_type": "mewbase", "host": "h"}))
    with pytest.raises(UnsupportedSource, match="'mb_noport': a mewbase connection needs a port"):
        source_hook("mb_noport").get_url()


def test_dagster_source_resource_takes_any_known_url(emulator: MewbaseServerEmulator) -> None:
    from streamledger.dagster import RabbitMQStreamResource, ResourceConfigError, StreamSourceResource
    from streamledger.sources import UnsupportedSource

    last = seed(emulator, "orders", range(3))[-1]
    resource = StreamSourceResource(url=emulator.url())
    assert resource.describe() == f"mewbase {emulator.host}:{emulator.port}"
    with resource.get_client() as log:
        assert log.committed_tail("orders") == last + 1
    assert isinstance(RabbitMQStreamResource(url=emulator.url()), StreamSourceResource)  # the former name
    with pytest.raises(ResourceConfigError, match="ca_file given but the URL scheme is 'mewbase'"):
        StreamSourceResource(url=emulator.url(), ca_file="/ca.pem").connection_url()
    with pytest.raises(UnsupportedSource, match=r"^source URL has scheme 'kafka'; streamledger reads"):
        StreamSourceResource(url="kafka://user:secret@h:9092").connection_url()


def test_event_trigger_ack_mode_over_a_mewbase_channel(
    mewbase_conn: str, emulator: MewbaseServerEmulator, tmp_path: Path
) -> None:
    """Ack mode (Airflow >= 3.3) over mewbase: pinned and acknowledged as durable subscriptions,
    acknowledged only after the persist confirmation."""
    from streamledger.sources import connect_log
    from streamledger.triggers import acked
    from streamledger.triggers.new_data import StreamDataEventTrigger
    from tests.unit.airflow.test_event_trigger_ack import Runner

    assert acked.ACK_MODE, "the dev venv pins Airflow >= 3.3, where ack mode is on"
    positions = seed(emulator, "acked", range(3))
    trigger = StreamDataEventTrigger(pipeline="mb-ack", stream="acked", rabbitmq_stream_conn_id=mewbase_conn,
                                     ledger_url=f"sqlite:///{tmp_path / 'l.db'}", poll_interval=0.1, settle=0)

    def stored() -> tuple[int | None, int | None]:
        with connect_log(f"mewbase://{emulator.host}:{emulator.port}") as log:
            return (log.query_offset("acked", "mb-ack.announced"),
                    log.query_offset("acked", "mb-ack.announcing"))

    async def scenario() -> None:
        runner = Runner()
        runner.start(1, trigger)
        payload, seq = await runner.next_event(1)
        assert payload["upto"] == {"acked": positions[-1]}
        pending = runner.move_on(1)
        await asyncio.sleep(0.5)
        assert stored() == (None, positions[-1])
        runner.manager.confirm_persisted([seq])
        for _ in range(100):
            if stored()[0] is not None:
                break
            await asyncio.sleep(0.1)
        assert stored() == (positions[-1], positions[-1])
        pending.cancel()
        await runner.stop()

    asyncio.run(scenario())


def test_dagster_backlog_condition_measures_a_mewbase_channel(
    emulator: MewbaseServerEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31's second bug: ``BacklogAbove`` connected with the RabbitMQ client whatever the URL,
    so a condition over a mewbase channel could never evaluate. It must use the source-neutral client."""
    from streamledger.dagster.automation import BacklogAbove

    positions = seed(emulator, "orders", range(4))
    monkeypatch.setenv("SL_TEST_MB_URL", emulator.url())
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    condition = BacklogAbove(pipeline="mb-auto", stream="orders", min_backlog=1,
                             broker_url_env="SL_TEST_MB_URL", ledger_url=ledger_url)
    records, lag = condition.measure()
    assert records >= 1  # counted at least up to min_backlog
    assert lag == 0.0
    everything = BacklogAbove(pipeline="mb-auto", stream="orders", min_backlog=10_000,
                              broker_url_env="SL_TEST_MB_URL", ledger_url=ledger_url)
    assert everything.measure()[0] == len(positions)  # all four events wait
