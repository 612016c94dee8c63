"""The user's Spark logic inside the proven batch (issue 42), against the real RabbitMQ broker, local
Spark and both ledgers: JSON bodies decoded into typed columns, bad records failed / nulled / sent to
the dead letter, SQL and function transforms (filter, aggregate, explode) per range, lineage stamped
by the job, the ledger recording rows written per range, and the audit proving them.

The expected output is recomputed independently: the broker's records read with the client and
decoded with :mod:`json` in plain Python, never with the product's code.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from streamledger.batch import BatchError, run_batch
from streamledger.batch.proof import audit
from streamledger.batch.spec import SpecError
from streamledger.ledger import Ledger, RangeStatus, ViolationKind
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.transform import DEAD_LETTER_DIR, LINEAGE_COLUMNS
from tests.integration.batch.helpers import CountingRunner, Killed, config, rid

pytestmark = pytest.mark.timeout(300)

PIPE = "p-transform"
SCHEMA = "order_id STRING, customer STRING, amount DECIMAL(12,2), currency STRING, status STRING"


def order(i: int) -> bytes:
    """Order ``i`` as JSON; every seventh is malformed on purpose, every fifth a JSON array."""
    if i % 7 == 3:
        return b'{"order_id": "o-broken", "amount": '  # cut short
    if i % 5 == 4:
        return b"[1, 2]"
    status = ("paid", "open", "refunded")[i % 3]
    data = {"order_id": f"o-{i:05d}", "customer": f"c-{i % 4}", "amount": f"{(i * 37) % 1000}.{i % 100:02d}",
            "currency": ("EUR", "USD")[i % 2], "status": status, "items": [f"sku-{i}", f"sku-{i + 1}"]}
    return json.dumps(data).encode()


def publish_orders(url: str, stream: str, n: int) -> None:
    with StreamClient.connect(url) as client:
        client.create_stream(stream)
        assert client.publish(stream, [order(i) for i in range(n)]).confirmed == n


def broker_bodies(url: str, stream: str, start: int, end: int) -> list[bytes]:
    """The range's bodies as the client reads them (the reference: not the Spark job)."""
    with StreamClient.connect(url) as client:
        return [bytes(b) for batch in client.read_range(stream, start, end) for b in batch.bodies]


def decoded(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def rows_of(location: str, subdir: str = "") -> list[dict[str, Any]]:
    path = Path(location) / subdir if subdir else Path(location)
    files = [str(p) for p in sorted(path.glob("*.parquet"))]
    return ds.dataset(files, format="parquet").to_table().to_pylist() if files else []


def published(ledger: Ledger) -> list[Any]:
    return [r for r in ledger.ranges(PIPE) if r.status == RangeStatus.COMMITTED and r.records]


def test_json_orders_land_as_typed_rows_with_bad_records_in_the_dead_letter(
        any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
        stream_name: Any, tmp_path: Path) -> None:
    """SQL over the decoded view: typed columns, a derived column, a filter; the malformed bodies go
    to the range's dead letter; rows, dead letters and the transform are recorded per range; what the
    directory holds equals plain Python's reading of the broker's records; the audit is clean."""
    s = stream_name("orders")
    publish_orders(rabbitmq_url, s, 120)
    sql = ("SELECT order_id, customer, amount, currency, amount * 2 AS doubled, offset AS source_offset "
           "FROM records WHERE status <> 'refunded'")
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE, max_offsets=70, body_format="json",
                 body_schema=SCHEMA, on_bad_record="dead_letter", sql=sql)
    for run in ("r1", "r2"):
        result = run_batch(cfg, run=rid("t", run=run), ledger=any_ledger, broker=client, runner=runner)
        assert all(p.rows is not None for p in result.partitions if p.records)
    ranges = published(any_ledger)
    assert [r.start for r in ranges] == [0, 70]
    fingerprint = cfg.transformation().fingerprint()  # type: ignore[union-attr]
    for r in ranges:
        bodies = broker_bodies(rabbitmq_url, s, r.start, r.end)
        good = [(r.start + i, d) for i, b in enumerate(bodies) if (d := decoded(b)) is not None]
        want = sorted((d["order_id"], Decimal(d["amount"]) * 2, o) for o, d in good
                      if d["status"] != "refunded")
        got = rows_of(r.output)
        assert sorted((g["order_id"], g["doubled"], g["source_offset"]) for g in got) == want
        assert {(g["streamledger_stream"], g["streamledger_start"], g["streamledger_end"]) for g in got} == {
            (s, r.start, r.end)}
        dead = rows_of(r.output, DEAD_LETTER_DIR)
        assert sorted(d["offset"] for d in dead) == sorted(
            r.start + i for i, b in enumerate(bodies) if decoded(b) is None)
        assert (r.records, r.rows_out, r.dead_letter, r.transform) == (
            len(bodies), len(want), len(dead), fingerprint)
    report = audit(any_ledger, PIPE, broker=client, deep=True)
    assert report.clean, report.to_text()
    [note] = [n for n in report.notes if n.kind == ViolationKind.TRANSFORMED]
    assert (note.start, note.end) == (0, ranges[-1].end) and fingerprint in note.detail
    assert f"{sum(r.rows_out or 0 for r in ranges)} rows written" in note.detail


