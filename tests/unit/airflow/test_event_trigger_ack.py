"""Ack mode of the event trigger (Airflow >= 3.3) under Airflow's own ``SharedStreamManager`` (the
triggerer's shared-stream machinery, driven here the way the trigger runner drives it) against the
real 4.3 broker: the announcement is acknowledged on the broker only after the event is persisted,
an unacknowledged one is announced again (same identity) after a restart, and triggers on one key
share one poll. The 3.0-3.2 path is the gate forced off."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamledger.protocol.rabbitmq import StreamClient, parse_url
from streamledger.triggers import acked
from streamledger.triggers.new_data import StreamDataEventTrigger
from tests.support.airflow import AirflowHome, make_airflow_home


def test_the_dev_venv_runs_ack_mode() -> None:
    """The suite's Airflow (pinned >= 3.3) is where ack mode is on; an older one fails here rather
    than skipping the ack-mode tests (the 3.0-3.2 path is tested with the gate forced off)."""
    assert acked.ACK_MODE

POLL = 0.2


@pytest.fixture
def conn_id(monkeypatch: pytest.MonkeyPatch, rabbitmq_url: str) -> str:
    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_ACK_RMQ", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": params.password, "schema": params.vhost}))
    return "ack_rmq"


class Runner:
    """One triggerer's view: a manager, and per trigger its filter (as ``run_trigger`` iterates it)."""

    def __init__(self) -> None:
        from airflow.triggers.shared_stream import SharedStreamManager

        self.manager = SharedStreamManager(ack_timeout=60)
        self.filters: dict[int, AsyncIterator[Any]] = {}
        self.keys: dict[int, Any] = {}

    def start(self, trigger_id: int, trigger: StreamDataEventTrigger) -> None:
        key = trigger.shared_stream_key()
        assert key is not None
        self.keys[trigger_id] = key
        self.filters[trigger_id] = trigger.filter_shared_stream(
            self.manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key))

    async def next_event(self, trigger_id: int, timeout: float = 20) -> tuple[dict[str, Any], int]:
        """The trigger's next event and its persist sequence number (bound as the runner does)."""
        event = await asyncio.wait_for(anext(self.filters[trigger_id]), timeout)
        seq = self.manager.bind_pending_event(trigger_id=trigger_id, key=self.keys[trigger_id])
        assert seq is not None, "ack mode binds every event to its raw event"
        return event.payload, seq

    def move_on(self, trigger_id: int) -> asyncio.Task[Any]:
        """The runner pulls the next raw event (closing the window of the previous one)."""
        return asyncio.ensure_future(anext(self.filters[trigger_id]))

    async def stop(self) -> None:
        await self.manager.stop_all()


def _offsets(url: str, stream: str, pipeline: str) -> tuple[int | None, int | None]:
    with StreamClient.connect(url) as client:
        return client.query_offset(stream, f"{pipeline}.announced"), client.query_offset(stream,
                                                                                         f"{pipeline}.announcing")


async def _eventually(check: Any, timeout: float = 15) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


def test_acknowledged_only_after_persist_and_redelivered_after_a_restart(
        conn_id: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    stream, pipeline = stream_name("ack-one"), "ack-p"
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [b"a"] * 5)

    def make() -> StreamDataEventTrigger:
        return StreamDataEventTrigger(pipeline=pipeline, stream=stream, rabbitmq_stream_conn_id=conn_id,
                                      ledger_url=f"sqlite:///{tmp_path / 'l.db'}", poll_interval=POLL,
                                      settle=0)

    async def scenario() -> None:
        first = Runner()
        first.start(1, make())
        payload, seq = await first.next_event(1)
        assert payload["new"] == 5 and payload["upto"] == {stream: 4} and not payload.get("redelivered")
        ident = payload["announcement"]
        pending = first.move_on(1)
        await asyncio.sleep(10 * POLL)
        # yielded and pinned, but not persisted: not acknowledged, and not announced again meanwhile
        assert _offsets(rabbitmq_url, stream, pipeline) == (None, 4)
        assert not pending.done()
        # the triggerer dies before the persist confirmation: nothing is acknowledged
        pending.cancel()
        await first.stop()
        assert _offsets(rabbitmq_url, stream, pipeline) == (None, 4)

        # a restarted triggerer announces exactly the pinned range again, under the same identity
        second = Runner()
        second.start(1, make())
        payload, seq = await second.next_event(1)
        assert payload["announcement"] == ident and payload["redelivered"] is True
        assert payload["upto"] == {stream: 4} and payload["new"] == 5
        pending = second.move_on(1)
        second.manager.confirm_persisted([seq])  # the supervisor stored the event
        await _eventually(lambda: _offsets(rabbitmq_url, stream, pipeline) == (4, 4))

        # new data: a new announcement with a new identity, starting after the acknowledged one
        with StreamClient.connect(rabbitmq_url) as client:
            client.publish(stream, [b"b"] * 3)
        payload = (await asyncio.wait_for(pending, 20)).payload
        assert payload["announcement"] != ident and not payload.get("redelivered")
        assert payload["streams"][stream]["from"] == 5 and payload["new"] >= 3
        await second.stop()

    asyncio.run(scenario())


