"""Red team of issue 42 (the user's transform inside the proven batch): can a transform make the audit
CLEAN over missing or doubled data, write outside the output root, or stall? Against the real
RabbitMQ broker, local Spark and the ledgers. A test marked ``xfail(strict=True)`` documents a defect
found (it fails loudly once fixed); the plain ones show where the product holds."""

from __future__ import annotations

import shutil
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchError, run_batch
from streamledger.batch.proof import audit
from streamledger.batch.spec import SpecError
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.transform import DEAD_LETTER_DIR, LINEAGE_COLUMNS
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.batch.test_transforms import (
    SCHEMA,
    broker_bodies,
    decoded,
    publish_orders,
    rows_of,
)

pytestmark = pytest.mark.timeout(300)

PIPE = "p-attack"


def published(ledger: Ledger, pipe: str = PIPE) -> list[Any]:
    return [r for r in ledger.ranges(pipe) if r.status == RangeStatus.COMMITTED and r.records]


def json_cfg(url: str, root: Path, stream: str, **kw: Any) -> Any:
    base: dict[str, Any] = dict(
        pipeline=PIPE, body_format="json", body_schema=SCHEMA, on_bad_record="dead_letter"
    )
    base.update(kw)
    return config(url, root, stream, **base)


# -- writing outside the output root ------------------------------------------------------------