def test_an_aggregate_and_an_explode_by_import_path_are_per_range(
        ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
        tmp_path: Path) -> None:
    """A function given by import path: an aggregate writes fewer rows than records read, an explode
    more; each range's rows are computed from that range's records only."""
    s = stream_name("orders-fn")
    publish_orders(rabbitmq_url, s, 60)
    schema = SCHEMA + ", items ARRAY<STRING>"
    for name, fn in (("totals", "paid_totals"), ("items", "items")):
        pipe = f"{PIPE}-{name}"
        cfg = config(rabbitmq_url, tmp_path / name, s, pipeline=pipe, max_offsets=40, body_format="json",
                     body_schema=schema, on_bad_record="null",
                     transform=f"tests.integration.batch.order_transforms:{fn}")
        for run in ("r1", "r2"):
            run_batch(cfg, run=rid(name, run=run), ledger=ledger, broker=client, runner=runner)
        ranges = [r for r in ledger.ranges(pipe) if r.records]
        assert [r.start for r in ranges] == [0, 40]
        for r in ranges:
            orders = [d for b in broker_bodies(rabbitmq_url, s, r.start, r.end) if (d := decoded(b))]
            got = rows_of(r.output)
            if name == "totals":
                want: dict[str, Decimal] = {}
                for d in orders:
                    if d["status"] == "paid":
                        want[d["currency"]] = want.get(d["currency"], Decimal(0)) + Decimal(d["amount"])
                assert {g["currency"]: g["total"] for g in got} == want
            else:
                assert sorted((g["order_id"], g["item"]) for g in got) == sorted(
                    (d["order_id"], item) for d in orders for item in d["items"])
            assert r.rows_out == len(got) and r.dead_letter is None
        report = audit(ledger, pipe, broker=client, deep=True)
        assert report.clean, report.to_text()


def test_a_bad_record_fails_the_batch_naming_stream_and_offset_and_commits_nothing(
        any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
        stream_name: Any, tmp_path: Path) -> None:
    s = stream_name("orders-fail")
    publish_orders(rabbitmq_url, s, 10)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE, body_format="json", body_schema=SCHEMA)
    with pytest.raises(BatchError) as failed:
        run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    message = str(failed.value)
    assert "\n" not in message and f"stream '{s}' offset 3" in message, message
    assert not [r for r in any_ledger.ranges(PIPE) if r.status == RangeStatus.COMMITTED]
    assert client.query_offset(s, PIPE) is None
    assert not list((tmp_path / PIPE).rglob("*.parquet")) if (tmp_path / PIPE).exists() else True


@pytest.mark.parametrize("settings, says", [
    ({"sql": "SELEC order_id FROM records"}, "SELEC"),
    ({"sql": "SELECT no_such_column FROM records"}, "no_such_column"),
    ({"body_format": "json", "body_schema": "order_id STRNG"}, "STRNG"),
    ({"transform": "tests.integration.batch.order_transforms:no_such_function"}, "does not import"),
    ({"sql": "SELECT 1 AS streamledger_start FROM records"}, "lineage"),
])
def test_a_transform_that_cannot_run_is_refused_before_anything_is_claimed(
        settings: dict[str, Any], says: str, ledger: Ledger, client: StreamClient, runner: CountingRunner,
        rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    s = stream_name("orders-refused")
    publish_orders(rabbitmq_url, s, 5)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE, **settings)
    with pytest.raises(SpecError) as refused:
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert ledger.ranges(PIPE) == [] and runner.calls == 0


