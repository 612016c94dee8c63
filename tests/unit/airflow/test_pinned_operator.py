"""Issue 25: what ``StreamBatchOperator(bound_by_interval=True)`` adds in Airflow: asset events carry
the run's interval as their ``partition_key`` (Task SDK 1.3 / Airflow 3.3, through the real outlet
accessors and the event serialiser the task runner uses), and an interval that is not ready defers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import TaskDeferred
from airflow.sdk.execution_time.context import OutletEventAccessors
from airflow.sdk.execution_time.task_runner import _serialize_outlet_events

from streamledger.batch import BatchResult, IntervalNotReady, PartitionResult
from streamledger.operators.batch import StreamBatchOperator

ASSET = Asset(name="streamledger-p", uri="x-streamledger://p/events")
START = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)


def _operator(**kw: Any) -> StreamBatchOperator:
    return StreamBatchOperator(task_id="read", pipeline="p", super_stream="events", outlets=[ASSET], **kw)


def _events(op: StreamBatchOperator, run: Any) -> list[dict[str, Any]]:
    events = OutletEventAccessors()
    result = BatchResult("p", "rabbitmq://c1/", "events", [PartitionResult("events-0", 0, 10, "tail")])
    context: Any = {"outlet_events": events, "dag_run": run, "data_interval_start": START}
    op._emit_asset_events(context, result)
    return list(_serialize_outlet_events(events))


def test_asset_events_of_pinned_runs_carry_the_interval_as_partition_key() -> None:
    (event,) = _events(_operator(bound_by_interval=True), SimpleNamespace(partition_key=None))
    assert event["partition_key"] == "2026-01-01T00:05:00"
    assert event["extra"]["ranges"] == {"events-0": [0, 10]}
    # A run of a partitioned timetable keeps its own key.
    (event,) = _events(_operator(bound_by_interval=True), SimpleNamespace(partition_key="2026-01-01"))
    assert event["partition_key"] == "2026-01-01"
    # Unpinned runs own no interval: no partition key.
    (event,) = _events(_operator(), SimpleNamespace(partition_key=None))
    assert "partition_key" not in event


def test_an_interval_that_is_not_ready_defers_until_it_may_be() -> None:
    op = _operator(bound_by_interval=True, interval_poll=5)
    soon = datetime.now(UTC) + timedelta(seconds=60)
    with pytest.raises(TaskDeferred) as deferred:
        op._wait_for_interval(IntervalNotReady("stream 'events-0': interval ... is not ready", soon))
    assert deferred.value.method_name == "resume"
    moment = deferred.value.trigger.moment
    assert datetime.now(UTC) < moment <= datetime.now(UTC) + timedelta(seconds=5)
    near = datetime.now(UTC) + timedelta(seconds=1)  # the ready-by time comes before the next poll
    with pytest.raises(TaskDeferred) as deferred:
        op._wait_for_interval(IntervalNotReady("not ready", near))
    assert deferred.value.trigger.moment == near
