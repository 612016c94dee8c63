"""The event-driven example DAG under the real Airflow components: api-server, scheduler with the
LocalExecutor, dag-processor and triggerer as subprocesses, the real 4.3 broker, the batch jobs on
the session's Spark Connect server (``warm_spark_env``), a SQLite ledger, and OpenLineage writing to
a file.

Proven here, on one set of running components (module fixture):

* ``streamledger_event_driven``: three waves of published data, each published after the previous
  batch finished, make exactly three DAG runs (one Asset event each, fired by the
  ``rabbitmq-stream`` trigger in the triggerer), each run reads exactly its wave, and afterwards no
  run starts although every batch's StoreOffset and every announcement wrote tracking chunks to the
  partitions (no run without new data). OpenLineage events carry the ranges and outputs.
* ack mode (Airflow >= 3.3): three more waves with the triggerer SIGKILLed at seeded random moments
  (and restarted): one announcement identity per wave, disjoint, every record read exactly once.
* ``streamledger_per_partition``: the batch mapped over the partitions runs one task instance per
  partition (map index 0 and 1, rendered as the partition names), each claiming under its own
  identity.
"""

from __future__ import annotations

import itertools
import json
import random
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import connection_json, warm_spark_env
from tests.support.airflow import AirflowHome, airflow_components, make_airflow_home

pytestmark = [pytest.mark.airflow, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.slow]

DAG_ID = "streamledger_event_driven"
PER_PARTITION = "streamledger_per_partition"
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
        time.sleep(0.25)


def _runs(af: AirflowHome, dag_id: str) -> list[tuple[str, str, str]]:
    rows = _db(af, "SELECT run_id, state, run_type FROM dag_run WHERE dag_id = ? ORDER BY id", dag_id)
    return [(str(r), str(s), str(t)) for r, s, t in rows]


def _task_log(af: AirflowHome) -> str:
    logs = sorted((af.home / "logs").rglob("*.log"), key=lambda p: p.stat().st_mtime)
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs[-2:])


def _asset_events(af: AirflowHome, uri: str) -> list[dict[str, Any]]:
    rows = _db(af, "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.uri = ? "
                   "ORDER BY e.id", uri)
    return [json.loads(extra) for (extra,) in rows]


@dataclass
class Live:
    """Running Airflow components over one fresh super stream."""

    af: AirflowHome
    url: str
    name: str
    partitions: list[str]
    root: Path
    env: dict[str, str]
    published: dict[int, int] = field(default_factory=dict)  # event id -> wave
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ledger_url(self) -> str:
        return self.env["STREAMLEDGER_LEDGER_URL"]

    def publish(self, ids: range, wave: int) -> None:
        from streamledger.protocol.rabbitmq import StreamClient

        batch: dict[str, list[bytes]] = {p: [] for p in self.partitions}
        for event in ids:
            self.published[event] = wave
            body = json.dumps({"id": event, "wave": wave}).encode()
            batch[self.partitions[event % PARTITIONS]].append(body)
        with StreamClient.connect(self.url) as client:
            for partition, bodies in batch.items():
                assert client.publish(partition, bodies).confirmed == len(bodies)


@pytest.fixture(scope="module")
def live(rabbitmq_url: str, spark_connect: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    from streamledger.protocol.rabbitmq import StreamClient

    began = time.monotonic()
    root = tmp_path_factory.mktemp("live-airflow")
    name = f"h14-ed-{uuid.uuid4().hex[:8]}"
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=PARTITIONS)
        partitions = list(client.partitions(name))
    env = {
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": connection_json(rabbitmq_url),
        "STREAMLEDGER_SUPER_STREAM": name,
        "STREAMLEDGER_PIPELINE": f"p-{name}",
        "STREAMLEDGER_EVENT_PIPELINE": f"p-{name}-events",
        "STREAMLEDGER_LEDGER_URL": f"sqlite:///{root / 'ledger.db'}",
        "STREAMLEDGER_OUTPUT_ROOT": str(root / "output"),
        "STREAMLEDGER_POLL_INTERVAL": str(POLL_S),
        "STREAMLEDGER_MIN_BACKLOG": "1",
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(root / "openlineage.jsonl"), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "h14-e2e",
        **warm_spark_env(spark_connect),
    }
    af = make_airflow_home(root / "airflow", extra_env=env)
    try:
        with airflow_components(af, env=env):
            live = Live(af=af, url=rabbitmq_url, name=name, partitions=partitions, root=root, env=env)
            live.timings["components ready"] = time.monotonic() - began
            _wait("the DAGs to be parsed", 120, lambda: len(_db(
                af, "SELECT 1 FROM dag WHERE dag_id IN (?, ?)", DAG_ID, PER_PARTITION)) == 2)
            yield live
    finally:
        with StreamClient.connect(rabbitmq_url) as client:
            client.delete_super_stream(name, missing_ok=True)


