"""Issue 30, the table sinks' seams (defects 7 and 10): against the real RabbitMQ brokers, local
Spark, a real ledger, pyiceberg (SQL catalog in the ledger's database) and delta-rs.

* an audit of a table whose data files were deleted is a finding in the report and the JSON (exit 1),
  never a traceback;
* a Delta table at a URI no file system of the batch reaches is refused in one line before anything
  is claimed, and the local file system is never asked about a URI;
* (defect 7) a new epoch, or a second broker, into one table: clean, and every row names both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchError, run_batch
from streamledger.ledger import Ledger, ViolationKind
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.spark.helpers import create_stream

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.timeout(300)]

PIPE = "p-seams"


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_an_audit_of_a_table_whose_data_files_were_deleted_is_a_finding_not_a_traceback(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Defect 10: someone deletes a published range's data files; the table still lists them, so its
    scan fails. ``streamledger ledger audit --json`` prints the report with the finding (naming the
    table and the range) and exits 1; the text report too."""
    from streamledger.cli import main

    s = stream_name(f"gone-{sink}")
    create_stream(rabbitmq_url, s, 30)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink, pipeline=PIPE, store_offset=False)
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    (r,) = [r for r in ledger.ranges(PIPE) if r.records]
    assert r.output is not None and r.sink_table is not None
    gone = sorted(Path(r.output).glob("*.parquet"))
    assert gone
    for f in gone:
        f.unlink()
    capsys.readouterr()
    argv = ["ledger", "audit", "--ledger", ledger.url, "--pipeline", PIPE]
    assert main([*argv, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    where = r.sink_table.partition(":")[2]
    found = [v for v in out["violations"]
             if v["range_id"] == r.id and v["detail"].startswith(f"{sink} table {where}")]
    assert [v["kind"] for v in found] == [ViolationKind.OUTPUT_MISSING.value], [v["detail"] for v in found]
    detail = found[0]["detail"]
    # both formats list every data file (Iceberg's manifests, Delta's add actions): the file is named
    said = f"data file(s) are missing: {gone[0].as_uri()}"
    assert said in detail and "\n" not in detail, detail
    assert main(argv) == 1
    assert said in capsys.readouterr().out


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_a_deleted_range_s_files_are_a_finding_for_that_range_only(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path,
) -> None:
    """Two ranges in one table, the first one's data files deleted: the audit names that range and
    its files, and still checks the other range's rows (clean), rather than calling every range
    recorded in the table missing because one scan failed."""
    from streamledger.batch.proof import audit
    from tests.integration.spark.helpers import publish

    s = stream_name(f"one-gone-{sink}")
    create_stream(rabbitmq_url, s, 30)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink, pipeline=PIPE, store_offset=False)
    run_batch(cfg, run=rid("t", "r1"), ledger=ledger, broker=client, runner=runner)
    publish(rabbitmq_url, s, 20, start=30)
    run_batch(cfg, run=rid("t", "r2"), ledger=ledger, broker=client, runner=runner)
    first, second = sorted((r for r in ledger.ranges(PIPE) if r.records), key=lambda r: r.start)
    assert (first.start, first.end, second.start, second.end) == (0, 30, 30, 50)
    gone = sorted(Path(str(first.output)).glob("*.parquet"))
    assert gone
    for f in gone:
        f.unlink()
    report = audit(ledger, PIPE)
    assert not report.clean
    # the range's directory check (its manifest lists the files) and the table's both speak of it
    assert {v.range_id for v in report.violations} == {first.id}, [v.detail for v in report.violations]
    (v,) = [v for v in report.violations if v.kind is ViolationKind.OUTPUT_MISSING]
    assert f"data file(s) are missing: {gone[0].as_uri()}" in v.detail and "\n" not in v.detail, v.detail


@pytest.mark.parametrize("table", ["memory:///lake/events", "foo://bucket/events", "s3:///events"])
def test_a_delta_table_at_a_uri_no_file_system_reaches_is_refused_in_one_line_before_claiming(
    table: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect 10: a Delta location with a scheme delta-rs may know but no file system of the batch
    writes (``memory://``), an unknown scheme, or an object-store URI naming no bucket: one line naming
    the table and the reason, nothing claimed, nothing created locally (no ValueError from the local
    file system asked about a URI)."""
    s = stream_name("uri")
    create_stream(rabbitmq_url, s, 5)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BatchError) as caught:
        cfg = config(rabbitmq_url, tmp_path / "out", s, sink="delta", table=table, pipeline=PIPE)
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    msg = str(caught.value)
    assert f"delta table {table}: " in msg and "\n" not in msg, msg
    assert ledger.ranges(PIPE) == []
    assert client.query_offset(s, PIPE) is None
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("ledger.sqlite")] == []


# -- defect 7: what tells epochs and brokers apart ------------------------------------------------
# Reproduced first (the audit found each new-epoch/second-broker row a duplicate); the table sinks
# now stamp every row with its broker and epoch and the table audit matches rows by them.



def rows_of(sink: str, ledger: Ledger, root: Path) -> Any:
    r = next(r for r in ledger.ranges(PIPE) if r.sink_table)
    assert r.sink_table is not None
    kind, _, where = r.sink_table.partition(":")
    if kind == "delta":
        from deltalake import DeltaTable

        return DeltaTable(where).to_pyarrow_table()
    from streamledger.batch.sinks.iceberg import catalog_properties, load_catalog

    cat = load_catalog(catalog_properties(None, ledger_url=ledger.url, output_root=str(root)))
    return cat.load_table(where).scan().to_arrow()


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_a_new_epoch_into_the_same_table_audits_clean_and_its_rows_are_told_apart(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path,
) -> None:
    """A stream read into a table, deleted and re-created, ``new-epoch``, read again into the same
    table: the audit (ledger, table, broker) is clean, and every row says which epoch it is of."""
    from streamledger.batch.proof import audit
    from streamledger.ledger import SourceRef

    s = stream_name(f"epoch-{sink}")
    create_stream(rabbitmq_url, s, 40)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink, pipeline=PIPE)
    run_batch(cfg, run=rid("t", run="r1"), ledger=ledger, broker=client, runner=runner)
    client.delete_stream(s)
    client.create_stream(s)
    client.publish(s, [b"new-%d" % i for i in range(25)])
    (old,) = [r for r in ledger.ranges(PIPE) if r.records]
    ledger.new_epoch(PIPE, SourceRef(old.source.broker, s), reason="stream re-created")
    run_batch(cfg, run=rid("t", run="r2"), ledger=ledger, broker=client, runner=runner)
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
    rows = rows_of(sink, ledger, tmp_path)
    assert rows.num_rows == 65
    epochs = sorted(zip(rows.column("epoch").to_pylist(), rows.column("offset").to_pylist(), strict=True))
    assert epochs == sorted([(0, i) for i in range(40)] + [(1, i) for i in range(25)])


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_two_brokers_writing_one_table_audit_clean_and_their_rows_are_told_apart(
    sink: str, ledger: Ledger, runner: CountingRunner, broker_43: Any, broker_40: Any, stream_name: Any,
    tmp_path: Path,
) -> None:
    """One pipeline reads a stream of one name on the 4.3 and on the 4.0 server into one table: the
    audit is clean (neither broker's rows are the other's duplicates) and each row names its broker."""
    from streamledger.batch.proof import audit

    s = stream_name(f"two-{sink}")
    counts = {broker_43.url: 30, broker_40.url: 20}
    identities = {}
    for i, (url, n) in enumerate(counts.items()):
        create_stream(url, s, n)
        with StreamClient.connect(url) as broker:
            cfg = config(url, tmp_path, s, sink=sink, pipeline=PIPE)
            result = run_batch(cfg, run=rid("t", run=f"r{i}"), ledger=ledger, broker=broker, runner=runner)
            identities[result.partitions[0].records] = next(
                r.source.broker for r in ledger.ranges(PIPE) if r.id == result.partitions[0].range_id)
    report = audit(ledger, PIPE)
    assert report.clean, report.to_text()
    rows = rows_of(sink, ledger, tmp_path)
    by_broker = {b: rows.column("broker").to_pylist().count(b) for b in identities.values()}
    assert by_broker == {identities[30]: 30, identities[20]: 20}


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_a_table_made_before_the_broker_and_epoch_columns_gets_them_and_audits_clean(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path,
) -> None:
    """A table with only the job's columns (as the sinks made them before): the next commit adds
    ``broker`` and ``epoch`` as nullable columns, the batch's rows carry them, the audit is clean."""
    import pyarrow as pa

    from streamledger.batch.proof import audit
    from streamledger.batch.sinks.iceberg import catalog_properties, load_catalog
    from streamledger.spark.arrow import ARROW_SCHEMA

    s = stream_name(f"old-{sink}")
    create_stream(rabbitmq_url, s, 12)
    if sink == "delta":
        from deltalake import DeltaTable

        table = str(tmp_path / "old-delta")
        DeltaTable.create(table, ARROW_SCHEMA)
    else:
        table = "old.events"
        cat = load_catalog(catalog_properties(None, ledger_url=ledger.url, output_root=str(tmp_path)))
        cat.create_namespace_if_not_exists("old")
        cat.create_table(table, schema=ARROW_SCHEMA)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink, table=table, pipeline=PIPE)
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
    rows = rows_of(sink, ledger, tmp_path)
    assert rows.schema.field("broker").type == pa.string()
    assert pa.types.is_int64(rows.schema.field("epoch").type)
    (r,) = [r for r in ledger.ranges(PIPE) if r.records]
    assert set(zip(rows.column("broker").to_pylist(), rows.column("epoch").to_pylist(), strict=True)) == {
        (r.source.broker, 0)}
    assert sorted(rows.column("offset").to_pylist()) == list(range(12))