def test_a_sql_command_is_refused_and_writes_nothing_outside_the_output_root(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("atk-insert")
    publish_orders(rabbitmq_url, s, 20)
    elsewhere = tmp_path / "elsewhere"
    cfg = json_cfg(
        rabbitmq_url,
        tmp_path / "lake",
        s,
        sql=f"INSERT OVERWRITE DIRECTORY '{elsewhere}' USING parquet SELECT * FROM records",
    )
    try:
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    except (SpecError, BatchError):
        pass
    outside = rows_of(str(elsewhere)) if elsewhere.exists() else []
    committed = [(r.start, r.end, r.records, r.rows_out, r.dead_letter) for r in published(ledger)]
    verdict = audit(ledger, PIPE, broker=client, deep=True).clean if committed else None
    assert not elsewhere.exists(), (
        f"{len(outside)} rows written outside the output root at {elsewhere}; "
        f"committed {committed}; deep audit clean: {verdict}"
    )
    assert not committed


# -- stalls / a pipeline that can never progress ------------------------------------------------


@pytest.mark.parametrize(
    "sql", ["SELECT order_id FROM records WHERE false", "SELECT order_id FROM records LIMIT 0"]
)
def test_a_transform_that_keeps_nothing_still_commits_its_dead_letters(
    sql: str,
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("atk-empty")
    publish_orders(rabbitmq_url, s, 20)
    cfg = json_cfg(rabbitmq_url, tmp_path, s, sql=sql)
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    [r] = published(ledger)
    bad = sum(1 for b in broker_bodies(rabbitmq_url, s, 0, 20) if decoded(b) is None)
    assert (r.rows_out, r.dead_letter) == (0, bad)
    assert audit(ledger, PIPE, broker=client, deep=True).clean


def test_a_limit_with_dead_letters_still_sets_every_bad_record_aside(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    """LIMIT stops the rows' pass early: the dead letters' pass must run anyway (not skipped)."""
    s = stream_name("atk-limit")
    publish_orders(rabbitmq_url, s, 40)
    cfg = json_cfg(rabbitmq_url, tmp_path, s, sql="SELECT order_id FROM records LIMIT 2")
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    [r] = published(ledger)
    bodies = broker_bodies(rabbitmq_url, s, 0, 40)
    bad = sorted(i for i, b in enumerate(bodies) if decoded(b) is None)
    assert r.rows_out == 2 and len(rows_of(r.output)) == 2
    assert sorted(d["offset"] for d in rows_of(r.output, DEAD_LETTER_DIR)) == bad == sorted(bad)
    assert r.dead_letter == len(bad)
    assert audit(ledger, PIPE, broker=client, deep=True).clean


# -- the directory audit ------------------------------------------------------------------------


def test_a_deleted_dead_letter_directory_is_a_finding_of_the_deep_audit(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    """Without --deep the dead letters are not looked at (as documented); with it, their loss is a
    finding, not a crash of the audit."""
    s = stream_name("atk-dead-gone")
    publish_orders(rabbitmq_url, s, 30)
    cfg = json_cfg(rabbitmq_url, tmp_path, s, sql="SELECT order_id FROM records")
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    [r] = published(ledger)
    assert r.dead_letter and audit(ledger, PIPE, broker=client, deep=True).clean
    shutil.rmtree(Path(r.output) / DEAD_LETTER_DIR)
    assert audit(ledger, PIPE, broker=client).clean  # documented: only --deep counts dead letters
    report = audit(ledger, PIPE, broker=client, deep=True)
    assert [v.range_id for v in report.violations] == [r.id], report.to_text()


@pytest.mark.xfail(
    strict=True,
    reason="the deep directory audit checks file names, row counts and lineage only: a "
    "data file rewritten under its own name with one row doubled and another dropped is CLEAN",
)
def test_a_rewritten_data_file_with_a_row_doubled_and_one_dropped_is_found_by_the_deep_audit(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    """Same file name, same row count, same lineage: one order doubled, one missing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    s = stream_name("atk-swap-dir")
    publish_orders(rabbitmq_url, s, 30)
    cfg = json_cfg(rabbitmq_url, tmp_path, s, sql="SELECT order_id, amount FROM records")
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    [r] = published(ledger)
    [f] = sorted(Path(r.output).glob("*.parquet"))
    t = pq.read_table(f)
    swapped = pa.concat_tables([t.slice(0, 1), t.slice(0, t.num_rows - 1)])  # row 0 twice, last row gone
    pq.write_table(swapped, f)
    assert swapped.num_rows == r.rows_out
    report = audit(ledger, PIPE, broker=client, deep=True)
    assert not report.clean, "the deep audit is CLEAN over a doubled and a missing row"


# -- retries after the published output was deleted by hand (reread_committed) -------------------


def _delete_output_and_retry(cfg: Any, ledger: Ledger, client: StreamClient, runner: CountingRunner) -> Any:
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    [r] = published(ledger)
    shutil.rmtree(r.output)
    return r


def test_a_retry_with_a_changed_sql_does_not_remake_a_deleted_output(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("atk-reread-sql")
    publish_orders(rabbitmq_url, s, 20)
    cfg = json_cfg(rabbitmq_url, tmp_path, s, sql="SELECT order_id, amount FROM records")
    _delete_output_and_retry(cfg, ledger, client, runner)
    changed = replace(cfg, sql="SELECT order_id, amount * 3 AS amount FROM records")
    with pytest.raises(BatchError, match="cannot be made again"):
        run_batch(changed, run=rid("t", try_number=2), ledger=ledger, broker=client, runner=runner)


def test_a_retry_with_a_function_whose_behaviour_changed_does_not_remake_a_deleted_output(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The function's module edited between the commit and a retry that must re-make a deleted output
    (a constant of the module changed, the function's own lines not): the fingerprint, which hashes
    the whole module's source, changes, and the retry refuses to make the range again."""
    import importlib
    import sys

    code = tmp_path / "code"
    code.mkdir()
    module = code / "attack_scaled.py"
    module.write_text((Path(__file__).with_name("attack_transforms.py")).read_text())
    monkeypatch.syspath_prepend(str(code))
    s = stream_name("atk-reread-fn")
    publish_orders(rabbitmq_url, s, 20)
    cfg = json_cfg(rabbitmq_url, tmp_path, s, transform="attack_scaled:scaled")
    first_fp = cfg.transformation().fingerprint()
    r = _delete_output_and_retry(cfg, ledger, client, runner)
    module.write_text(module.read_text().replace("FACTOR = 2", "FACTOR = 1000"))
    importlib.reload(sys.modules["attack_scaled"])  # what a new task process imports
    assert cfg.transformation().fingerprint() != first_fp
    with pytest.raises(BatchError, match="cannot be made again"):
        run_batch(cfg, run=rid("t", try_number=2), ledger=ledger, broker=client, runner=runner)
    assert not Path(r.output).exists()  # nothing made by the other transform
    assert not audit(ledger, PIPE, broker=client).clean  # the output is still missing: a finding


def test_a_retry_of_a_random_filter_after_the_output_was_deleted_is_never_clean_with_other_counts(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    """rand() in a filter: the re-made output has another row count than the ledger's rows_out;
    either the retry refuses it or the audit reports it (never CLEAN over other rows)."""
    s = stream_name("atk-reread-rand")
    publish_orders(rabbitmq_url, s, 200)
    cfg = json_cfg(rabbitmq_url, tmp_path, s, sql="SELECT order_id FROM records WHERE rand() < 0.5")
    r = _delete_output_and_retry(cfg, ledger, client, runner)
    try:
        run_batch(cfg, run=rid("t", try_number=2), ledger=ledger, broker=client, runner=runner)
    except BatchError:
        return
    n = len(rows_of(r.output))
    report = audit(ledger, PIPE, broker=client, deep=True)
    assert report.clean == (n == r.rows_out), (n, r.rows_out, report.to_text())


# -- refused before the claim ------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        "order_id STRING, offset BIGINT",
        "order_id STRING, body STRING",
        "order_id STRING, _corrupt_record STRING",
    ],
)
def test_a_body_field_named_like_a_source_or_corrupt_column_is_refused_before_the_claim(
    schema: str,
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("atk-clash")
    publish_orders(rabbitmq_url, s, 5)
    cfg = json_cfg(
        rabbitmq_url, tmp_path, s, body_schema=schema, on_bad_record="null", sql="SELECT * FROM records"
    )
    with pytest.raises(SpecError):
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    assert ledger.ranges(PIPE) == [] and runner.calls == 0


def test_null_mode_keeps_corrupt_bodies_in_the_users_output_and_counts_every_record(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("atk-null")
    publish_orders(rabbitmq_url, s, 30)
    cfg = json_cfg(
        rabbitmq_url,
        tmp_path,
        s,
        on_bad_record="null",
        sql="SELECT offset AS o, order_id, _corrupt_record FROM records",
    )
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    [r] = published(ledger)
    bodies = broker_bodies(rabbitmq_url, s, 0, 30)
    got = {g["o"]: g for g in rows_of(r.output)}
    assert sorted(got) == list(range(30)) and r.rows_out == 30 and r.dead_letter is None
    for i, b in enumerate(bodies):
        assert (got[i]["_corrupt_record"] is not None) == (decoded(b) is None), (i, b, got[i])
    assert audit(ledger, PIPE, broker=client, deep=True).clean


# -- the table sinks ---------------------------------------------------------------------------


def delta_rows(root: Path, pipe: str = PIPE) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(str(root / pipe)).to_pyarrow_table()


def delta_batch(
    url: str,
    root: Path,
    stream: str,
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    n: int = 30,
    **kw: Any,
) -> Any:
    publish_orders(url, stream, n)
    cfg = json_cfg(url, root, stream, sink="delta", sql="SELECT order_id, amount FROM records", **kw)
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
    return cfg


def test_a_row_doubled_and_another_deleted_in_a_delta_table_is_a_finding(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable, write_deltalake

    delta_batch(rabbitmq_url, tmp_path, stream_name("atk-swap-delta"), ledger, client, runner)
    table = delta_rows(tmp_path)
    ids = sorted(table.column("order_id").to_pylist())
    keep, drop = ids[0], ids[-1]
    dt = DeltaTable(str(tmp_path / PIPE))
    dt.delete(f"order_id = '{drop}'")
    import pyarrow.compute as pc

    write_deltalake(dt, table.filter(pc.equal(table["order_id"], keep)), mode="append")
    after = delta_rows(tmp_path).column("order_id").to_pylist()
    assert after.count(keep) == 2 and drop not in after and len(after) == len(ids)
    report = audit(ledger, PIPE, broker=client)
    assert not report.clean, f"CLEAN over {keep} twice and {drop} missing"


def test_rows_with_null_lineage_cannot_be_planted_in_a_delta_table(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    """The lineage columns are declared non-nullable in the table: Delta itself refuses the plant."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    delta_batch(rabbitmq_url, tmp_path, stream_name("atk-null-lineage"), ledger, client, runner)
    table = delta_rows(tmp_path).slice(0, 2)
    for c in (*LINEAGE_COLUMNS, "broker", "epoch"):
        i = table.schema.get_field_index(c)
        table = table.set_column(
            i, table.schema.field(i), pa.nulls(table.num_rows, table.schema.field(i).type)
        )
    with pytest.raises(Exception, match="non-nullable"):
        write_deltalake(DeltaTable(str(tmp_path / PIPE)), table, mode="append")
    assert audit(ledger, PIPE, broker=client).clean


def test_a_data_file_deleted_under_a_delta_table_is_a_finding_not_a_crash(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    delta_batch(rabbitmq_url, tmp_path, stream_name("atk-file-gone"), ledger, client, runner)
    files = sorted(p for p in (tmp_path / PIPE).rglob("*.parquet") if DEAD_LETTER_DIR not in p.parts)
    assert len(files) == 1
    files[0].unlink()
    try:
        report = audit(ledger, PIPE, broker=client)
    except Exception as exc:
        pytest.fail(f"the audit crashed instead of reporting: {type(exc).__name__}: {str(exc)[:200]}")
    assert not report.clean, report.to_text()


def test_deleted_dead_letters_of_a_delta_range_are_a_finding_of_the_deep_audit(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    delta_batch(rabbitmq_url, tmp_path, stream_name("atk-dead-delta"), ledger, client, runner)
    [r] = published(ledger)
    dead = [p for p in (tmp_path / PIPE).rglob(DEAD_LETTER_DIR) if p.is_dir()]
    assert r.dead_letter and len(dead) == 1
    shutil.rmtree(dead[0])
    report = audit(ledger, PIPE, broker=client, deep=True)
    assert not report.clean, f"CLEAN with --deep though the {r.dead_letter} dead letters are gone"


def test_rows_of_a_failed_attempt_in_the_table_are_a_finding(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    """The first attempt dies after its job and verify (its rows, lineage stamped, are in staging); the
    retry commits; the dead attempt's files are then added to the table by hand."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    from tests.integration.batch.helpers import Killed

    s = stream_name("atk-failed-attempt")
    publish_orders(rabbitmq_url, s, 30)
    cfg = json_cfg(rabbitmq_url, tmp_path, s, sink="delta", sql="SELECT order_id, amount FROM records")

    def die(name: str, _batch: Any) -> None:
        if name == "read":
            raise Killed(name)

    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner, on_step=die)
    dead = [pq.read_table(p) for p in sorted(tmp_path.rglob("*.parquet")) if DEAD_LETTER_DIR not in p.parts]
    assert dead, "the dead attempt left no rows to plant"
    run_batch(cfg, run=rid("t", try_number=2), ledger=ledger, broker=client, runner=runner)
    assert audit(ledger, PIPE, broker=client).clean
    dt = DeltaTable(str(tmp_path / PIPE))
    schema = dt.to_pyarrow_table().schema
    import pyarrow as pa

    planted = pa.concat_tables(
        [t.select([c for c in t.column_names if c in schema.names]) for t in dead], promote_options="default"
    )
    for c in ("broker", "epoch"):  # the sink stamps these when it adds the files: as it would have
        if c not in planted.column_names:
            planted = planted.append_column(
                c, dt.to_pyarrow_table().column(c).slice(0, 1).take([0] * planted.num_rows)
            )
    write_deltalake(dt, planted.select(schema.names).cast(schema), mode="append")
    report = audit(ledger, PIPE, broker=client)
    assert not report.clean, "CLEAN over a failed attempt's rows in the table"


def test_a_raw_pipeline_cannot_land_in_a_transforms_table(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    """The other direction is refused (docs: 'A transform cannot land in a table of raw records')."""
    s = stream_name("atk-raw-into-tx")
    delta_batch(rabbitmq_url, tmp_path, s, ledger, client, runner)
    before = delta_rows(tmp_path).num_rows
    raw = config(
        rabbitmq_url,
        tmp_path / "raw-root",
        s,
        pipeline="p-attack-raw",
        sink="delta",
        table=str(tmp_path / PIPE),
    )
    try:
        run_batch(raw, run=rid("raw"), ledger=ledger, broker=client, runner=runner)
    except (SpecError, BatchError):
        pass
    after = delta_rows(tmp_path)
    report_tx = audit(ledger, PIPE, broker=client)
    report_raw = audit(ledger, "p-attack-raw", broker=client)
    assert after.num_rows == before, (
        f"the raw pipeline added {after.num_rows - before} rows to the transform's "
        f"table; transform audit clean: {report_tx.clean}; raw audit clean: "
        f"{report_raw.clean}"
    )


# -- pinned intervals, epochs -------------------------------------------------------------------


def test_a_pinned_retry_reading_two_pieces_of_one_stream_lands_each_records_rows_once(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    """Interval i1 [t0, t1) holds [0, 150); its first attempt fails; a narrower run commits [50, 100);
    i1's retry reads [0, 50) and [100, 150) of one stream in one batch, through the transform: each
    offset's row lands once, under its own range's lineage, and the deep audit is clean."""
    import time
    from datetime import UTC, datetime

    from tests.integration.batch.helpers import pinned_interval
    from tests.integration.spark.helpers import publish

    s = stream_name("atk-pinned")
    with StreamClient.connect(rabbitmq_url) as c:
        c.create_stream(s)
    sql = "SELECT offset AS o, CAST(body AS STRING) AS b FROM records"
    marks = [datetime.now(UTC)]
    for wave in range(3):
        time.sleep(0.3 if wave == 0 else 0.6)
        publish(rabbitmq_url, s, 50, start=50 * wave, batch_size=10)
        time.sleep(0.6)
        marks.append(datetime.now(UTC))
    time.sleep(0.6)
    publish(rabbitmq_url, s, 5, start=150, batch_size=5)
    t0, ta, tb, t1 = marks
    runner.die = RuntimeError("executor lost")
    with pytest.raises(RuntimeError, match="executor lost"):
        run_batch(
            pinned_interval(PIPE, rabbitmq_url, tmp_path, s, t0, t1, sql=sql),
            run=rid("read", run="i1"),
            ledger=ledger,
            broker=client,
            runner=runner,
        )
    run_batch(
        pinned_interval(PIPE, rabbitmq_url, tmp_path, s, ta, tb, sql=sql),
        run=rid("read", run="manual__inner"),
        ledger=ledger,
        broker=client,
        runner=runner,
    )
    run_batch(
        pinned_interval(PIPE, rabbitmq_url, tmp_path, s, t0, t1, sql=sql),
        run=rid("read", run="i1", try_number=2),
        ledger=ledger,
        broker=client,
        runner=runner,
    )
    offsets: list[int] = []
    for r in published(ledger):
        got = rows_of(r.output)
        assert {(g["streamledger_start"], g["streamledger_end"]) for g in got} == {(r.start, r.end)}
        assert all(r.start <= g["o"] < r.end for g in got) and r.rows_out == len(got)
        offsets += [g["o"] for g in got]
    assert sorted(offsets) == list(range(150))
    report = audit(ledger, PIPE, broker=client, deep=True)
    assert report.clean, report.to_text()


def test_a_recreated_stream_in_a_new_epoch_lands_beside_the_old_one_in_the_table(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    """Both epochs' ranges have the same (stream, start, end): the table's lineage keeps them apart by
    epoch; the audit counts each; a row of the old epoch doubled is a finding of the old range."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    s = stream_name("atk-epoch")
    cfg = delta_batch(rabbitmq_url, tmp_path, s, ledger, client, runner, n=20)
    [old] = published(ledger)
    client.delete_stream(s)
    publish_orders(rabbitmq_url, s, 20)
    ledger.mark_replaced(PIPE, old.source, "deleted and re-created")
    assert ledger.new_epoch(PIPE, old.source, reason="re-created") == (0, 1)
    run_batch(cfg, run=rid("t", run="r2"), ledger=ledger, broker=client, runner=runner)
    ranges = published(ledger)
    assert sorted((r.start, r.end) for r in ranges) == [(0, 20), (0, 20)]
    table = delta_rows(tmp_path)
    assert sorted(set(table.column("epoch").to_pylist())) == [0, 1]
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
    old_rows = table.filter(pc.equal(table["epoch"], 0)).slice(0, 1)
    write_deltalake(DeltaTable(str(tmp_path / PIPE)), old_rows, mode="append")
    report = audit(ledger, PIPE, broker=client)
    assert not report.clean, "CLEAN over a doubled row of the old epoch"


# -- streaming, relative paths ---------------------------------------------------------------


def test_a_streaming_query_refuses_transform_settings_it_does_not_run(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    s = stream_name("atk-streaming")
    publish_orders(rabbitmq_url, s, 10)
    seen: list[list[str]] = []

    def each(df: Any, _batch_id: int) -> None:
        seen.append(df.columns)

    reader = (
        spark.readStream.format("rabbitmq_stream")
        .option("url", rabbitmq_url)
        .option("stream", s)
        .option("startingOffsets", "earliest")
        .option("sql", "SELECT order_id FROM records")
        .option("bodyFormat", "json")
        .option("bodySchema", SCHEMA)
        .option("body_format", "json")
        .option("transform", "tests.integration.batch.order_transforms:items")
    )
    try:
        q = (
            reader.load()
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(240)
        failed = q.exception()
    except Exception as exc:
        failed = exc
    assert failed is not None and "sql" in str(failed), (
        f"accepted and ignored: the batches had columns {seen}"
    )


def test_a_relative_sql_file_is_read_from_the_working_directory_when_the_spec_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rabbitmq_url: str
) -> None:
    """Where a relative sql_file is looked for: the process's working directory (not the output root nor
    a DAG folder); the SQL is read when the spec is made and again per transformation()."""
    (tmp_path / "q.sql").write_text("SELECT order_id FROM records")
    monkeypatch.chdir(tmp_path)
    cfg = json_cfg(rabbitmq_url, tmp_path / "lake", "s", sql_file="q.sql")
    first = cfg.transformation()
    assert first is not None and first.sql == "SELECT order_id FROM records"
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    with pytest.raises(Exception, match="cannot be read"):
        cfg.transformation()


# -- a stall (keep last: the stuck thread holds the view lock of the process) ----------------------


def test_a_function_returning_another_sessions_dataframe_does_not_stall_the_batch(
    ledger: Ledger,
    client: StreamClient,
    runner: CountingRunner,
    rabbitmq_url: str,
    stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("atk-other-session")
    publish_orders(rabbitmq_url, s, 20)
    cfg = json_cfg(
        rabbitmq_url, tmp_path, s, transform="tests.integration.batch.attack_transforms:other_session"
    )
    outcome: list[Any] = []

    def go() -> None:
        try:
            outcome.append(run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    worker.join(150)
    if worker.is_alive():
        import sys
        import traceback

        frames = traceback.extract_stack(sys._current_frames()[worker.ident])
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-6:]))
        pytest.fail(f"run_batch still running after 150 s, at {where}")
    # Ended: the rows are not the range's records at all, and the audit cannot know (documented limit).
