"""Operator construction: validation with clear messages, templated fields, trigger round trip."""

from __future__ import annotations

import importlib

import pytest

from streamledger.operators.audit import LedgerAuditOperator
from streamledger.operators.batch import StreamBatchOperator
from streamledger.operators.streams import (
    CreateStreamOperator,
    CreateSuperStreamOperator,
    DeleteSuperStreamOperator,
    expected_partitions,
)
from streamledger.sensors.backlog import StreamBacklogSensor
from streamledger.triggers.backlog import StreamBacklogTrigger


def test_batch_operator_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one of stream= or super_stream="):
        StreamBatchOperator(task_id="t", pipeline="p")
    with pytest.raises(ValueError, match="exactly one of stream= or super_stream="):
        StreamBatchOperator(task_id="t", pipeline="p", stream="a", super_stream="b")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_position": "beginning"}, "initial_position 'beginning'"),
        ({"fmt": "csv"}, "fmt 'csv'"),
        ({"splits": 0}, "splits must be >= 1"),
        ({"pipeline": ""}, "pipeline is required"),
        ({"sink": "hudi"}, "sink must be one of directory, iceberg, delta"),
        ({"sink": "iceberg", "table": "events"}, "iceberg table 'events' is not 'namespace.name'"),
        ({"sink": "delta", "fmt": "json"}, "fmt must be 'parquet'"),
        ({"table": "ns.events"}, "the directory sink takes neither"),
        ({"sink": "delta", "catalog_conn_id": "lake"}, "catalog_conn_id is for the iceberg sink"),
    ],
)
def test_batch_operator_validation(kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    args = {"task_id": "read", "pipeline": "p", "stream": "s", **kwargs}
    with pytest.raises(ValueError, match=message):
        StreamBatchOperator(**args)


def test_batch_operator_templates_what_users_template() -> None:
    op = StreamBatchOperator(task_id="t", pipeline="p-{{ ds }}", super_stream="events", initial_position=5)
    assert {"pipeline", "stream", "super_stream", "ledger_url", "output_root", "max_records",
            "initial_position", "rabbitmq_stream_conn_id", "ledger_conn_id", "spark_conn_id", "spark_conf",
            "on_data_loss", "sink", "table", "catalog_conn_id"} <= set(op.template_fields)


def test_templated_values_are_checked_once_rendered() -> None:
    op = StreamBatchOperator(task_id="t", pipeline="p", stream="s", initial_position="{{ params.start }}",
                             max_records="{{ params.cap }}", on_data_loss="{{ params.loss }}")
    op.initial_position, op.max_records, op.on_data_loss = "12", "100", "record"  # rendered
    op._validate(rendered=True)
    op.initial_position = "beginning"
    with pytest.raises(ValueError, match="initial_position 'beginning'"):
        op._validate(rendered=True)
    with pytest.raises(ValueError, match="max_records must be a positive integer"):
        StreamBatchOperator(task_id="t", pipeline="p", stream="s", max_records="0")


def test_sensor_templates_threshold_and_connections() -> None:
    sensor = StreamBacklogSensor(task_id="s", pipeline="p", stream="x", min_backlog="{{ params.n }}",
                                 rabbitmq_stream_conn_id="{{ params.conn }}")
    assert {"min_backlog", "rabbitmq_stream_conn_id", "ledger_conn_id", "ledger_url"} <= set(
        sensor.template_fields)
    sensor.min_backlog = "7"  # rendered
    assert sensor.trigger().serialize()[1]["min_backlog"] == 7


def test_super_stream_shape() -> None:
    assert expected_partitions("ev", 3, None) == ["ev-0", "ev-1", "ev-2"]
    assert expected_partitions("ev", None, ["eu", "us"]) == ["ev-eu", "ev-us"]
    with pytest.raises(ValueError, match="exactly one of partitions= or binding_keys="):
        CreateSuperStreamOperator(task_id="c", super_stream="ev")
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        CreateSuperStreamOperator(task_id="c", super_stream="ev", partitions=0)
    with pytest.raises(ValueError, match="stream name is required"):
        CreateStreamOperator(task_id="c", stream="")
    with pytest.raises(ValueError, match="super_stream name is required"):
        DeleteSuperStreamOperator(task_id="d", super_stream="")


def test_sensor_validation() -> None:
    with pytest.raises(ValueError, match="min_backlog must be >= 1"):
        StreamBacklogSensor(task_id="s", pipeline="p", stream="x", min_backlog=0)
    with pytest.raises(ValueError, match="exactly one of stream= or super_stream="):
        StreamBacklogSensor(task_id="s", pipeline="p", min_backlog=1)


def test_trigger_serialisation_round_trip() -> None:
    trigger = StreamBacklogTrigger(pipeline="p", min_backlog=10, super_stream="events",
                                   rabbitmq_stream_conn_id="rmq", ledger_url="sqlite:///l.db",
                                   poll_interval=2)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert isinstance(rebuilt, StreamBacklogTrigger)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert "password" not in str(kwargs)


def test_sensor_builds_the_trigger_it_defers_to() -> None:
    sensor = StreamBacklogSensor(task_id="s", pipeline="p", super_stream="events", min_backlog=5,
                                 poke_interval=7, deferrable=True)
    _, kwargs = sensor.trigger().serialize()
    assert (kwargs["min_backlog"], kwargs["poll_interval"], kwargs["super_stream"]) == (5, 7.0, "events")


def test_audit_operator_defaults() -> None:
    op = LedgerAuditOperator(task_id="audit")
    assert op.fail_on_violations and op.pipeline is None


def test_a_templated_sink_is_checked_once_rendered() -> None:
    op = StreamBatchOperator(task_id="t", pipeline="p", stream="s", sink="{{ params.sink }}",
                             table="{{ params.table }}")
    op.sink, op.table = "iceberg", "lake.events"  # rendered
    op._validate(rendered=True)
    op.table = "events"
    with pytest.raises(ValueError, match=r"not 'namespace\.name'"):
        op._validate(rendered=True)


def test_the_operators_package_names_every_operator() -> None:
    """Issue 41 item 5: ``from streamledger.operators import LedgerAuditOperator`` (docs/airflow.md)."""
    import streamledger.operators as package
    from streamledger.operators import audit, batch, streams

    for name in package.__all__:
        home = next(m for m in (audit, batch, streams) if hasattr(m, name))
        assert getattr(package, name) is getattr(home, name), name
    assert {"LedgerAuditOperator", "StreamBatchOperator", "CreateStreamOperator"} <= set(package.__all__)


def test_the_audit_checks_the_broker_of_the_batchs_default_connection() -> None:
    """One default broker connection for both operators; ``None`` audits the ledger alone."""
    import inspect

    params = inspect.signature(StreamBatchOperator.__init__).parameters
    batch_default = params["rabbitmq_stream_conn_id"].default
    assert LedgerAuditOperator(task_id="audit").rabbitmq_stream_conn_id == batch_default == \
        "rabbitmq_stream_default"
    assert LedgerAuditOperator(task_id="audit", rabbitmq_stream_conn_id=None).rabbitmq_stream_conn_id is None


def test_a_pipeline_spec_given_whole_is_the_tasks_pipeline() -> None:
    """Issue 41 item 1: ``StreamBatchOperator(pipeline=PipelineSpec(...))``, the one declaration as a
    nested object; its fields are not given twice."""
    from streamledger.batch.spec import PipelineSpec

    spec = PipelineSpec(pipeline="p", super_stream="events", output_root="/out", fmt="orc", splits=2,
                        heartbeat_interval=5.0, claim_timeout=60.0, store_offset=False)
    op = StreamBatchOperator(task_id="t", pipeline=spec)
    assert op.pipeline == "p" and op._spec(rendered=True) == spec
    with pytest.raises(ValueError, match=r"pipeline= is a PipelineSpec, which holds fmt: .* not both"):
        StreamBatchOperator(task_id="t", pipeline=spec, fmt="json")