@pytest.mark.timeout(600)
def test_three_waves_make_three_runs_under_the_real_scheduler(live: Live) -> None:
    from streamledger.ledger import Ledger
    from streamledger.protocol.rabbitmq import StreamClient

    began = time.monotonic()
    af, partitions, name = live.af, live.partitions, live.name
    pipeline = live.env["STREAMLEDGER_EVENT_PIPELINE"]
    arrivals = f"x-streamledger://{pipeline}/{name}/arrivals"
    timings = live.timings

    af.airflow("dags", "unpause", DAG_ID)
    # the watcher's trigger exists once the DAG is unpaused, and a triggerer has picked it up
    _wait("the triggerer to run the watcher", 120, lambda: _db(
        af, "SELECT id FROM trigger WHERE classpath = ? AND triggerer_id IS NOT NULL", TRIGGER))
    time.sleep(2 * POLL_S)
    assert _runs(af, DAG_ID) == [], "a run started before any data was published"
    timings["watching"] = time.monotonic() - began

    for wave in range(3):
        live.publish(range(wave * PER_WAVE, (wave + 1) * PER_WAVE), wave)

        def done(wave: int = wave) -> bool:
            runs = _runs(af, DAG_ID)
            failed = [r for r in runs if r[1] == "failed"]
            assert not failed, f"run failed: {failed}\n{_task_log(af)}"
            return len([r for r in runs if r[1] == "success"]) == wave + 1

        _wait(f"run {wave + 1} to succeed", 180, done)
        timings[f"wave {wave + 1} processed"] = time.monotonic() - began

    # Every batch stored its offset and every announcement stored one: tracking chunks, no data.
    time.sleep(max(8.0, 6 * POLL_S))
    runs = _runs(af, DAG_ID)
    assert len(runs) == 3, f"expected exactly 3 runs, got {runs}"
    assert all(state == "success" and run_type == "asset_triggered" for _, state, run_type in runs), runs
    with StreamClient.connect(live.url) as client:
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
    ledger = Ledger(live.ledger_url)
    committed = sorted(
        (r for r in ledger.ranges(pipeline) if str(r.status) == "committed" and r.end > r.start),
        key=lambda r: (r.source.stream, r.start),
    )
    rows = _output_rows(live.root / "output" / pipeline)
    for partition in partitions:
        ranges = [r for r in committed if r.source.stream == partition]
        assert len(ranges) == 3, [(r.start, r.end) for r in ranges]
        for a, b in itertools.pairwise(ranges):
            assert a.end == b.start
        for wave, r in enumerate(ranges):
            ids = {i for s, o, i in rows if s == partition and r.start <= o < r.end}
            assert ids and {live.published[i] for i in ids} == {wave}, (partition, wave, sorted(ids)[:5])
        assert tracking[partition] > ranges[-1].end, "the stream's tail holds tracking chunks only"
    assert sorted(i for _, _, i in rows) == sorted(live.published), "every event exactly once"

    # OpenLineage: each completed batch reported its input ranges and output directories
    lineage = live.root / "openlineage.jsonl"
    completes = [e for e in map(json.loads, lineage.read_text().splitlines())
                 if e.get("eventType") == "COMPLETE" and e["job"]["name"].endswith("read_new_data")]
    assert len(completes) == 3
    for event in completes:
        assert {i["name"] for i in event["inputs"]} == set(partitions)
        assert all("streamledger_range" in i["inputFacets"] for i in event["inputs"])
        assert all(o["namespace"] == "file" for o in event["outputs"]) and event["outputs"]
    timings["event-driven test"] = time.monotonic() - began
    print("event-driven e2e timings (s):", {k: round(v, 1) for k, v in timings.items()})