def test_two_triggers_on_one_key_share_one_poll_and_both_must_persist(
        conn_id: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    name, pipeline = stream_name.super_stream("ack-two"), "ack-q"
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=2)
        parts = client.partitions(name)
    producers: list[acked.AnnouncementProducer] = []
    init = acked.AnnouncementProducer.__init__

    def counted(self: acked.AnnouncementProducer, trigger: StreamDataEventTrigger) -> None:
        producers.append(self)
        init(self, trigger)

    monkeypatch.setattr(acked.AnnouncementProducer, "__init__", counted)

    def make(min_backlog: int) -> StreamDataEventTrigger:
        return StreamDataEventTrigger(pipeline=pipeline, super_stream=name, rabbitmq_stream_conn_id=conn_id,
                                      ledger_url=f"sqlite:///{tmp_path / 'l.db'}", poll_interval=POLL,
                                      settle=0.2, min_backlog=min_backlog)

    async def scenario() -> None:
        runner = Runner()
        a, b = make(1), make(1)
        assert a.shared_stream_key() == b.shared_stream_key()
        runner.start(1, a)
        runner.start(2, b)
        await asyncio.sleep(5 * POLL)
        assert len(producers) == 1, "one shared poll (one producer) for both triggers"
        with StreamClient.connect(rabbitmq_url) as client:
            client.publish(parts[0], [b"x"] * 4)
            client.publish(parts[1], [b"y"] * 2)
        (p1, s1), (p2, s2) = await asyncio.gather(runner.next_event(1), runner.next_event(2))
        assert p1 == p2 and p1["new"] == 6 and p1["upto"] == {parts[0]: 3, parts[1]: 1}
        moved = [runner.move_on(1), runner.move_on(2)]
        runner.manager.confirm_persisted([s1])
        await asyncio.sleep(10 * POLL)
        early = {p: _offsets(rabbitmq_url, p, pipeline)[0] for p in parts}
        assert early == {parts[0]: None, parts[1]: None}, "acknowledged before every event was persisted"
        runner.manager.confirm_persisted([s2])
        await _eventually(lambda: {p: _offsets(rabbitmq_url, p, pipeline)[0] for p in parts}
                          == {parts[0]: 3, parts[1]: 1})
        with StreamClient.connect(rabbitmq_url) as client:
            # per partition: the data, one pin and one acknowledgement (one poll stored them, once)
            assert [client.committed_tail(p) for p in parts] == [4 + 2, 2 + 2]
        for task in moved:
            task.cancel()
        await runner.stop()

    asyncio.run(scenario())


