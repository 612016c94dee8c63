"""Parallel backfill under the real Airflow components (issue 25, items 1 and 2).

The api-server, scheduler (LocalExecutor), dag-processor and triggerer run as subprocesses
(``tests.support.airflow.airflow_components``) over a fresh 2-partition super stream on the real 4.3
broker, the session's Spark Connect server (``spark_connect``) and a SQLite ledger. Records are
published in waves, one inside each of ``INTERVALS`` data intervals of ``INTERVAL_S`` seconds, plus
a late wave after the last one (data keeps arriving; it also makes the last interval's end
resolvable at once). Then ``airflow backfill create --dag-id streamledger_backfill --max-active-runs
4`` over those intervals.

Proven here:

* every backfill run succeeds (its batch and its audit task), read tasks of different intervals ran
  at the same time, and no other run of the DAG is made;
* every record of the backfilled intervals is in exactly one output, the late wave in none;
* every record's chunk timestamp is inside the data interval of the run that claimed its range
  (chunk granularity), the ledger recorded that interval, and the audit (ledger, broker drift,
  published outputs) is clean;
* each run's Asset event carries the interval start as its ``partition_key`` and the ranges in its
  extra, and ``streamledger_downstream`` (``PartitionedAssetTimetable``) got exactly one run per
  interval with that partition key, which saw that interval's records.

The Airflow home is migrated while the waves are published; the backfill is created before the
components start (the CLI and a running scheduler contend for the SQLite metadata database).
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import connection_json, warm_spark_env
from tests.e2e.test_event_driven import _db, _task_log, _wait
from tests.support.airflow import AirflowHome, airflow_components, make_airflow_home

pytestmark = [pytest.mark.airflow, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.slow]

BACKFILL = "streamledger_backfill"
DOWNSTREAM = "streamledger_downstream"
PARTITIONS = 2
INTERVALS = 4
INTERVAL_S = 5
PER_WAVE = 24
KEY_FORMAT = "%Y-%m-%dT%H:%M:%S"  # Airflow's partition-key format (StreamBatchOperator uses it too)


@dataclass
class Backfill:
    af: AirflowHome
    url: str
    name: str
    pipeline: str
    root: Path
    env: dict[str, str]
    starts: list[datetime]  # the backfilled intervals' starts
    published: dict[int, int] = field(default_factory=dict)  # event id -> wave (INTERVALS = late)

    @property
    def ledger_url(self) -> str:
        return self.env["STREAMLEDGER_LEDGER_URL"]


def _publish_waves(url: str, name: str, t0: int, published: dict[int, int]) -> None:
    """One wave in each interval ``[t0 + k*INTERVAL_S, ...)`` for k in 0..INTERVALS (the last late)."""
    from streamledger.protocol.rabbitmq import StreamClient

    with StreamClient.connect(url) as client:
        streams = client.partitions(name)
        for wave in range(INTERVALS + 1):
            begin = t0 + wave * INTERVAL_S
            time.sleep(max(0.0, begin + 0.5 - time.time()))
            batch: dict[str, list[bytes]] = {s: [] for s in streams}
            for event in range(wave * PER_WAVE, (wave + 1) * PER_WAVE):
                batch[streams[event % len(streams)]].append(json.dumps({"id": event, "wave": wave}).encode())
                published[event] = wave
            for stream, bodies in batch.items():
                assert client.publish(stream, bodies).confirmed == len(bodies)
            assert time.time() < begin + INTERVAL_S - 0.5, "publishing overran its interval"


@pytest.fixture(scope="module")
def backfill(rabbitmq_url: str, spark_connect: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfill]:
    from streamledger.protocol.rabbitmq import StreamClient

    root = tmp_path_factory.mktemp("backfill-airflow")
    name = f"i25-bf-{uuid.uuid4().hex[:8]}"
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=PARTITIONS)
    # The intervals start once the components are being set up; the DAG schedules nothing after
    # the last backfilled one (STREAMLEDGER_END_DATE), so the backfill's runs are the only ones.
    t0 = math.ceil(time.time()) + 2
    starts = [datetime.fromtimestamp(t0 + k * INTERVAL_S, UTC) for k in range(INTERVALS)]
    env = {
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": connection_json(rabbitmq_url),
        "STREAMLEDGER_SUPER_STREAM": name,
        "STREAMLEDGER_PIPELINE": f"p-{name}",
        "STREAMLEDGER_INTERVAL": f"{INTERVAL_S}s",
        "STREAMLEDGER_START_DATE": starts[0].isoformat(),
        "STREAMLEDGER_END_DATE": starts[-1].isoformat(),
        "STREAMLEDGER_LEDGER_URL": f"sqlite:///{root / 'ledger.db'}",
        "STREAMLEDGER_OUTPUT_ROOT": str(root / "output"),
        # the session's warm Spark Connect server: four task processes each starting a Spark JVM at
        # once take minutes on 2 busy cores
        **warm_spark_env(spark_connect),
    }
    published: dict[int, int] = {}
    failure: list[BaseException] = []

    def publish() -> None:
        try:
            _publish_waves(rabbitmq_url, name, t0, published)
        except BaseException as exc:  # reported by the test, not lost in the thread
            failure.append(exc)

    publisher = threading.Thread(target=publish, name="waves")
    publisher.start()
    try:
        af = make_airflow_home(root / "airflow", extra_env=env)
        # Airflow's CLI writes to the SQLite metadata database, which a running scheduler keeps
        # locked ("database is locked"): serialize the DAGs, create the backfill and unpause before
        # the components start. The backfill needs its intervals to have ended; the DAGs stay paused.
        af.airflow("dags", "reserialize")
        publisher.join()
        assert not failure, f"publishing failed: {failure[0]!r}"
        af.airflow("backfill", "create", "--dag-id", BACKFILL, "--from-date", starts[0].isoformat(),
                   "--to-date", starts[-1].isoformat(), "--max-active-runs", "4")
        with airflow_components(af, env=env):
            # Unpaused once the execution API is up (tasks queued earlier fail to start): the
            # downstream DAG first (it must listen before the first asset event), then the backfill
            # DAG (backfill runs run only for an unpaused DAG).
            for dag_id in (DOWNSTREAM, BACKFILL):
                af.airflow("dags", "unpause", dag_id)
            yield Backfill(af=af, url=rabbitmq_url, name=name, pipeline=env["STREAMLEDGER_PIPELINE"],
                           root=root, env=env, starts=starts, published=published)
    finally:
        publisher.join()
        with StreamClient.connect(rabbitmq_url) as client:
            client.delete_super_stream(name, missing_ok=True)


def _runs(af: AirflowHome, dag_id: str) -> list[dict[str, Any]]:
    rows = _db(af, "SELECT run_id, state, run_type, data_interval_start, data_interval_end, partition_key "
                   "FROM dag_run WHERE dag_id = ? ORDER BY id", dag_id)
    keys = ("run_id", "state", "run_type", "start", "end", "partition_key")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _moment(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _json(value: Any) -> Any:
    """A JSON column as stored (text, possibly a JSON-encoded string of the JSON)."""
    while isinstance(value, str | bytes):
        value = json.loads(value)
    return value


def _output_rows(root: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows = []
    for part in sorted(root.glob("*/*/*/*.parquet")):
        table = pq.read_table(part, columns=["stream", "offset", "chunk_timestamp", "body"]).to_pylist()
        for row in table:
            row["id"] = json.loads(row.pop("body"))["id"]
            row["directory"] = str(part.parent)
            rows.append(row)
    return rows


@pytest.mark.timeout(900)
def test_parallel_backfill_pins_each_interval_and_feeds_one_downstream_run_per_interval(
        backfill: Backfill) -> None:
    from streamledger.batch.proof import audit
    from streamledger.ledger import Ledger
    from streamledger.protocol.rabbitmq import StreamClient

    began = time.monotonic()
    af = backfill.af
    def finished() -> bool:
        runs = _runs(af, BACKFILL)
        failed = [r for r in runs if r["state"] == "failed"]
        assert not failed, f"backfill run failed: {failed}\n{_task_log(af)}"
        return len(runs) == INTERVALS and all(r["state"] == "success" for r in runs)

    _wait("the backfill to finish", 600, finished)
    backfilled = time.monotonic() - began
    runs = _runs(af, BACKFILL)
    assert [r["run_type"] for r in runs] == ["backfill"] * INTERVALS, runs
    interval_of = {r["run_id"]: (_moment(r["start"]), _moment(r["end"])) for r in runs}
    assert sorted(start for start, _ in interval_of.values()) == backfill.starts
    peak = _db(af, "SELECT COUNT(*) FROM task_instance t1 JOIN task_instance t2 ON t1.dag_id = t2.dag_id "
                   "AND t1.task_id = t2.task_id AND t1.run_id < t2.run_id WHERE t1.dag_id = ? "
                   "AND t1.task_id = 'read_interval' AND t1.start_date < t2.end_date "
                   "AND t2.start_date < t1.end_date", BACKFILL)[0][0]
    assert peak >= 1, "the backfill's read tasks never ran at the same time"

    # every backfilled record exactly once, the late wave nowhere
    rows = _output_rows(backfill.root / "output" / backfill.pipeline)
    assert not [k for k, n in Counter((r["stream"], r["offset"]) for r in rows).items() if n > 1]
    expected = sorted(i for i, wave in backfill.published.items() if wave < INTERVALS)
    assert sorted(r["id"] for r in rows) == expected, "every backfilled record exactly once"

    # every record's chunk timestamp inside the data interval of the run that claimed its range
    ledger = Ledger(backfill.ledger_url)
    # (an empty committed range marks the history's origin when a later interval claimed first)
    ranges = [r for r in ledger.ranges(backfill.pipeline) if str(r.status) == "committed" and not r.empty]
    assert {r.run.run_id for r in ranges} == set(interval_of), "each run claimed its own ranges"
    assert len(ranges) == INTERVALS * PARTITIONS
    by_directory = {str(Path(r.output)): r for r in ranges if r.output}
    for row in rows:
        claimed = by_directory[row["directory"]]
        start, end = interval_of[claimed.run.run_id]
        assert claimed.interval == (start, end), (claimed.label(), claimed.interval)
        stamped = row["chunk_timestamp"].replace(tzinfo=UTC)
        assert start <= stamped < end, (row, claimed.label(), start, end)
        assert backfill.published[row["id"]] == backfill.starts.index(start)
    with StreamClient.connect(backfill.url) as client:
        report = audit(ledger, backfill.pipeline, broker=client, deep=True)
    assert report.clean, report

    # each run's asset event: the interval start as partition key, the ranges in the extra
    events = _db(af, "SELECT e.partition_key, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                     "WHERE a.name = ? ORDER BY e.id", f"streamledger-{backfill.pipeline}")
    keys = [start.strftime(KEY_FORMAT) for start in backfill.starts]
    assert sorted(key for key, _ in events) == keys, events
    records_of = {key: _json(extra)["records"] for key, extra in events}
    assert records_of == {key: PER_WAVE for key in keys}

    # the partitioned-asset timetable: one downstream run per interval, with its partition key
    def downstream_done() -> bool:
        runs = _runs(af, DOWNSTREAM)
        assert not [r for r in runs if r["state"] == "failed"], f"{runs}\n{_task_log(af)}"
        return len(runs) >= INTERVALS and all(r["state"] == "success" for r in runs)

    _wait("one downstream run per interval", 300, downstream_done)
    time.sleep(3)  # nothing more comes
    downstream = _runs(af, DOWNSTREAM)
    assert sorted(r["partition_key"] for r in downstream) == keys, downstream
    summaries = _db(af, "SELECT r.partition_key, x.value FROM xcom x JOIN dag_run r ON r.id = x.dag_run_id "
                        "WHERE x.dag_id = ? AND x.task_id = 'interval_summary' AND x.key = 'return_value'",
                    DOWNSTREAM)
    seen = {key: _json(value) for key, value in summaries}
    assert set(seen) == set(keys)
    for key, summary in seen.items():
        assert summary["partition_key"] == key and summary["events"] == 1
        assert summary["records"] == PER_WAVE, summary
    print(f"parallel backfill e2e: {INTERVALS} intervals backfilled in {backfilled:.1f}s "
          f"(read tasks overlapping: {peak} pairs), whole test {time.monotonic() - began:.1f}s")
