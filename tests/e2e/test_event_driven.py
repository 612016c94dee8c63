"""The event-driven example DAG under the real Airflow components: api-server, scheduler with the
LocalExecutor, dag-processor and triggerer as subprocesses, the real 4.3 broker, local Spark in each
task process, a SQLite ledger, and OpenLineage writing to a file.

Proven here: three waves of published data, each published after the previous batch finished, make
exactly three DAG runs (one Asset event each, fired by the ``rabbitmq-stream`` trigger in the
triggerer), each run reads exactly its wave, and afterwards no run starts although every batch's
StoreOffset and every announcement wrote tracking chunks to the partitions (no run without new data).
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import connection_json
from tests.support.airflow import AirflowHome, airflow_components, make_airflow_home

pytestmark = [pytest.mark.airflow, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.slow]

DAG_ID = "streamledger_event_driven"
TRIGGER = "streamledger.triggers.new_data.StreamDataEventTrigger"
PARTITIONS = 2
PER_WAVE = 30
POLL_S = 1.0


def _db(af: AirflowHome, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read Airflow's SQLite database directly (cheap enough to poll while the scheduler writes)."""
    for attempt in range(20):
        try:
            with sqlite3.connect(f"file:{af.home / 'airflow.db'}?mode=ro", uri=True, timeout=10) as db:
                return db.execute(sql, args).fetchall()
        except sqlite3.OperationalError:
            if attempt == 19:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _wait(what: str, timeout: float, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(1.0)


def _runs(af: AirflowHome) -> list[tuple[str, str, str]]:
    rows = _db(af, "SELECT run_id, state, run_type FROM dag_run WHERE dag_id = ? ORDER BY id", DAG_ID)
    return [(str(r), str(s), str(t)) for r, s, t in rows]


def _task_log(af: AirflowHome) -> str:
    logs = sorted((af.home / "logs").rglob("*.log"), key=lambda p: p.stat().st_mtime)
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs[-2:])


def _asset_events(af: AirflowHome, uri: str) -> list[dict[str, Any]]:
    rows = _db(af, "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.uri = ? "
                   "ORDER BY e.id", uri)
    return [json.loads(extra) for (extra,) in rows]