def test_the_gate_off_keeps_the_standalone_path(conn_id: str, rabbitmq_url: str, stream_name: Any,
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow 3.0-3.2 (the gate off): no shared key, so the triggerer runs ``run()``, which stores
    the announcement itself and ends after one event."""
    stream = stream_name("ack-off")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [b"x"] * 2)
    trigger = StreamDataEventTrigger(pipeline="ack-r", stream=stream, rabbitmq_stream_conn_id=conn_id,
                                     ledger_url=f"sqlite:///{tmp_path / 'l.db'}", poll_interval=POLL)
    assert trigger.shared_stream_key() is not None
    monkeypatch.setattr(acked, "ACK_MODE", False)
    assert trigger.shared_stream_key() is None

    async def collect() -> list[dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    events = asyncio.run(asyncio.wait_for(collect(), 30))
    assert len(events) == 1 and events[0]["new"] == 2
    assert _offsets(rabbitmq_url, stream, "ack-r") == (1, None), "stored before the event, never pinned"


def test_killed_between_two_partitions_acknowledgements_keeps_the_identity(
        conn_id: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    name, pipeline = stream_name.super_stream("ack-half"), "ack-h"
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=2)
        parts = client.partitions(name)
        client.publish(parts[0], [b"x"] * 3)
        client.publish(parts[1], [b"y"] * 2)

    def make() -> StreamDataEventTrigger:
        return StreamDataEventTrigger(pipeline=pipeline, super_stream=name, rabbitmq_stream_conn_id=conn_id,
                                      ledger_url=f"sqlite:///{tmp_path / 'l.db'}", poll_interval=POLL,
                                      settle=0)

    async def scenario() -> None:
        first = Runner()
        first.start(1, make())
        payload, _ = await first.next_event(1)
        assert payload["upto"] == {parts[0]: 2, parts[1]: 1}
        await first.stop()
        # advance() acknowledged the first partition, then the triggerer died
        make().acknowledge({parts[0]: 2})
        second = Runner()
        second.start(1, make())
        again, seq = await second.next_event(1)
        assert again["redelivered"] is True and again["announcement"] == payload["announcement"]
        assert again["upto"] == {parts[1]: 1} and again["new"] == 2
        pending = second.move_on(1)
        second.manager.confirm_persisted([seq])
        await _eventually(lambda: _offsets(rabbitmq_url, parts[1], pipeline) == (1, 1))
        pending.cancel()
        await second.stop()

    asyncio.run(scenario())


def test_a_redelivery_the_pipeline_already_read_is_acknowledged_without_an_event(
        conn_id: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    """Killed after the persist and before the acknowledgement, with the run already done: the
    restarted trigger does not announce the range again (no second run)."""
    stream, pipeline = stream_name("ack-done"), "ack-d"
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [b"a"] * 4)

    def make() -> StreamDataEventTrigger:
        return StreamDataEventTrigger(pipeline=pipeline, stream=stream, rabbitmq_stream_conn_id=conn_id,
                                      ledger_url=f"sqlite:///{tmp_path / 'none.db'}", poll_interval=POLL,
                                      settle=0)

    async def scenario() -> None:
        first = Runner()
        first.start(1, make())
        payload, _ = await first.next_event(1)
        assert payload["upto"] == {stream: 3}
        await first.stop()
        with StreamClient.connect(rabbitmq_url) as client:
            client.store_offset_verified(stream, pipeline, 4)  # the run read [0, 5) and stored its offset
        second = Runner()
        second.start(1, make())
        with pytest.raises(TimeoutError):
            await second.next_event(1, timeout=10 * POLL)
        assert _offsets(rabbitmq_url, stream, pipeline) == (3, 3)
        await second.stop()

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowHome]:
    yield make_airflow_home(tmp_path_factory.mktemp("ack-airflow"))


@pytest.mark.airflow
def test_persisted_then_killed_before_advance_the_repeat_run_reads_nothing(
        conn_id: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path, airflow: AirflowHome) -> None:
    """The window Airflow 3.3.2 leaves open: the event was persisted, the triggerer was SIGKILLed
    before the confirmation reached ``advance()``. The restarted trigger announces the same
    identity again (at-least-once per identity: no trigger can see persisted asset events), Airflow
    stores a second asset event, and the event-driven DAG's run started by it alone reads nothing
    and says why (skipped before anything is claimed)."""
    name = stream_name.super_stream("ack-rep")
    pipeline = f"ack-rep-{uuid.uuid4().hex[:6]}"
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=2)
        parts = client.partitions(name)
        client.publish(parts[0], [b'{"id": 1}'] * 3)
        client.publish(parts[1], [b'{"id": 2}'] * 2)
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"

    def make() -> StreamDataEventTrigger:
        return StreamDataEventTrigger(pipeline=pipeline, super_stream=name, rabbitmq_stream_conn_id=conn_id,
                                      ledger_url=ledger, poll_interval=POLL, settle=0)

    async def deliveries() -> tuple[dict[str, Any], dict[str, Any]]:
        first = Runner()
        first.start(1, make())
        original, _ = await first.next_event(1)  # the supervisor persists it ...
        await first.stop()  # ... and the triggerer dies before the confirmation reaches advance()
        second = Runner()
        second.start(1, make())
        repeat, _ = await second.next_event(1)
        await second.stop()
        return original, repeat

    original, repeat = asyncio.run(deliveries())
    assert repeat["announcement"] == original["announcement"] and repeat["redelivered"] is True
    assert repeat["upto"] == original["upto"] == {parts[0]: 2, parts[1]: 1}

    params = parse_url(rabbitmq_url)
    env = {
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": json.dumps(
            {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
             "login": params.username, "password": params.password, "schema": params.vhost}),
        "STREAMLEDGER_SUPER_STREAM": name, "STREAMLEDGER_EVENT_PIPELINE": pipeline,
        "STREAMLEDGER_LEDGER_URL": ledger, "STREAMLEDGER_OUTPUT_ROOT": str(tmp_path / "out"),
    }
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "dag_id": "streamledger_event_driven", "task_id": "read_new_data",
        "asset_uri": f"x-streamledger://{pipeline}/{name}/arrivals",
        "payloads": [original, repeat], "consume": [1],  # the run the second asset event started
    }))
    script = Path(__file__).with_name("_asset_triggered_run.py")
    proc = subprocess.run([sys.executable, str(script), str(spec)],
                          env=airflow.environ(env), cwd=airflow.home, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=300, check=False)
    out = proc.stdout
    assert proc.returncode == 0 and "RESULT " in out, out[-4000:]
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result["state"] == "skipped", out[-4000:]
    first_event = result["event_ids"][0]
    assert (f"announcement {original['announcement']} (first in asset event {first_event}) already "
            "delivered" in out), out[-4000:]
    with StreamClient.connect(rabbitmq_url) as client:
        assert [client.query_offset(p, pipeline) for p in parts] == [None, None], "the repeat run read data"
    assert not (tmp_path / "out").exists(), "the repeat run wrote output"