KILL_SEED = 25
# a restarted triggerer takes the dead one's watcher over after this many seconds without heartbeat
TAKEOVER = {"AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "8",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1"}


@pytest.mark.timeout(480)
def test_triggerer_killed_at_random_moments_announces_each_arrival_once(live: Live) -> None:
    """Ack mode under the real triggerer: three waves, the triggerer SIGKILLed (its whole process
    group) at seeded random moments after two of them, restarted each time. Every wave is announced
    under exactly one identity, no announcement covers another's data, and the DAG reads every
    record once. An identity appearing twice can only be a redelivery of an event whose persist
    raced the kill (Airflow's at-least-once window between persist and acknowledgement)."""
    from collections import Counter

    from tests.support.airflow import crash_and_restart

    began = time.monotonic()
    af, rng = live.af, random.Random(KILL_SEED)
    pipeline = live.env["STREAMLEDGER_EVENT_PIPELINE"]
    arrivals = f"x-streamledger://{pipeline}/{live.name}/arrivals"
    waves = 3
    # kill 1: while the trigger polls, settles or pins (seconds after publishing); kill 2: in the
    # window between yielding the event, Airflow persisting it and the acknowledgement (seconds
    # after the triggerer logged the announcement)
    kills = {0: ("published", round(rng.uniform(0.0, 3.0), 2)),
             1: ("announced", round(rng.uniform(0.0, 1.0), 2))}
    triggerer_log = af.home / "components" / "triggerer.log"

    def announced() -> int:
        return triggerer_log.read_text(errors="replace").count(": announcing ")

    af.airflow("dags", "unpause", DAG_ID)
    _wait("the triggerer to run the watcher", 120, lambda: _db(
        af, "SELECT id FROM trigger WHERE classpath = ? AND triggerer_id IS NOT NULL", TRIGGER))

    def settled() -> bool:
        return not [r for r in _runs(af, DAG_ID) if r[1] in ("queued", "running")]

    _wait("earlier runs to finish", 180, settled)
    base_events, base_runs = len(_asset_events(af, arrivals)), len(_runs(af, DAG_ID))
    output = live.root / "output" / pipeline
    first = 2000
    for wave in range(waves):
        ids = range(first + wave * PER_WAVE, first + (wave + 1) * PER_WAVE)
        before = announced()
        live.publish(ids, wave=100 + wave)
        if wave in kills:
            after, delay = kills[wave]
            deadline = time.monotonic() + 60
            while after == "announced" and announced() == before:  # watched closely: the window is ~1 s
                assert time.monotonic() < deadline, f"wave {wave + 1} not announced"
                time.sleep(0.05)
            time.sleep(delay)
            crash_and_restart(af, "triggerer", TAKEOVER)

        def read(ids: range = ids) -> bool:
            failed = [r for r in _runs(af, DAG_ID) if r[1] == "failed"]
            assert not failed, f"run failed: {failed}\n{_task_log(af)}"
            seen = {i for _, _, i in _output_rows(output)}
            return set(ids) <= seen and settled()

        _wait(f"wave {wave + 1} to be read", 240, read)
        live.timings[f"kill wave {wave + 1} read"] = time.monotonic() - began

    time.sleep(max(8.0, 6 * POLL_S))  # a late duplicate would show up here
    assert settled()
    events = [e["payload"] for e in _asset_events(af, arrivals)[base_events:]]
    identities = Counter(p["announcement"] for p in events)
    assert len(identities) == waves, f"expected {waves} announcements, got {identities}"
    seen: set[str] = set()
    for p in events:  # a repeated identity is the same announcement, redelivered after a restart
        assert p["announcement"] not in seen or p.get("redelivered"), events
        seen.add(p["announcement"])
    duplicates = len(events) - len(identities)
    # the announcements are disjoint and in order: each one's upto is past the previous one's
    distinct = list({p["announcement"]: p for p in events}.values())
    for a, b in itertools.pairwise(distinct):
        for stream, upto in b["upto"].items():
            assert a["upto"].get(stream, -1) < upto, (a["upto"], b["upto"])
    runs = _runs(af, DAG_ID)[base_runs:]
    assert all(state == "success" for _, state, _ in runs), runs
    # a run started by a repeat alone read nothing (its batch task skipped, before any claim);
    # every other run read: the skip is the consumer's dedupe, nothing else skips
    consumed = _db(af, "SELECT r.run_id, ti.state, e.id, e.extra FROM dag_run r "
                       "JOIN task_instance ti ON ti.dag_id = r.dag_id AND ti.run_id = r.run_id "
                       "JOIN dagrun_asset_event l ON l.dag_run_id = r.id "
                       "JOIN asset_event e ON e.id = l.event_id "
                       "WHERE r.dag_id = ? AND ti.task_id = 'read_new_data' ORDER BY e.id", DAG_ID)
    first_of: dict[str, int] = {}
    by_run: dict[str, tuple[str, list[bool]]] = {}
    for run_id, state, event_id, extra in consumed:
        ident = json.loads(extra)["payload"]["announcement"]
        first_of.setdefault(ident, event_id)
        by_run.setdefault(run_id, (state, []))[1].append(first_of[ident] != event_id)
    for run_id, (state, repeats) in by_run.items():
        assert (state == "skipped") == all(repeats), (run_id, state, repeats)
    assert len(runs) >= waves, runs
    rows = Counter(i for _, _, i in _output_rows(output) if i >= first)
    assert sorted(rows) == list(range(first, first + waves * PER_WAVE)), "every record read"
    assert set(rows.values()) == {1}, "every record read exactly once"
    live.timings["kill test"] = time.monotonic() - began
    skipped = sum(1 for state, _ in by_run.values() if state == "skipped")
    print(f"triggerer kills {kills} (wave: after what, s): {len(events)} asset events, "
          f"{len(identities)} announcements, {duplicates} redelivered duplicates, "
          f"{len(runs)} runs ({skipped} repeat runs read nothing); {live.timings['kill test']:.0f}s")