@pytest.mark.timeout(600)
def test_three_waves_make_three_runs_under_the_real_scheduler(rabbitmq_url: str, stream_name: Any,
                                                              tmp_path: Path) -> None:
    from streamledger.ledger import Ledger
    from streamledger.protocol.rabbitmq import StreamClient

    began = time.monotonic()
    name = stream_name.super_stream("h14-ed")
    pipeline = f"p-{name}"
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=PARTITIONS)
        partitions = client.partitions(name)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    lineage = tmp_path / "openlineage.jsonl"
    env = {
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": connection_json(rabbitmq_url),
        "STREAMLEDGER_SUPER_STREAM": name,
        "STREAMLEDGER_EVENT_PIPELINE": pipeline,
        "STREAMLEDGER_LEDGER_URL": ledger_url,
        "STREAMLEDGER_OUTPUT_ROOT": str(tmp_path / "output"),
        "STREAMLEDGER_POLL_INTERVAL": str(POLL_S),
        "STREAMLEDGER_MIN_BACKLOG": "1",
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(lineage), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "h14-e2e",
    }
    af = make_airflow_home(tmp_path / "airflow", extra_env=env)
    arrivals = f"x-streamledger://{pipeline}/{name}/arrivals"
    timings: dict[str, float] = {}
    published: dict[int, int] = {}

    with airflow_components(af, env=env):
        timings["components ready"] = time.monotonic() - began
        _wait("the DAG to be parsed", 120, lambda: _db(af, "SELECT 1 FROM dag WHERE dag_id = ?", DAG_ID))
        af.airflow("dags", "unpause", DAG_ID)
        # the watcher's trigger exists for the unpaused DAG and a triggerer has picked it up
        _wait("the triggerer to run the watcher", 120, lambda: _db(
            af, "SELECT id FROM trigger WHERE classpath = ? AND triggerer_id IS NOT NULL", TRIGGER))
        time.sleep(2 * POLL_S)
        assert _runs(af) == [], "a run started before any data was published"
        timings["watching"] = time.monotonic() - began

        with StreamClient.connect(rabbitmq_url) as client:
            for wave in range(3):
                batch: dict[str, list[bytes]] = {p: [] for p in partitions}
                for i in range(PER_WAVE):
                    event = wave * PER_WAVE + i
                    published[event] = wave
                    body = json.dumps({"id": event, "wave": wave}).encode()
                    batch[partitions[event % PARTITIONS]].append(body)
                for partition, bodies in batch.items():
                    assert client.publish(partition, bodies).confirmed == len(bodies)

                def done(wave: int = wave) -> bool:
                    runs = _runs(af)
                    failed = [r for r in runs if r[1] == "failed"]
                    assert not failed, f"run failed: {failed}\n{_task_log(af)}"
                    return len([r for r in runs if r[1] == "success"]) == wave + 1

                _wait(f"run {wave + 1} to succeed", 180, done)
                timings[f"wave {wave + 1} processed"] = time.monotonic() - began

        # Every batch stored its offset and every announcement stored one: tracking chunks, no data.
        time.sleep(max(8.0, 6 * POLL_S))
        runs = _runs(af)
        assert len(runs) == 3, f"expected exactly 3 runs, got {runs}"
        assert all(state == "success" and run_type == "asset_triggered" for _, state, run_type in runs), runs
        with StreamClient.connect(rabbitmq_url) as client:
            tracking = {p: client.committed_tail(p) for p in partitions}

    # one Asset event per wave, each from the trigger, naming the streams, the tails and the backlog
    events = _asset_events(af, arrivals)
    assert len(events) == 3, events
    for wave, extra in enumerate(events):
        payload = extra["payload"]
        assert extra["from_trigger"] is True and payload["pipeline"] == pipeline
        assert payload["super_stream"] == name and set(payload["streams"]) == set(partitions)
        assert set(payload["tail"]) == set(partitions) and payload["backlog"] >= PER_WAVE
        assert payload["new"] >= PER_WAVE, (wave, payload)

    # each run read exactly its wave: three contiguous committed ranges per partition
    ledger = Ledger(ledger_url)
    committed = sorted(
        (r for r in ledger.ranges(pipeline) if str(r.status) == "committed" and r.end > r.start),
        key=lambda r: (r.source.stream, r.start),
    )
    rows = _output_rows(tmp_path / "output" / pipeline)
    for partition in partitions:
        ranges = [r for r in committed if r.source.stream == partition]
        assert len(ranges) == 3, [(r.start, r.end) for r in ranges]
        for a, b in itertools.pairwise(ranges):
            assert a.end == b.start
        for wave, r in enumerate(ranges):
            ids = {i for s, o, i in rows if s == partition and r.start <= o < r.end}
            assert ids and {published[i] for i in ids} == {wave}, (partition, wave, sorted(ids)[:5])
        assert tracking[partition] > ranges[-1].end, "the stream's tail holds tracking chunks only"
    assert sorted(i for _, _, i in rows) == sorted(published), "every event exactly once"

    # OpenLineage: each completed batch reported its input ranges and output directories
    completes = [e for e in map(json.loads, lineage.read_text().splitlines())
                 if e.get("eventType") == "COMPLETE" and e["job"]["name"].endswith("read_new_data")]
    assert len(completes) == 3
    for event in completes:
        assert {i["name"] for i in event["inputs"]} == set(partitions)
        assert all("streamledger_range" in i["inputFacets"] for i in event["inputs"])
        assert all(o["namespace"] == "file" for o in event["outputs"]) and event["outputs"]

    timings["total"] = time.monotonic() - began
    print("event-driven e2e timings (s):", {k: round(v, 1) for k, v in timings.items()})


def _output_rows(root: Path) -> list[tuple[str, int, int]]:
    import pyarrow.parquet as pq

    out = []
    for part in sorted(root.glob("*/*/*.parquet")):
        table = pq.read_table(part, columns=["stream", "offset", "body"])
        for stream, offset, body in zip(*(table.column(c).to_pylist() for c in ("stream", "offset", "body")),
                                        strict=True):
            out.append((stream, offset, json.loads(body)["id"]))
    return out
