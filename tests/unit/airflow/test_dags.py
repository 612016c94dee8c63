"""The example DAGs parse, wire the operators as documented, and have real data intervals."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[3] / "dags"


@pytest.fixture
def dagbag(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STREAMLEDGER_INTERVAL", "3s")
    monkeypatch.setenv("STREAMLEDGER_SUPER_STREAM", "ev")
    monkeypatch.syspath_prepend(str(DAGS))  # Airflow puts its dags folder on sys.path the same way
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_all_example_dags_import(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) >= {
        "streamledger_backfill", "streamledger_create_super_stream", "streamledger_audit",
        "streamledger_on_backlog", "streamledger_event_driven", "streamledger_per_partition",
        "streamledger_downstream",
    }


def test_backfill_dag_shape(dagbag) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.dags["streamledger_backfill"]
    assert dag.catchup and dag.max_active_runs == 4
    read, audit = dag.get_task("read_interval"), dag.get_task("audit")
    assert read.bound_by_interval and read.super_stream == "ev" and read.initial_position == "interval_start"
    assert audit.task_id in read.downstream_task_ids
    assert [o.uri for o in read.outlets] == ["x-streamledger://events-backfill/ev"]
    assert dag.end_date is None


def test_backfill_dag_end_date_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMLEDGER_END_DATE", "2026-03-31T00:00:00+00:00")
    monkeypatch.syspath_prepend(str(DAGS))
    monkeypatch.delitem(sys.modules, "_streamledger_settings", raising=False)  # read the variable again
    from airflow.dag_processing.dagbag import DagBag

    try:
        dag = DagBag(dag_folder=str(DAGS / "streamledger_backfill.py")).dags["streamledger_backfill"]
    finally:
        sys.modules.pop("_streamledger_settings", None)  # later tests must not see the end date
    assert dag.end_date == datetime(2026, 3, 31, tzinfo=UTC)


def test_downstream_dag_runs_once_per_partition_of_the_backfill_asset(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk import PartitionedAssetTimetable

    dag = dagbag.dags["streamledger_downstream"]
    assert isinstance(dag.timetable, PartitionedAssetTimetable)
    asset = dag.timetable.asset_condition
    (outlet,) = dagbag.dags["streamledger_backfill"].get_task("read_interval").outlets
    assert (asset.name, asset.uri) == (outlet.name, outlet.uri)
    assert dag.get_task("interval_summary")


def test_interval_settings_give_real_data_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DAGS))
    from _streamledger_settings import data_interval_timetable
    from airflow.serialization.encoders import coerce_to_core_timetable

    when = datetime(2026, 1, 2, 0, 0, 9, tzinfo=UTC)
    delta = coerce_to_core_timetable(data_interval_timetable("3s")).infer_manual_data_interval(run_after=when)
    assert (delta.start, delta.end) == (datetime(2026, 1, 2, 0, 0, 6, tzinfo=UTC), when)
    daily = coerce_to_core_timetable(data_interval_timetable("@daily")).infer_manual_data_interval(
        run_after=datetime(2026, 1, 2, tzinfo=UTC))
    assert (daily.start, daily.end) == (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC))


def test_event_driven_dag_is_scheduled_by_a_stream_watcher(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.triggers.base import BaseEventTrigger

    from streamledger.triggers.new_data import StreamDataEventTrigger

    dag = dagbag.dags["streamledger_event_driven"]
    assert dag.max_active_runs == 1 and not dag.catchup
    (asset,) = dag.timetable.asset_condition.objects
    (watcher,) = asset.watchers
    trigger = watcher.trigger
    assert isinstance(trigger, BaseEventTrigger)
    assert trigger.serialize()[0] == f"{StreamDataEventTrigger.__module__}.StreamDataEventTrigger"
    kwargs = trigger.serialize()[1]
    assert (kwargs["super_stream"], kwargs["pipeline"], kwargs["min_backlog"]) == (
        "ev", "events-backfill-on-arrival", 1)
    read = dag.get_task("read_new_data")
    assert read.pipeline == kwargs["pipeline"] and read.super_stream == "ev"
    assert read.max_offsets == 1_000_000


def test_on_backlog_dag_really_runs_continuously(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.timetables.simple import ContinuousTimetable

    dag = dagbag.dags["streamledger_on_backlog"]
    assert isinstance(dag.timetable, ContinuousTimetable) and dag.max_active_runs == 1
    assert dag.get_task("wait_for_backlog").deferrable


def test_per_partition_dag_maps_the_batch_over_partitions(dagbag) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.dags["streamledger_per_partition"]
    read = dag.get_task("read_partition")
    assert type(read).__name__ == "MappedOperator"
    assert set(read.expand_input.value) == {"stream"}
    assert read.partial_kwargs["pipeline"] == "events-backfill-per-partition"
    assert "list_partitions" in read.upstream_task_ids
