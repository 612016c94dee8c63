"""Mapped batch tasks and OpenLineage, on a real execution: two mapped instances of the batch operator
(map index 0 and 1, one super-stream partition each) run ``execute`` against the real broker, a
SQLite ledger and local Spark; each claims under its own identity, and the OpenLineage provider's
extractor reports the partition read (range facet) and the directory written."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook
from streamledger.ledger import Ledger
from streamledger.operators.batch import StreamBatchOperator
from streamledger.paths import broker_component
from streamledger.protocol.rabbitmq import StreamClient, parse_url

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]


def _ti(map_index: int) -> SimpleNamespace:
    return SimpleNamespace(dag_id="h14_dag", run_id="manual__1", task_id="read", map_index=map_index,
                           try_number=1)


@pytest.fixture
def mapped_runs(spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": params.password, "schema": params.vhost}))
    name = stream_name.super_stream("h14-map")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=2)
        partitions = client.partitions(name)
        for i, p in enumerate(partitions):
            client.publish(p, [json.dumps({"id": i * 100 + k}).encode() for k in range(5 + i)])
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ops, results = [], []
    # what `.partial(...).expand(stream=partitions)` builds at run time: one operator per partition
    for index, partition in enumerate(partitions):
        op = StreamBatchOperator(task_id="read", pipeline="h14-mapped", stream=partition,
                                 ledger_url=ledger_url, output_root=str(tmp_path / "out"))
        results.append(op.execute({"ti": _ti(index)}))  # type: ignore[arg-type]
        ops.append(op)
    return {"ops": ops, "results": results, "partitions": partitions, "ledger_url": ledger_url,
            "root": tmp_path / "out"}


def test_each_mapped_instance_claims_under_its_own_map_index(mapped_runs: dict[str, Any]) -> None:
    ranges = Ledger(mapped_runs["ledger_url"]).ranges("h14-mapped")
    by_stream = {r.source.stream: r for r in ranges}
    p0, p1 = mapped_runs["partitions"]
    assert (by_stream[p0].start, by_stream[p0].end, by_stream[p0].records) == (0, 5, 5)
    assert (by_stream[p1].start, by_stream[p1].end, by_stream[p1].records) == (0, 6, 6)
    assert by_stream[p0].run.map_index == 0, "map index 0 must not be recorded as unmapped (-1)"
    assert by_stream[p1].run.map_index == 1
    assert all(str(r.status) == "committed" for r in ranges)


def test_openlineage_reports_partitions_ranges_and_outputs(mapped_runs: dict[str, Any]) -> None:
    from airflow.providers.openlineage.extractors.manager import ExtractorManager

    op = mapped_runs["ops"][1]
    (partition,) = [mapped_runs["partitions"][1]]
    manager = ExtractorManager()
    extractor = manager.get_extractor_class(op)
    assert extractor is not None and extractor.__name__ == "DefaultExtractor"
    lineage = extractor(op).extract_on_complete(_ti(1))
    assert lineage is not None

    (source,) = lineage.inputs
    broker = RabbitMQStreamHook().broker_identity()  # rabbitmq://host:port/vhost, no credentials
    assert (source.namespace, source.name) == (broker, partition)
    facet = source.inputFacets["streamledger_range"]
    assert (facet.pipeline, facet.start, facet.end, facet.records) == ("h14-mapped", 0, 6, 6)
    assert (facet.firstOffset, facet.lastOffset, facet.status) == (0, 5, "committed")

    (target,) = lineage.outputs
    expected_dir = (mapped_runs["root"] / "h14-mapped" / broker_component(broker) / partition
                    / "000000000000-000000000006")
    assert (target.namespace, target.name) == ("file", str(expected_dir))
    assert Path(target.name, "_manifest.json").is_file()
    assert target.outputFacets["outputStatistics"].rowCount == 6

    # the facet serialises the way the OpenLineage client sends it
    from openlineage.client.serde import Serde

    sent = json.loads(Serde.to_json(facet))
    assert sent["start"] == 0 and sent["end"] == 6 and sent["_schemaURL"].startswith("urn:streamledger:")


def test_no_lineage_before_a_run() -> None:
    op = StreamBatchOperator(task_id="read", pipeline="p", stream="s")
    assert op.get_openlineage_facets_on_complete(_ti(-1)) is None


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_openlineage_names_the_table_of_a_table_sink(sink: str, spark: Any, rabbitmq_url: str,
                                                     stream_name: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: with a table sink the output dataset is the table, named by its location as the
    Iceberg and Delta OpenLineage integrations name it; Iceberg adds its catalog name as a symlink
    (no credential in it), both the snapshot id / version the batch left."""
    from airflow.providers.openlineage.extractors.manager import ExtractorManager

    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": params.password, "schema": params.vhost}))
    stream = stream_name(f"ol-{sink}")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [json.dumps({"id": k}).encode() for k in range(7)])
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    op = StreamBatchOperator(task_id="read", pipeline=f"ol-{sink}", stream=stream, ledger_url=ledger_url,
                             output_root=str(tmp_path / "out"), sink=sink)
    xcom = op.execute({"ti": _ti(-1)})  # type: ignore[arg-type]
    assert xcom["table"]["format"] == sink
    lineage = ExtractorManager().get_extractor_class(op)(op).extract_on_complete(_ti(-1))
    assert lineage is not None
    (target,) = lineage.outputs  # the table, not the range directories under it
    assert target.outputFacets["outputStatistics"].rowCount == 7
    location = xcom["table"]["location"]
    assert (target.namespace, target.name) == ("file", location.removeprefix("file://").rstrip("/"))
    if sink == "iceberg":
        assert target.name.endswith("/_iceberg/streamledger/ol_iceberg")
        (alias,) = target.facets["symlinks"].identifiers
        assert (alias.namespace, alias.name, alias.type) == (
            ledger_url, "streamledger.ol_iceberg", "TABLE")
        assert target.facets["version"].datasetVersion == str(xcom["table"]["snapshot_id"])
    else:
        assert target.name == str(tmp_path / "out" / "ol-delta")
        assert "symlinks" not in target.facets
        assert target.facets["version"].datasetVersion == str(xcom["table"]["version"])


def test_a_table_sink_is_built_once_per_batch(spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: the operator describes the table from the batch's result; it builds no second sink."""
    from streamledger.batch.sinks import choose
    from streamledger.operators import batch as operator_module

    built: list[str] = []
    real = choose.make_sink

    def counting(config: Any, ledger: Any) -> Any:
        built.append(config.sink)
        return real(config, ledger)

    monkeypatch.setattr(choose, "make_sink", counting)
    monkeypatch.setattr(operator_module, "make_sink", counting, raising=False)  # where it built its own
    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": params.password, "schema": params.vhost}))
    stream = stream_name("once-delta")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [json.dumps({"id": k}).encode() for k in range(3)])
    op = StreamBatchOperator(task_id="read", pipeline="once-delta", stream=stream,
                             ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                             output_root=str(tmp_path / "out"), sink="delta")
    xcom = op.execute({"ti": _ti(-1)})  # type: ignore[arg-type]
    assert xcom["table"]["format"] == "delta" and xcom["records"] == 3
    assert built == ["delta"]