@pytest.mark.parametrize("step", ["job", "read", "committed"])
def test_a_killed_transform_batch_retried_makes_one_attempts_output_visible(
        step: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
        stream_name: Any, tmp_path: Path) -> None:
    """Killed after the job, after verify, after the ledger commit: the retry runs the transform
    again on the same records (or publishes the committed attempt) and exactly one output is there."""
    s = stream_name(f"orders-kill-{step}")
    publish_orders(rabbitmq_url, s, 30)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE, body_format="json", body_schema=SCHEMA,
                 on_bad_record="dead_letter",
                 sql="SELECT order_id, amount, rand() AS not_deterministic FROM records")

    def die(name: str, _batch: Any) -> None:
        if name == step:
            raise Killed(step)

    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner, on_step=die)
    run_batch(cfg, run=rid("t", try_number=2), ledger=ledger, broker=client, runner=runner)
    [r] = published(ledger)
    bodies = broker_bodies(rabbitmq_url, s, 0, 30)
    got = rows_of(r.output)
    assert sorted(g["order_id"] for g in got) == sorted(d["order_id"] for b in bodies if (d := decoded(b)))
    assert r.rows_out == len(got)
    parquet_dirs = {p.parent for p in (tmp_path / PIPE).rglob("*.parquet") if DEAD_LETTER_DIR not in p.parts}
    assert parquet_dirs == {Path(r.output)}  # no other attempt's rows anywhere visible
    report = audit(ledger, PIPE, broker=client, deep=True)
    assert report.clean, report.to_text()


