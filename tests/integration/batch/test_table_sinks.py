"""Issue 21: exactly once into lakehouse tables. Against the real RabbitMQ 4.3 broker, local Spark, real
ledgers, pyiceberg (SQL catalog in the ledger's database) and delta-rs: every committed record in the
table exactly once whatever step a batch dies after, one table commit per batch naming its ranges,
and the three-way audit (ledger / table / broker) catching a planted duplicate and a missing range.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streamledger.batch import BatchConfig, BatchError, run_batch
from streamledger.batch.proof import audit
from streamledger.batch.sinks import KEY_PIPELINE, KEY_RANGES, default_iceberg_table
from streamledger.batch.sinks.delta import app_id
from streamledger.batch.sinks.iceberg import catalog_properties, load_catalog
from streamledger.ledger import Ledger, RunIdentity, ViolationKind
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, Killed, config, rid
from tests.integration.spark.helpers import body, create_stream

pytestmark = pytest.mark.timeout(300)

PIPE = "p-exactly-once"


def die_after(step: str) -> Any:
    def hook(name: str, _batch: Any) -> None:
        if name == step:
            raise Killed(f"SIGKILL after {step}")

    return hook


def table_rows(sink: str, ledger: Ledger, root: Path) -> pa.Table:
    """What a reader of the table sees (pyiceberg / deltalake), sorted by stream and offset."""
    if sink == "iceberg":
        cat = load_catalog(catalog_properties(None, ledger_url=ledger.url, output_root=str(root)))
        rows = cat.load_table(default_iceberg_table(PIPE)).scan().to_arrow()
    else:
        from deltalake import DeltaTable

        rows = DeltaTable(str(root / PIPE)).to_pyarrow_table()
    return rows.sort_by([("stream", "ascending"), ("offset", "ascending")])


def pipeline_commits(sink: str, ledger: Ledger, root: Path) -> list[tuple[int, list[dict[str, Any]]]]:
    """(commit id, ranges) of every table commit the pipeline made, oldest first."""
    out: list[tuple[int, list[dict[str, Any]]]] = []
    if sink == "iceberg":
        cat = load_catalog(catalog_properties(None, ledger_url=ledger.url, output_root=str(root)))
        for snap in cat.load_table(default_iceberg_table(PIPE)).snapshots():
            props = snap.summary.additional_properties if snap.summary else {}
            if props.get(KEY_PIPELINE) == PIPE:
                out.append((snap.snapshot_id, json.loads(props[KEY_RANGES])))
    else:
        from deltalake import DeltaTable

        for info in reversed(DeltaTable(str(root / PIPE)).history()):
            if info.get(KEY_PIPELINE) == PIPE:
                out.append((info["version"], json.loads(info[KEY_RANGES])))
    return out


def assert_exactly_once(sink: str, ledger: Ledger, root: Path, stream: str, n: int) -> None:
    rows = table_rows(sink, ledger, root)
    assert rows.column("offset").to_pylist() == list(range(n))  # every offset once, none twice
    assert rows.column("body").to_pylist() == [body(stream, i) for i in range(n)]
    committed = [r for r in ledger.ranges(PIPE) if r.records]
    commits = pipeline_commits(sink, ledger, root)
    held = sorted(e["id"] for _, ranges in commits for e in ranges)
    assert held == sorted(r.id for r in committed)  # each committed range in exactly one commit
    by_commit = {e["id"]: c for c, ranges in commits for e in ranges}
    for r in committed:
        assert r.published_at is not None and r.sink_commit == by_commit[r.id]
        assert r.sink_table is not None and r.sink_table.startswith(f"{sink}:")


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_batches_land_in_the_table_once_with_one_commit_each(
    sink: str, any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path,
) -> None:
    """Items 2-3: two batches make two table commits (created on first use), each naming its range;
    the ledger records the snapshot id / version; the three-way audit is clean."""
    s = stream_name(f"tbl-{sink}")
    create_stream(rabbitmq_url, s, 150)
    cfg = config(rabbitmq_url, tmp_path, s, max_offsets=100, sink=sink)
    for run in ("r1", "r2"):
        run_batch(cfg, run=rid("t", run=run), ledger=any_ledger, broker=client, runner=runner)
    assert_exactly_once(sink, any_ledger, tmp_path, s, 150)
    assert [[(e["start"], e["records"]) for e in ranges]
            for _, ranges in pipeline_commits(sink, any_ledger, tmp_path)] == [[(0, 100)], [(100, 50)]]
    if sink == "delta":
        from deltalake import DeltaTable

        assert DeltaTable(str(tmp_path / PIPE)).transaction_version(app_id(PIPE)) == 2
    assert client.query_offset(s, PIPE) == 149
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


@pytest.mark.parametrize("step", ["committed", "table_committed"])
@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_a_crash_around_the_table_commit_leaves_every_record_once(
    sink: str, step: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path,
) -> None:
    """Item 4: killed after the ledger commit (no table commit yet), or after the table commit before
    the ledger recorded it: the retry reads nothing again, finds or makes the one table commit, and
    the table holds every record once; no table commit is unknown to the ledger meanwhile."""
    s = stream_name(f"crash-{sink}")
    create_stream(rabbitmq_url, s, 80)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink)
    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner, on_step=die_after(step))
    reads = runner.calls
    assert client.query_offset(s, PIPE) is None
    assert len(pipeline_commits(sink, ledger, tmp_path) if step == "table_committed" else []) == (
        1 if step == "table_committed" else 0)
    between = audit(ledger, PIPE)  # the table's commit names a range the ledger committed: known
    assert not [v for v in between.violations if "did not commit" in v.detail], between.to_text()
    run_batch(cfg, run=rid("t", try_number=2), ledger=ledger, broker=client, runner=runner)
    assert runner.calls == reads  # published from the committed files: no second read
    assert_exactly_once(sink, ledger, tmp_path, s, 80)
    assert len(pipeline_commits(sink, ledger, tmp_path)) == 1  # the repeated commit was a no-op
    assert client.query_offset(s, PIPE) == 79
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_the_audit_catches_a_planted_duplicate_and_a_missing_range(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path,
) -> None:
    """Item 5: someone appends a range's rows a second time, and deletes another range's rows: the
    audit names both ranges (duplicate (stream, offset), row count per range)."""
    s = stream_name(f"audit-{sink}")
    create_stream(rabbitmq_url, s, 60)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink, store_offset=False)
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    assert audit(ledger, PIPE).clean  # (no offset stored: the broker side is not this test's)
    rows = table_rows(sink, ledger, tmp_path)
    again = rows.filter(pa.compute.less(rows["offset"], 20))  # 20 rows of range [0, 60) once more
    if sink == "iceberg":
        cat = load_catalog(catalog_properties(None, ledger_url=ledger.url, output_root=str(tmp_path)))
        tbl = cat.load_table(default_iceberg_table(PIPE))
        tbl.append(again.cast(tbl.schema().as_arrow()))
    else:
        from deltalake import write_deltalake

        write_deltalake(str(tmp_path / PIPE), again, mode="append")
    # A missing range: the ledger says [60, 90) went into the table, no commit of the table has it.
    (first,) = ledger.ranges(PIPE)
    token = rid("m").attempt_token("x")
    missing = ledger.claim(PIPE, first.source, 90, RunIdentity("dag", "m", "t"))
    ledger.commit(missing.id, records=30, first_seen=60, last_seen=89, output=str(tmp_path / "x"),
                  staging=str(tmp_path / "y"), publisher=token)
    ledger.mark_published(missing.id, token, table=(first.sink_table or "", first.sink_commit or 0))
    report = audit(ledger, PIPE)
    text = report.to_text()
    found = {(v.kind, v.start, v.end) for v in report.violations}
    assert (ViolationKind.OUTPUT_MISMATCH, 0, 60) in found, text
    assert "20 duplicate (stream, offset) row(s)" in text
    assert "holds 80 rows in the range, the ledger committed 60" in text
    assert (ViolationKind.OUTPUT_MISSING, 60, 90) in found, text
    assert "holds 0 rows in the range, the ledger committed 30" in text


def test_bad_table_settings_are_refused_before_anything_is_claimed(tmp_path: Path) -> None:
    """Bad input: one line naming the table and the reason, from the configuration itself."""
    base: dict[str, Any] = {"pipeline": PIPE, "url": "rabbitmq-stream://127.0.0.1:5552",
                            "output_root": str(tmp_path), "stream": "s"}
    with pytest.raises(BatchError, match=r"iceberg table 'events' is not 'namespace\.name'"):
        BatchConfig(**base, sink="iceberg", table="events")
    with pytest.raises(BatchError, match="sink must be one of directory, iceberg, delta"):
        BatchConfig(**base, sink="hudi")  # type: ignore[arg-type]
    with pytest.raises(BatchError, match="fmt must be 'parquet'"):
        BatchConfig(**base, sink="delta", fmt="json")
    with pytest.raises(BatchError, match="the directory sink takes neither"):
        BatchConfig(**base, table="a.b")


def test_batch_run_from_the_command_line_into_iceberg(
    capsys: pytest.CaptureFixture[str], ledger: Ledger, client: StreamClient, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path, spark: Any,
) -> None:
    """Item 6: ``streamledger batch run --sink iceberg --json`` runs one batch and prints the result
    with the table (identifier, location, metadata location, snapshot id); the same --run-id again
    is a retry of that run (nothing new to do); a bad table name is a usage error (exit 2)."""
    from streamledger.cli import main

    s = stream_name("cli")
    create_stream(rabbitmq_url, s, 40)
    argv = ["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", PIPE, "--ledger", ledger.url,
            "--output-root", str(tmp_path), "--sink", "iceberg", "--run-id", "nightly-1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 40 and out["run_id"] == "nightly-1"
    table = out["table"]
    assert (table["format"], table["identifier"]) == ("iceberg", default_iceberg_table(PIPE))
    assert table["metadata_location"].endswith(".metadata.json") and table["location"].startswith("file://")
    (rng,) = [r for r in ledger.ranges(PIPE) if r.records]
    assert table["snapshot_id"] == rng.sink_commit and rng.run.run_id == "nightly-1"
    assert main(argv) == 0  # a retry of the same identity: its range is done, nothing read again
    again = json.loads(capsys.readouterr().out)
    assert again["partitions"][0]["range_id"] == rng.id and again["table"]["snapshot_id"] == rng.sink_commit
    assert main([*argv[:-3], "--table", "events"]) == 2
    assert "iceberg table 'events' is not 'namespace.name'" in capsys.readouterr().err
    assert table_rows("iceberg", ledger, tmp_path).column("offset").to_pylist() == list(range(40))


def test_a_deleted_iceberg_data_file_is_a_finding_for_its_range_only(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """One data file of a two-range table deleted: the audit names the range whose rows the file
    held, and the file; the other range, whose rows are all there, is no finding."""
    from streamledger.cli import main as cli

    s = stream_name("ice-one-file")
    create_stream(rabbitmq_url, s, 150)
    cfg = config(rabbitmq_url, tmp_path, s, max_offsets=100, sink="iceberg", store_offset=False)
    for run in ("r1", "r2"):
        run_batch(cfg, run=rid("t", run=run), ledger=ledger, broker=client, runner=runner)
    first, second = sorted(ledger.ranges(PIPE), key=lambda r: r.start)
    assert (first.start, first.end, second.start, second.end) == (0, 100, 100, 150)
    assert audit(ledger, PIPE).clean
    cat = load_catalog(catalog_properties(None, ledger_url=ledger.url, output_root=str(tmp_path)))
    files = [t.file.file_path for t in cat.load_table(default_iceberg_table(PIPE)).scan().plan_files()]
    assert second.output is not None
    (victim,) = [f for f in files if Path(second.output).as_uri() in f]
    Path(victim.removeprefix("file://")).unlink()
    report = audit(ledger, PIPE)
    assert {(v.start, v.end) for v in report.violations} == {(100, 150)}, report.to_text()
    (table_finding,) = [v for v in report.violations if v.kind == ViolationKind.OUTPUT_MISSING]
    assert victim.rsplit("/", 1)[1] in table_finding.detail, report.to_text()
    capsys.readouterr()
    assert cli(["ledger", "audit", "--db", ledger.url, "--pipeline", PIPE]) == 1
    out = capsys.readouterr().out
    assert victim.rsplit("/", 1)[1] in out and "[100, 150)" in out, out
    assert "[0, 100)" not in out, out
