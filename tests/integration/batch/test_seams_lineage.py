"""What the orchestrators are told about a batch that committed two pieces of one stream (a pinned
interval's retry after a narrower run split its failed span), against the real RabbitMQ broker, a
SQLite ledger and local Spark: the Airflow operator's XCom, its Asset events and its OpenLineage
outputs, and the Dagster materialization metadata, each name every piece's output and ledger range,
not only the last piece of the stream."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient, parse_url
from tests.integration.batch.helpers import CountingRunner, config, split_pinned_span
from tests.integration.spark.helpers import create_stream

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.timeout(300)]

PIPELINE = "p-lineage-pieces"


def test_every_orchestrator_surface_lists_every_piece_of_a_stream(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """i1's retry through the Airflow operator commits [0, 50) and [100, 150) of one stream. Before,
    the asset event's ``outputs`` (and Dagster's ``outputs`` / ``ledger_range_ids``) were keyed by
    stream, so they named only the last piece's directory and range."""
    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.sdk import Asset
    from airflow.sdk.execution_time.context import OutletEventAccessors
    from airflow.sdk.execution_time.task_runner import _serialize_outlet_events

    from streamledger.dagster.assets import batch_metadata
    from streamledger.operators.batch import StreamBatchOperator

    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": params.password, "schema": params.vhost}))
    s = stream_name("lineage-pieces")
    create_stream(rabbitmq_url, s)
    root = tmp_path / "out"
    t0, t1 = split_pinned_span(PIPELINE, rabbitmq_url, root, s, ledger, client, runner)

    asset = Asset(name="streamledger-pieces", uri="x-streamledger://pieces/events")
    op = StreamBatchOperator(task_id="read", pipeline=PIPELINE, stream=s, ledger_url=ledger.url,
                             output_root=str(root), bound_by_interval=True, interval_grace=5.0,
                             initial_position="interval_start", outlets=[asset])
    ti = SimpleNamespace(dag_id="dag", run_id="i1", task_id="read", map_index=-1, try_number=2)
    events = OutletEventAccessors()
    context: Any = {"ti": ti, "outlet_events": events, "data_interval_start": t0, "data_interval_end": t1,
                    "dag_run": SimpleNamespace(partition_key=None)}
    xcom = op.execute(context)

    mine = sorted((r for r in ledger.ranges(PIPELINE)
                   if r.run.run_id == "i1" and r.status == RangeStatus.COMMITTED),
                  key=lambda r: r.start)
    assert [(r.start, r.end) for r in mine] == [(0, 50), (100, 150)], ledger.ranges(PIPELINE)
    dirs = [r.output for r in mine]
    ids = [r.id for r in mine]
    assert all(dirs) and len(set(dirs)) == 2, dirs
    pieces = [{"stream": s, "epoch": 0, "start": r.start, "end": r.end, "records": 50,
               "status": "committed", "range_id": r.id, "output": r.output} for r in mine]

    def chosen(listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: p[k] for k in pieces[0]} for p in listed]

    # the Asset event's extra (serialised as the task runner sends it)
    (event,) = list(_serialize_outlet_events(events))
    extra = event["extra"]
    assert extra["outputs"] == {s: dirs}, extra
    assert extra["ledger_range_ids"] == {s: ids}, extra
    assert chosen(extra["pieces"]) == pieces, extra
    assert extra["ranges"] == {s: [0, 50, 100, 150]}
    assert not params.password or params.password not in json.dumps(extra)

    # XCom: every piece (its partitions), with its epoch
    assert xcom["ranges"] == {s: [0, 50, 100, 150]}, xcom
    assert chosen(sorted(xcom["partitions"], key=lambda p: p["start"])) == pieces, xcom

    # OpenLineage: one input per piece (with its range id and epoch) and one output per directory
    lineage = ExtractorManager().get_extractor_class(op)(op).extract_on_complete(ti)
    assert lineage is not None
    assert sorted(o.name for o in lineage.outputs) == sorted(dirs)
    facets = [i.inputFacets["streamledger_range"] for i in lineage.inputs]
    assert [(f.start, f.end, f.rangeId, f.epoch) for f in facets] == [
        (0, 50, ids[0], 0), (100, 150, ids[1], 0)]

    # Dagster: the metadata the asset materializes for this batch
    assert op._result is not None
    meta = {k: v.value for k, v in batch_metadata(op._result).items()}
    assert meta["outputs"] == {s: dirs}, meta
    assert meta["ledger_range_ids"] == {s: ids}, meta
    assert meta["stored_offsets"] == {s: 149}, meta
    assert chosen(meta["pieces"]) == pieces, meta
    assert meta["ranges"] == {s: [0, 50, 100, 150]} and meta["records"] == 100


def test_a_partition_check_keeps_a_re_created_streams_ranges_apart(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """One Dagster asset partition holds [0, 10) of a stream, which is then deleted and re-created
    with 3 records; after `new-epoch` a re-materialization of the partition commits [0, 3) of the new
    stream (epoch 1). Both ranges are the partition's and both are right: its check must find nothing
    (before, it put both epochs on one line of offsets and reported a gap [3, 0))."""
    from dagster import AssetKey

    from streamledger.batch import RunId, StreamReplaced, run_batch
    from streamledger.batch.lineage import lineage_of
    from streamledger.cli import main
    from streamledger.dagster.checks import partition_findings, partition_ranges
    from streamledger.dagster.identity import DAG_ID, task_id

    pipeline, key, window = "p-lineage-epochs", AssetKey("events"), "2026-01-01"
    s = stream_name("lineage-epochs")
    create_stream(rabbitmq_url, s, 10)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=pipeline)

    def materialize(run_id: str) -> Any:
        return run_batch(cfg, run=RunId(DAG_ID, run_id, task_id(key, window)), ledger=ledger, broker=client,
                         runner=runner)

    materialize("r1")
    client.delete_stream(s)
    client.create_stream(s)
    client.publish(s, [b"new-%d" % i for i in range(3)])
    with pytest.raises(StreamReplaced):
        materialize("r2")
    broker = ledger.ranges(pipeline)[0].source.broker
    assert main(["ledger", "new-epoch", "--db", ledger.url, "--pipeline", pipeline, "--stream", s,
                 "--broker", broker, "--reason", "re-created"]) == 0
    got = materialize("r3")
    (piece,) = lineage_of(got).pieces
    assert (piece.start, piece.end, piece.records, piece.epoch) == (0, 3, 3, 1), piece

    ranges = partition_ranges(ledger, pipeline, key, window)
    done = sorted((r.start, r.end) for r in ranges if r.status == RangeStatus.COMMITTED)
    assert done == [(0, 3), (0, 10)], ranges
    assert partition_findings(ledger, pipeline, ranges, broker=client) == []