def test_the_audit_catches_a_planted_duplicate_a_deleted_output_and_a_changed_row_count(
        ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
        tmp_path: Path) -> None:
    s = stream_name("orders-audit")
    publish_orders(rabbitmq_url, s, 90)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE, max_offsets=30, body_format="json",
                 body_schema=SCHEMA, on_bad_record="dead_letter",
                 sql="SELECT order_id, amount FROM records WHERE status = 'paid'")
    for run in ("r1", "r2", "r3"):
        run_batch(cfg, run=rid("t", run=run), ledger=ledger, broker=client, runner=runner)
    first, second, third = published(ledger)
    assert audit(ledger, PIPE, broker=client, deep=True).clean
    # A duplicate: the first range's data file copied into the second range's directory.
    src = next(Path(first.output).glob("*.parquet"))
    (Path(second.output) / ("copy-" + src.name)).write_bytes(src.read_bytes())
    # A deleted output: the third range's directory gone.
    for f in sorted(Path(third.output).rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    Path(third.output).rmdir()
    report = audit(ledger, PIPE, broker=client, deep=True)
    kinds = {(v.range_id, v.kind) for v in report.violations}
    assert (second.id, ViolationKind.OUTPUT_MISMATCH) in kinds, report.to_text()
    assert (third.id, ViolationKind.OUTPUT_MISSING) in kinds, report.to_text()
    assert not [v for v in report.violations if v.range_id == first.id]
    assert set(LINEAGE_COLUMNS) <= set(rows_of(first.output)[0])


def table_of(sink: str, ledger: Ledger, root: Path, pipe: str) -> Any:
    """The table as its own library reads it (pyiceberg / deltalake)."""
    if sink == "iceberg":
        from streamledger.batch.sinks import default_iceberg_table
        from streamledger.batch.sinks.iceberg import catalog_properties, load_catalog

        cat = load_catalog(catalog_properties(None, ledger_url=ledger.url, output_root=str(root)))
        return cat.load_table(default_iceberg_table(pipe)).scan().to_arrow()
    from deltalake import DeltaTable

    return DeltaTable(str(root / pipe)).to_pyarrow_table()


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_a_transform_lands_typed_rows_in_a_table_that_evolves_with_it(
        sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
        stream_name: Any, tmp_path: Path) -> None:
    """The first batch creates the table with the transform's columns and the lineage; a later
    transform adding a column evolves the table; one changing a column's type is refused before the
    claim; the table's rows equal plain Python's reading of the broker, and the audit is clean."""
    s = stream_name(f"orders-{sink}")
    publish_orders(rabbitmq_url, s, 80)
    base = dict(pipeline=PIPE, sink=sink, max_offsets=40, body_format="json", body_schema=SCHEMA,
                on_bad_record="dead_letter")
    first = config(rabbitmq_url, tmp_path, s, **base,
                   sql="SELECT order_id, amount FROM records WHERE status = 'paid'")
    run_batch(first, run=rid("t", run="r1"), ledger=ledger, broker=client, runner=runner)
    wider = config(rabbitmq_url, tmp_path, s, **base,
                   sql="SELECT order_id, amount, currency, chunk_timestamp FROM records "
                       "WHERE status = 'paid'")
    run_batch(wider, run=rid("t", run="r2"), ledger=ledger, broker=client, runner=runner)
    rows = table_of(sink, ledger, tmp_path, PIPE).to_pylist()
    want = sorted((d["order_id"], Decimal(d["amount"])) for b in broker_bodies(rabbitmq_url, s, 0, 80)
                  if (d := decoded(b)) and d["status"] == "paid")
    assert sorted((r["order_id"], r["amount"]) for r in rows) == want
    first_range, second_range = published(ledger)
    assert {r["currency"] is None for r in rows if r["streamledger_start"] == first_range.start} == {True}
    assert None not in {r["currency"] for r in rows if r["streamledger_start"] == second_range.start}
    assert first_range.transform != second_range.transform  # which transform produced which range
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
    narrowed = config(rabbitmq_url, tmp_path, s, **base,
                      sql="SELECT order_id, CAST(amount AS STRING) AS amount FROM records")
    with pytest.raises(BatchError) as refused:
        run_batch(narrowed, run=rid("t", run="r3"), ledger=ledger, broker=client, runner=runner)
    assert "amount" in str(refused.value) and "type" in str(refused.value)
    assert len(published(ledger)) == 2 and not [r for r in ledger.ranges(PIPE)
                                                   if r.status == RangeStatus.CLAIMED]


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_nested_columns_land_batch_after_batch_and_a_changed_element_type_is_refused(
        sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
        stream_name: Any, tmp_path: Path) -> None:
    """A transform writing an array and a struct: the table its first batch made reads them back in
    its own library's widths (pyiceberg: large lists and strings), which the next batch's rows (Spark's
    plain widths) still fit; an array whose element type changes is refused before the claim."""
    s = stream_name(f"nested-{sink}")
    publish_orders(rabbitmq_url, s, 60)
    base = dict(pipeline=PIPE, sink=sink, max_offsets=30, body_format="json", body_schema=SCHEMA,
                on_bad_record="dead_letter")
    nested = ("SELECT order_id, split(customer, '-') AS parts, "
              "named_struct('status', status, 'amount', amount) AS detail FROM records")
    for n in (1, 2):
        run_batch(config(rabbitmq_url, tmp_path, s, **base, sql=nested), run=rid("t", run=f"r{n}"),
                  ledger=ledger, broker=client, runner=runner)
    assert len(published(ledger)) == 2
    rows = table_of(sink, ledger, tmp_path, PIPE).to_pylist()
    want = sorted((d["order_id"], d["customer"].split("-"), d["status"])
                  for b in broker_bodies(rabbitmq_url, s, 0, 60) if (d := decoded(b)))
    assert sorted((r["order_id"], r["parts"], r["detail"]["status"]) for r in rows) == want
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
    changed = config(rabbitmq_url, tmp_path, s, **base,
                     sql="SELECT order_id, array(1, 2) AS parts, named_struct('status', status, "
                         "'amount', amount) AS detail FROM records")
    with pytest.raises(BatchError) as refused:
        run_batch(changed, run=rid("t", run="r3"), ledger=ledger, broker=client, runner=runner)
    assert "parts" in str(refused.value) and "type" in str(refused.value)
    assert len(published(ledger)) == 2


def test_the_table_audit_catches_rows_of_a_range_the_ledger_did_not_commit(
        ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
        tmp_path: Path) -> None:
    """A data file of a committed range appended to the table a second time (a copy, as a failed
    attempt's rows would be): the audit reports the range's row count."""
    s = stream_name("orders-tbl-audit")
    publish_orders(rabbitmq_url, s, 30)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE, sink="delta", body_format="json",
                 body_schema=SCHEMA, on_bad_record="dead_letter", sql="SELECT order_id, amount FROM records")
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    assert audit(ledger, PIPE, broker=client).clean
    from deltalake import DeltaTable, write_deltalake

    dt = DeltaTable(str(tmp_path / PIPE))
    write_deltalake(dt, dt.to_pyarrow_table().slice(0, 3), mode="append")
    report = audit(ledger, PIPE, broker=client)
    [r] = published(ledger)
    assert {v.range_id for v in report.violations} == {r.id}, report.to_text()
    details = [v.detail for v in report.violations]
    assert any("rows of the range" in d and "ledger recorded" in d for d in details), details
    assert any("outside its directory" in d for d in details), details


