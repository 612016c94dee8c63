"""Issue 21, faults: table sinks against the real broker, local Spark, pyiceberg and delta-rs.

* a table that cannot take the job's files is refused before anything is claimed (one line naming
  the table and the reason), from ``run_batch`` and from ``streamledger batch run``;
* rows others append to the table between two batches leave the audit clean;
* batches of different pipelines committing to one table at once retry on the table's optimistic
  concurrency and both end exactly once; a table too busy to commit to fails in one line and the
  next run publishes;
* the audit after the table's old snapshots / log versions are gone, still catching a planted
  duplicate and a planted missing range;
* a ``streamledger batch run`` process SIGKILLed at each crash point of the crash table
  (docs/ledger.md), then a retry of the same ``--run-id`` and a new run: every record once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamledger.batch import BatchError, run_batch, sinks
from streamledger.batch.proof import audit
from streamledger.batch.sinks import KEY_PIPELINE, KEY_RANGES, default_iceberg_table
from streamledger.batch.sinks.delta import DeltaSink
from streamledger.batch.sinks.iceberg import IcebergSink, catalog_properties, load_catalog
from streamledger.ledger import Ledger, ViolationKind
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.spark.arrow import ARROW_SCHEMA
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.batch.test_table_sinks import PIPE, pipeline_commits, table_rows
from tests.integration.spark.helpers import body, create_stream, publish
from tests.support.spark import spark_env

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]


def no_job(**_kw: Any) -> Any:
    raise AssertionError("a refused batch must not reach the job")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def catalog_of(ledger: Ledger, root: Path) -> Any:
    return load_catalog(catalog_properties(None, ledger_url=ledger.url, output_root=str(root)))


def foreign_rows(stream: str, offsets: list[int]) -> pa.Table:
    """Rows someone else writes into the table (the job's columns)."""
    n = len(offsets)
    return pa.table({"stream": [stream] * n, "offset": offsets, "chunk_timestamp": [None] * n,
                     "body": [b"theirs"] * n, "properties": [None] * n,
                     "application_properties": [None] * n, "message_annotations": [None] * n},
                    schema=ARROW_SCHEMA)


def append_foreign(sink: str, ledger: Ledger, root: Path, rows: pa.Table, *,
                   table: str | None = None) -> None:
    if sink == "iceberg":
        tbl = catalog_of(ledger, root).load_table(table or default_iceberg_table(PIPE))
        tbl.append(in_schema(rows, tbl.schema().as_arrow()))
    else:
        from deltalake import DeltaTable, write_deltalake

        where = table or str(root / PIPE)
        if DeltaTable.is_deltatable(where):
            rows = in_schema(rows, pa.schema(DeltaTable(where).schema().to_arrow()))
        write_deltalake(where, rows, mode="append")


def in_schema(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """Someone else's rows as a writer of the table's schema writes them: the columns they do not
    know (the sinks' ``broker``/``epoch``) null."""
    return pa.table({f.name: rows[f.name] if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
                     for f in schema}).cast(schema)


# -- bad input and faults: refused before anything is claimed ------------------------------------

def plant(fault: str, ledger: Ledger, root: Path) -> tuple[str, list[str], dict[str, Any], str]:
    """Make the fault; (sink, extra CLI args, extra config, the reason expected in the one line)."""
    ice, delta = default_iceberg_table(PIPE), str(root / PIPE)
    if fault == "iceberg-schema":
        cat = catalog_of(ledger, root)
        cat.create_namespace_if_not_exists("streamledger")
        cat.create_table(ice, schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))
        return "iceberg", [], {}, (f"iceberg table {ice}: its columns (id, name) are not the job's (stream, "
                                   "offset, chunk_timestamp, body, properties, application_properties, "
                                   "message_annotations)")
    if fault == "iceberg-unreachable":
        port = free_port()
        return ("iceberg", ["--catalog", "type=rest", "--catalog", f"uri=http://127.0.0.1:{port}"],
                {"catalog": {"type": "rest", "uri": f"http://127.0.0.1:{port}"}},
                f"iceberg table {ice}: the catalog cannot be reached")
    if fault == "delta-schema":
        from deltalake import write_deltalake

        wrong = pa.schema([pa.field(f.name, pa.string()) if f.name == "offset" else f
                           for f in ARROW_SCHEMA])
        write_deltalake(delta, wrong.empty_table())
        return "delta", [], {}, (f"delta table {delta}: its column types are not the job's: offset is "
                                 "string, the job writes integer")
    if fault == "delta-parquet-dir":
        (root / PIPE).mkdir()
        pq.write_table(ARROW_SCHEMA.empty_table(), root / PIPE / "part-00000.parquet")
        return "delta", [], {}, (f"delta table {delta}: not a Delta table (no _delta_log) but a directory of "
                                 "other files (part-00000.parquet)")
    if fault == "delta-file":
        (root / PIPE).write_bytes(b"PAR1")
        return "delta", [], {}, f"delta table {delta}: the location is a file, not a Delta table"
    assert fault == "delta-bad-log"
    (root / PIPE / "_delta_log").mkdir(parents=True)
    (root / PIPE / "_delta_log" / "00000000000000000000.json").write_text("not json\n")
    return "delta", [], {}, f"delta table {delta}: cannot be opened: "


@pytest.mark.parametrize("fault", ["iceberg-schema", "iceberg-unreachable", "delta-schema",
                                   "delta-parquet-dir", "delta-file", "delta-bad-log"])
def test_a_table_that_cannot_take_the_jobs_files_is_refused_before_anything_is_claimed(
    fault: str, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Bad input and faults: one line naming the table and the reason, from ``run_batch`` and from
    ``streamledger batch run`` (exit 1; exit 3 when the catalog cannot be reached, docs/cli.md's code for
    an unreachable server or store); no range claimed or committed, no offset stored, no job."""
    from streamledger.cli import main

    s = stream_name(f"bad-{fault}")
    create_stream(rabbitmq_url, s, 20)
    root = tmp_path / "out"
    root.mkdir()
    sink, args, extra, reason = plant(fault, ledger, root)
    cfg = config(rabbitmq_url, root, s, sink=sink, **extra)
    with pytest.raises(BatchError) as caught:
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=no_job)
    assert reason in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert ledger.ranges(PIPE) == []  # nothing claimed, so nothing to release
    capsys.readouterr()
    argv = ["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", PIPE, "--ledger", ledger.url,
            "--output-root", str(root), "--sink", sink, *args, "--run-id", "nightly-1"]
    assert main(argv) == (3 if fault == "iceberg-unreachable" else 1)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("streamledger: error: ") and reason in err[0], err
    assert ledger.ranges(PIPE) == []
    assert client.query_offset(s, PIPE) is None


def test_a_name_that_is_not_namespace_name_is_a_usage_error_for_both_front_doors(
    ledger: Ledger, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """``--table`` for Iceberg is ``namespace.name``; a Delta location must not be blank: exit 2 from the
    command line, BatchError from the configuration, before any connection."""
    from streamledger.cli import main

    base = ["batch", "run", "--url", "rabbitmq-stream://127.0.0.1:1", "--stream", "s", "--pipeline", PIPE,
            "--ledger", ledger.url, "--output-root", str(tmp_path)]
    for sink, table, reason in (("iceberg", "a.b.c", "iceberg table 'a.b.c' is not 'namespace.name'"),
                                ("iceberg", ".events", "iceberg table '.events' is not 'namespace.name'"),
                                ("delta", " ", "delta table location must not be empty")):
        assert main([*base, "--sink", sink, "--table", table]) == 2
        assert reason in capsys.readouterr().err
        with pytest.raises(BatchError, match=reason.replace(".", r"\.")):
            config("rabbitmq-stream://127.0.0.1:1", tmp_path, "s", sink=sink, table=table)
    assert ledger.ranges(PIPE) == []


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_rows_others_append_between_two_batches_leave_the_audit_clean(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path,
) -> None:
    """A table written by someone else between two batches is fine: their rows (another stream, or
    offsets outside the pipeline's ranges) are not the pipeline's; the next batch commits on top."""
    s = stream_name(f"others-{sink}")
    create_stream(rabbitmq_url, s, 90)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink, max_offsets=50)
    run_batch(cfg, run=rid("t", run="r1"), ledger=ledger, broker=client, runner=runner)
    append_foreign(sink, ledger, tmp_path, foreign_rows("someone-elses", list(range(0, 60))))
    append_foreign(sink, ledger, tmp_path, foreign_rows(s, [10**9, 10**9 + 1]))
    run_batch(cfg, run=rid("t", run="r2"), ledger=ledger, broker=client, runner=runner)
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
    rows = table_rows(sink, ledger, tmp_path)
    mine = rows.filter(pa.compute.and_(pa.compute.equal(rows["stream"], s),
                                       pa.compute.less(rows["offset"], 10**9)))
    assert mine.column("offset").to_pylist() == list(range(90))
    assert rows.num_rows == 90 + 62
    assert [[(e["start"], e["records"]) for e in r] for _, r in pipeline_commits(sink, ledger, tmp_path)] == [
        [(0, 50)], [(50, 40)]]


# -- concurrent batches of different pipelines into one table -------------------------------------

def shared_table(sink: str, root: Path) -> str:
    return "streamledger.shared" if sink == "iceberg" else str(root / "shared")


def shared_rows(sink: str, ledger: Ledger, root: Path) -> pa.Table:
    if sink == "iceberg":
        rows = catalog_of(ledger, root).load_table(shared_table(sink, root)).scan().to_arrow()
    else:
        from deltalake import DeltaTable

        rows = DeltaTable(shared_table(sink, root)).to_pyarrow_table()
    return rows.sort_by([("stream", "ascending"), ("offset", "ascending")])


def sink_class(sink: str) -> Any:
    return IcebergSink if sink == "iceberg" else DeltaSink


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_batches_of_two_pipelines_committing_to_one_table_at_once_retry_and_land_once(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Two pipelines (one stream each) run a batch each in two threads; both look at the table in
    the same state before committing (a barrier lines the race up), so one commit loses to the
    table's optimistic concurrency (pyiceberg CommitFailedException / delta-rs CommitFailedError),
    looks again and commits on top: both pipelines' records once, each range in one commit."""
    streams = {"pa": stream_name(f"conc-a-{sink}"), "pb": stream_name(f"conc-b-{sink}")}
    for i, s in enumerate(streams.values()):
        create_stream(rabbitmq_url, s, 40 + 10 * i)
    barrier = threading.Barrier(2, timeout=60)
    seen: set[int] = set()
    real_held = sink_class(sink)._held

    def held_in_step(self: Any, table: Any, ids: set[int]) -> Any:
        found = real_held(self, table, ids)
        me = threading.get_ident()
        if me not in seen:  # the first look of each batch: wait until the other looked too
            seen.add(me)
            barrier.wait()
        return found

    monkeypatch.setattr(sink_class(sink), "_held", held_in_step)
    table = shared_table(sink, tmp_path)
    errors: list[BaseException] = []

    def one(pipeline: str, stream: str) -> None:
        try:
            with Ledger(ledger.url) as own, StreamClient.connect(rabbitmq_url) as broker:
                cfg = config(rabbitmq_url, tmp_path, stream, sink=sink, table=table, pipeline=pipeline)
                run_batch(cfg, run=rid("t", run=pipeline), ledger=own, broker=broker, runner=runner)
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    caplog.set_level("WARNING", logger=f"streamledger.batch.sinks.{sink}")
    threads = [threading.Thread(target=one, args=item) for item in streams.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    lost = [r.getMessage() for r in caplog.records if "changed while committing" in r.getMessage()]
    assert len(lost) >= 1, "the two commits did not collide"
    rows = shared_rows(sink, ledger, tmp_path)
    for i, (pipeline, s) in enumerate(streams.items()):
        n = 40 + 10 * i
        mine = rows.filter(pa.compute.equal(rows["stream"], s))
        assert mine.column("offset").to_pylist() == list(range(n))
        assert mine.column("body").to_pylist() == [body(s, k) for k in range(n)]
        (rng,) = [r for r in ledger.ranges(pipeline) if r.records]
        assert rng.sink_commit is not None and rng.published_at is not None
        report = audit(ledger, pipeline, broker=client)
        assert report.clean, report.to_text()
        assert client.query_offset(s, pipeline) == n - 1


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_a_table_another_batch_creates_while_this_one_creates_it_is_used_not_refused(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two batches starting on a table nobody created yet both find it missing; the one whose create
    lands second (pyiceberg: CommitFailedException "Table already exists" from its create
    transaction) opens the winner's table and commits on top (CI stop 39 failed on this race)."""
    s = stream_name(f"create-race-{sink}")
    create_stream(rabbitmq_url, s, 30)
    table = shared_table(sink, tmp_path)
    other_stream = "someone-elses"

    def create_meanwhile() -> None:  # the other batch's create, landing between look and create
        rows = foreign_rows(other_stream, [0, 1])
        schema = sinks.with_table_columns(rows.schema)
        if sink == "iceberg":
            cat = catalog_of(ledger, tmp_path)
            cat.create_namespace_if_not_exists("streamledger")
            cat.create_table(table, schema=schema).append(in_schema(rows, schema))
        else:
            from deltalake import DeltaTable, write_deltalake

            DeltaTable.create(table, schema, name="other")
            write_deltalake(table, in_schema(rows, schema), mode="append")

    if sink == "iceberg":
        real = IcebergSink._create_namespace

        def hook(self: Any, namespace: str) -> None:
            create_meanwhile()
            real(self, namespace)

        monkeypatch.setattr(IcebergSink, "_create_namespace", hook)
    else:
        real_refuse = DeltaSink._refuse_foreign_log

        def hook_delta(self: Any) -> None:
            real_refuse(self)
            create_meanwhile()

        monkeypatch.setattr(DeltaSink, "_refuse_foreign_log", hook_delta)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink, table=table)
    run_batch(cfg, run=rid("t", run="r1"), ledger=ledger, broker=client, runner=runner)
    rows = shared_rows(sink, ledger, tmp_path)
    assert rows.filter(pa.compute.equal(rows["stream"], s)).column("offset").to_pylist() == list(range(30))
    assert rows.filter(pa.compute.equal(rows["stream"], other_stream)).num_rows == 2
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_a_table_too_busy_to_commit_to_fails_in_one_line_and_the_next_run_publishes(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Someone else commits to the table every time the batch has looked at it: after the bounded
    number of attempts (with backoff) the batch fails in one line naming the table and the range; the
    range stays committed and unpublished (no offset stored past it), and the next run commits it
    without reading again."""
    s = stream_name(f"busy-{sink}")
    create_stream(rabbitmq_url, s, 30)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink)
    # The table exists before the batch (someone else's rows), so the busy writer can always append.
    if sink == "iceberg":
        cat = catalog_of(ledger, tmp_path)
        cat.create_namespace_if_not_exists("streamledger")
        cat.create_table(default_iceberg_table(PIPE), schema=ARROW_SCHEMA)
    append_foreign(sink, ledger, tmp_path, foreign_rows("theirs", [0]))
    real_held = sink_class(sink)._held
    n = {"foreign": 0}

    def others_commit_meanwhile(self: Any, table: Any, ids: set[int]) -> Any:
        found = real_held(self, table, ids)
        n["foreign"] += 1
        append_foreign(sink, ledger, tmp_path, foreign_rows("theirs", [n["foreign"]]))
        return found

    monkeypatch.setattr(sinks, "COMMIT_ATTEMPTS", 3)
    monkeypatch.setattr(sink_class(sink), "_held", others_commit_meanwhile)
    with pytest.raises(BatchError) as caught:
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    msg = str(caught.value)
    where = default_iceberg_table(PIPE) if sink == "iceberg" else str(tmp_path / PIPE)
    assert msg == (f"{sink} table {where}: 3 commits lost to concurrent writers; {s} [0, 30) stay committed "
                   "and unpublished for the next run"), msg
    assert n["foreign"] == 3 + 1  # each attempt's look, and the last look before giving up
    assert pipeline_commits(sink, ledger, tmp_path) == []
    (rng,) = ledger.ranges(PIPE)
    assert rng.status.value == "committed" and rng.published_at is None
    assert client.query_offset(s, PIPE) is None
    monkeypatch.setattr(sink_class(sink), "_held", real_held)
    reads = runner.calls
    run_batch(cfg, run=rid("t", run="r2"), ledger=ledger, broker=client, runner=runner)
    assert runner.calls == reads
    rows = table_rows(sink, ledger, tmp_path)
    mine = rows.filter(pa.compute.equal(rows["stream"], s))
    assert mine.column("offset").to_pylist() == list(range(30))
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


# -- the audit after expired snapshots / cleaned-up log versions ---------------------------------

def expire_old_commits(sink: str, ledger: Ledger, root: Path) -> None:
    """Iceberg: expire every snapshot but the current one. Delta: vacuum, then checkpoint and clean up
    every log version before it (log retention 0)."""
    if sink == "iceberg":
        tbl = catalog_of(ledger, root).load_table(default_iceberg_table(PIPE))
        current = tbl.current_snapshot().snapshot_id
        old = [snap.snapshot_id for snap in tbl.snapshots() if snap.snapshot_id != current]
        tbl.maintenance.expire_snapshots().by_ids(old).commit()
        assert [snap.snapshot_id for snap in catalog_of(ledger, root).load_table(
            default_iceberg_table(PIPE)).snapshots()] == [current]
    else:
        from deltalake import DeltaTable

        dt = DeltaTable(str(root / PIPE))
        dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        dt.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
        dt = DeltaTable(str(root / PIPE))
        dt.create_checkpoint()
        dt.cleanup_metadata()
        versions = [h["version"] for h in DeltaTable(str(root / PIPE)).history()]
        assert versions == [dt.version()], versions


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_the_audit_after_old_commits_expired_counts_rows_and_still_catches_a_duplicate_and_a_gap(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path,
) -> None:
    """The ledger keeps each range's commit id; once the table forgot the commit, the audit checks
    the range by its rows alone: clean after the expiry, and a planted duplicate in one range, the
    rows of another deleted and a commit in the pipeline's name the ledger never made are all named."""
    s = stream_name(f"expire-{sink}")
    create_stream(rabbitmq_url, s, 90)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink, max_offsets=30, store_offset=False)
    for run in ("r1", "r2", "r3"):
        run_batch(cfg, run=rid("t", run=run), ledger=ledger, broker=client, runner=runner)
    expire_old_commits(sink, ledger, tmp_path)
    report = audit(ledger, PIPE)
    assert report.clean, report.to_text()
    rows = table_rows(sink, ledger, tmp_path)
    append_foreign(sink, ledger, tmp_path, rows.filter(pa.compute.less(rows["offset"], 5)))  # range [0, 30)
    if sink == "iceberg":
        catalog_of(ledger, tmp_path).load_table(default_iceberg_table(PIPE)).delete(
            "offset >= 30 and offset < 60")
    else:
        from deltalake import DeltaTable

        DeltaTable(str(tmp_path / PIPE)).delete("\"offset\" >= 30 and \"offset\" < 60")
    # A commit in the pipeline's name the ledger never made (a forged or foreign summary).
    forged = {KEY_PIPELINE: PIPE, KEY_RANGES: json.dumps([{"id": 999, "stream": s, "start": 90, "end": 120,
                                                           "records": 1}])}
    if sink == "iceberg":
        tbl = catalog_of(ledger, tmp_path).load_table(default_iceberg_table(PIPE))
        tbl.append(in_schema(foreign_rows(s, [10**9]), tbl.schema().as_arrow()), snapshot_properties=forged)
    else:
        from deltalake import CommitProperties, DeltaTable, write_deltalake

        schema = pa.schema(DeltaTable(str(tmp_path / PIPE)).schema().to_arrow())
        write_deltalake(str(tmp_path / PIPE), in_schema(foreign_rows(s, [10**9]), schema), mode="append",
                        commit_properties=CommitProperties(custom_metadata=forged))
    report = audit(ledger, PIPE)
    text = report.to_text()
    found = {(v.kind, v.start, v.end) for v in report.violations}
    assert "holds range 999 [90, 120), which the ledger did not commit" in text, text
    assert (ViolationKind.OUTPUT_MISMATCH, 0, 30) in found, text
    assert "5 duplicate (stream, offset) row(s)" in text, text
    assert (ViolationKind.OUTPUT_MISMATCH, 30, 60) in found, text
    assert "holds 0 rows in the range, the ledger committed 30" in text
    assert not [v for v in report.violations if (v.start, v.end) == (60, 90)], text


# -- SIGKILL at each crash point ------------------------------------------------------------------

def table_exists(sink: str, ledger: Ledger, root: Path) -> bool:
    if sink == "iceberg":
        return bool(catalog_of(ledger, root).table_exists(default_iceberg_table(PIPE)))
    from deltalake import DeltaTable

    return bool(DeltaTable.is_deltatable(str(root / PIPE)))


def wait_for(path: Path, child: subprocess.Popen[bytes], log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if child.poll() is not None:
            raise AssertionError(f"the child ended ({child.returncode}) before its step:\n"
                                 f"{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the child never reached its step:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


# The suite runs each crash point once, the sinks taking turns; `make test-matrix` runs every cell.
SIGKILL_IN_SUITE = {("iceberg", "read"), ("delta", "committed"), ("iceberg", "table_committed"),
                    ("delta", "published")}


@pytest.mark.timeout(600)  # alone, the Spark Connect server's start; in the suite it is shared
@pytest.mark.parametrize(("sink", "step"), [
    pytest.param(sink, step, marks=() if (sink, step) in SIGKILL_IN_SUITE else pytest.mark.matrix)
    for sink in ("iceberg", "delta") for step in ("read", "committed", "table_committed", "published")])
def test_a_sigkilled_batch_process_then_a_retry_and_a_new_run_leave_every_record_once(
    sink: str, step: str, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, spark_connect: str,
) -> None:
    """Each crash point of the crash table, with a real SIGKILL: a ``streamledger batch run`` process
    parked right after ``step`` is killed; between the kill and the retry no table commit is unknown
    to the ledger; the retry (same ``--run-id``) finishes the batch and a new run reads what came
    since: every record once, each range in one commit, the audit (ledger, table, broker) clean.
    Every job runs on the shared Spark Connect server, so the killed process is a light client; the
    retry and the new run are processes too (this one runs no Spark: PySpark refuses a Connect
    session in a process that runs a classic one, as the suite's shared session does)."""
    s = stream_name(f"kill-{sink}-{step}")
    create_stream(rabbitmq_url, s, 60)
    argv = ["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", PIPE, "--ledger", ledger.url,
            "--output-root", str(tmp_path), "--sink", sink, "--remote", spark_connect]
    marker, log = tmp_path / "parked", tmp_path / "child.log"
    env = {k: v for k, v in spark_env(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)])).items()
           if not k.startswith("PYSPARK_GATEWAY")}  # never the suite's classic session's JVM
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.batch.park", step, str(marker), "--", *argv,
             "--run-id", "nightly-1"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(marker, child, log)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    (rng,) = ledger.ranges(PIPE)
    assert rng.status.value == ("claimed" if step == "read" else "committed")
    assert (rng.published_at is not None) == (step == "published")
    in_table = step in ("table_committed", "published")  # before that the table does not exist yet
    assert table_exists(sink, ledger, tmp_path) == in_table
    assert len(pipeline_commits(sink, ledger, tmp_path) if in_table else []) == int(in_table)
    between = audit(ledger, PIPE)  # a commit in the table always names a range the ledger committed
    assert not [v for v in between.violations if "did not commit" in v.detail], between.to_text()
    assert client.query_offset(s, PIPE) is None

    def cli(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "streamledger.cli", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=240, check=False)
        assert done.returncode == 0, done.stderr[-3000:]

    cli(*argv, "--run-id", "nightly-1")  # the retry of the same identity
    publish(rabbitmq_url, s, 25, start=60)
    cli(*argv)  # a new run
    # (the new records follow the tracking chunk the first StoreOffset wrote: offsets 61..85)
    rows = table_rows(sink, ledger, tmp_path)
    offsets = rows.column("offset").to_pylist()
    assert offsets == [*range(60), *range(61, 86)]  # every record once, none twice
    assert rows.column("body").to_pylist() == [body(s, i) for i in range(85)]
    commits = pipeline_commits(sink, ledger, tmp_path)
    committed = [r for r in ledger.ranges(PIPE) if r.records]
    assert sorted(e["id"] for _, ranges in commits for e in ranges) == sorted(r.id for r in committed)
    by_commit = {e["id"]: c for c, ranges in commits for e in ranges}
    assert all(r.published_at is not None and r.sink_commit == by_commit[r.id] for r in committed)
    assert len(commits) == 2
    assert next(r.run.run_id for r in ledger.ranges(PIPE) if r.records) == "nightly-1"
    assert client.query_offset(s, PIPE) == 85
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
