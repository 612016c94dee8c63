"""The Dagster pieces without servers: resource configuration rules and their one-line errors, the
factories' definition-time validation, the sensor's frontier over a real SQLite ledger, and the
example code location loading into Dagster."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DailyPartitionsDefinition, StaticPartitionsDefinition

from streamledger.batch import BatchError
from streamledger.dagster import (
    RabbitMQStreamResource,
    ResourceConfigError,
    StreamSparkResource,
    build_stream_backlog_sensor,
    build_stream_batch_asset,
)
from streamledger.errors import StreamledgerError
from streamledger.ledger import Ledger, RunIdentity, SourceRef

SECRET = "s3cr3t"


def test_tls_fields_are_merged_into_the_url() -> None:
    res = RabbitMQStreamResource(
        url=f"rabbitmq-stream+tls://app:{SECRET}@broker:5551/prod?heartbeat=30", ca_file="/pki/ca.pem",
        cert_file="/pki/c.pem", key_file="/pki/c.key", verify=False,
    )
    url = res.connection_url()
    assert url.startswith(f"rabbitmq-stream+tls://app:{SECRET}@broker:5551/prod?")
    for part in ("heartbeat=30", "ca_file=%2Fpki%2Fca.pem", "cert_file=%2Fpki%2Fc.pem", "verify=false"):
        assert part in url
    assert res.describe() == "broker:5551/prod (tls)"


def test_tls_fields_on_a_plain_url_name_the_fields_not_the_password() -> None:
    res = RabbitMQStreamResource(url=f"rabbitmq-stream://app:{SECRET}@broker:5552/", ca_file="/pki/ca.pem")
    with pytest.raises(ResourceConfigError, match="ca_file given but the URL scheme") as err:
        res.connection_url()
    assert SECRET not in str(err.value) and "\n" not in str(err.value)
    assert RabbitMQStreamResource(url=f"rabbitmq-stream://app:{SECRET}@broker/").describe() == "broker:5552/"


def test_spark_connect_resource_builds_the_connect_runner() -> None:
    from streamledger.batch import SparkConnectRunner

    runner = StreamSparkResource(remote=f"sc://spark-host:15002/;token={SECRET}").get_runner()
    assert isinstance(runner, SparkConnectRunner)  # the session opens on first use, not here
    with pytest.raises(ResourceConfigError, match="must be an sc:// URL"):
        StreamSparkResource(remote="http://spark-host:15002").get_runner()


@pytest.mark.parametrize(("sink", "library", "extra"), [("iceberg", "pyiceberg", "iceberg"),
                                                         ("delta", "deltalake", "delta")])
def test_the_asset_factory_says_a_sink_without_its_library_in_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, sink: str, library: str, extra: str,
) -> None:
    """Issue 41 item 5: as the component does, when the definitions load, not at the first run."""
    import sys

    for name in [m for m in sys.modules if m == library or m.startswith(f"{library}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, library, None)  # what importing it finds where it is not installed
    with pytest.raises(StreamledgerError) as err:
        build_stream_batch_asset(pipeline="orders", output_root="/tmp/o", stream="s", sink=sink)
    said = str(err.value)
    assert "\n" not in said and "orders" in said, said
    assert f'{library} is not installed: pip install "streamledger[{extra}]"' in said, said


def test_factories_validate_when_definitions_load() -> None:
    with pytest.raises(BatchError, match="exactly one of stream or super_stream"):
        build_stream_batch_asset(pipeline="p", output_root="/tmp/o", stream="s", super_stream="x")
    with pytest.raises(StreamledgerError, match="TimeWindowPartitionsDefinition"):
        build_stream_batch_asset(
            pipeline="p", output_root="/tmp/o", stream="s", partitions_def=StaticPartitionsDefinition(["a"])
        )
    windowed = build_stream_batch_asset(
        pipeline="p", output_root="/tmp/o", stream="s", partitions_def=DailyPartitionsDefinition("2026-01-01")
    )
    with pytest.raises(StreamledgerError, match="unpartitioned asset"):
        build_stream_backlog_sensor(windowed, pipeline="p", stream="s")
    with pytest.raises(StreamledgerError, match="min_backlog"):
        build_stream_backlog_sensor("stream_batch", pipeline="p", stream="s", min_backlog=0)


def test_frontier_stops_at_the_first_span_not_committed(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}", create=True)
    src = SourceRef(broker="rabbitmq://127.0.0.1:5552/%2F", stream="s")

    def claim(run: str, end: int, start: int | None = None) -> int:
        return ledger.claim("p", src, end, RunIdentity("dagster", run, "a"), initial_start=start).id

    assert ledger.position("p", src).frontier is None
    first = claim("r1", 10, start=5)
    assert ledger.position("p", src).frontier is None  # claimed is not done
    ledger.commit(first, records=5, first_seen=5, last_seen=9, output="/o/1")
    assert ledger.position("p", src).frontier == 10
    second = claim("r2", 20)
    ledger.fail(second, "spark died")
    assert ledger.position("p", src).frontier == 10  # a failed run never moves it
    redo = claim("r3", 30)  # the ledger hands the failed span back, exactly
    assert (ledger.get(redo).start, ledger.get(redo).end) == (10, 20)
    ledger.commit(redo, records=10, first_seen=10, last_seen=19, output="/o/2")
    assert ledger.position("p", src).frontier == 20


def test_example_definitions_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.setenv("STREAMLEDGER_RABBITMQ_URL", f"rabbitmq-stream://app:{SECRET}@broker:5552/")
    monkeypatch.setenv("STREAMLEDGER_SUPER_STREAM", "orders")
    monkeypatch.setenv("STREAMLEDGER_PIPELINE", "orders-batch")
    import streamledger.dagster.example as example

    example = importlib.reload(example)
    defs = example.defs
    assert defs.resolve_assets_def("stream_batch").metadata_by_key
    assert example.PIPELINE == "orders-batch" and example.SUPER_STREAM == "orders"
    assert defs.resolve_sensor_def("stream_batch_backlog_sensor")
    defs.resolve_implicit_global_asset_job_def()
    assert SECRET not in repr(defs.resources["rabbitmq"])  # an EnvVar, resolved only at run time