@pytest.mark.parametrize("sink", ["directory", "delta"])
def test_a_transform_lands_on_s3_through_a_session_without_the_s3_connector(
        sink: str, s3_bucket: Any, ledger: Ledger, client: StreamClient, runner: CountingRunner,
        rabbitmq_url: str, stream_name: Any) -> None:
    """The raw landing goes through the Arrow writer, the transform's rows through Spark's writer into
    a local directory and on to the bucket through pyarrow; the audit (deep) is clean."""
    s = stream_name(f"orders-s3-{sink}")
    publish_orders(rabbitmq_url, s, 40)
    cfg = config(rabbitmq_url, Path("unused"), s, pipeline=PIPE, sink=sink, body_format="json",
                 body_schema=SCHEMA, on_bad_record="dead_letter",
                 sql="SELECT order_id, amount FROM records WHERE status = 'paid'")
    from dataclasses import replace

    cfg = replace(cfg, output_root=s3_bucket.uri("lake"))
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    [r] = published(ledger)
    assert r.output is not None and r.output.startswith(s3_bucket.uri("lake"))
    want = sum(1 for b in broker_bodies(rabbitmq_url, s, 0, r.end)
               if (d := decoded(b)) and d["status"] == "paid")
    assert r.rows_out == want
    keys = [k for k in s3_bucket.keys("lake") if k.endswith(".parquet") and "/_staging/" not in f"/{k}"]
    assert any("/_dead_letter/" in k for k in keys) and any("/_dead_letter/" not in k for k in keys)
    report = audit(ledger, PIPE, broker=client, deep=True)
    assert report.clean, report.to_text()


@pytest.mark.parametrize("sink, form", [("delta", "decode only"), ("iceberg", "function")])
def test_decoding_alone_and_a_function_land_in_the_tables(
        sink: str, form: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
        stream_name: Any, tmp_path: Path) -> None:
    """The other two forms on the table sinks: decoding alone (the source's columns and the decoded
    fields, bad records nulled with ``_corrupt_record``) and a function by import path (explode)."""
    s = stream_name(f"orders-{form.split()[0]}")
    publish_orders(rabbitmq_url, s, 30)
    extra: dict[str, Any] = ({"on_bad_record": "null"} if form == "decode only" else
                             {"on_bad_record": "dead_letter",
                              "transform": "tests.integration.batch.order_transforms:items"})
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE, sink=sink, body_format="json",
                 body_schema=SCHEMA + ", items ARRAY<STRING>", **extra)
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    rows = table_of(sink, ledger, tmp_path, PIPE).to_pylist()
    bodies = broker_bodies(rabbitmq_url, s, 0, 30)
    if form == "decode only":
        assert sorted(r["offset"] for r in rows) == list(range(len(bodies)))
        assert {r["offset"] for r in rows if r["_corrupt_record"] is not None} == {
            i for i, b in enumerate(bodies) if decoded(b) is None}
        assert {r["offset"]: r["order_id"] for r in rows if r["_corrupt_record"] is None} == {
            i: d["order_id"] for i, b in enumerate(bodies) if (d := decoded(b))}
    else:
        assert sorted((r["order_id"], r["item"]) for r in rows) == sorted(
            (d["order_id"], item) for b in bodies if (d := decoded(b)) for item in d["items"])
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