@pytest.mark.timeout(400)
def test_per_partition_dag_maps_one_task_per_partition(live: Live) -> None:
    from streamledger.ledger import Ledger

    began = time.monotonic()
    af = live.af
    live.publish(range(1000, 1000 + PER_WAVE), wave=99)
    pipeline = f"{live.env['STREAMLEDGER_PIPELINE']}-per-partition"
    af.airflow("dags", "unpause", PER_PARTITION)
    af.airflow("dags", "trigger", PER_PARTITION)

    def done() -> bool:
        runs = _runs(af, PER_PARTITION)
        assert not [r for r in runs if r[1] == "failed"], f"{runs}\n{_task_log(af)}"
        return bool(runs) and runs[-1][1] == "success"

    _wait("the mapped run to succeed", 300, done)
    instances = _db(af, "SELECT map_index, rendered_map_index, state FROM task_instance "
                        "WHERE dag_id = ? AND task_id = 'read_partition' ORDER BY map_index", PER_PARTITION)
    assert [(i, r, s) for i, r, s in instances] == [
        (index, partition, "success") for index, partition in enumerate(live.partitions)]

    ranges = Ledger(live.ledger_url).ranges(pipeline)
    assert sorted((r.source.stream, r.run.task_id, r.run.map_index) for r in ranges) == [
        (partition, "read_partition", index) for index, partition in enumerate(live.partitions)]
    assert all(str(r.status) == "committed" and r.start == 0 for r in ranges)
    rows = _output_rows(live.root / "output" / pipeline)
    assert sorted(i for _, _, i in rows) == sorted(live.published), "every event exactly once"
    live.timings["per-partition test"] = time.monotonic() - began
    print("per-partition e2e (s):", round(live.timings["per-partition test"], 1))


def _output_rows(root: Path) -> list[tuple[str, int, int]]:
    import pyarrow.parquet as pq

    out = []
    for part in sorted(root.glob("*/*/*/*.parquet")):
        table = pq.read_table(part, columns=["stream", "offset", "body"])
        for stream, offset, body in zip(*(table.column(c).to_pylist() for c in ("stream", "offset", "body")),
                                        strict=True):
            out.append((stream, offset, json.loads(body)["id"]))
    return out
