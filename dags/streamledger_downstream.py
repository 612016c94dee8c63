"""One run per data interval of the backfill, on Airflow 3.3's partitioned-asset timetable.

Every ``streamledger_backfill`` run updates its Asset with the interval as the event's
``partition_key`` (the interval start in UTC, ``%Y-%m-%dT%H:%M:%S``) and the ranges it processed in
the event's ``extra``. ``PartitionedAssetTimetable`` (identity mapper: the key passes through) makes
one run of this DAG per partition key, so each interval gets its own downstream run, in whatever
order the backfill finishes its intervals. The task here only reports what its interval holds
(records, the range of each partition, the output directories); a real consumer would read those
directories, which are never rewritten.
"""

from __future__ import annotations

from typing import Any

from _streamledger_settings import START_DATE, backfill_asset
from airflow.sdk import DAG, PartitionedAssetTimetable, task

events = backfill_asset()

with DAG(
    dag_id="streamledger_downstream",
    schedule=PartitionedAssetTimetable(assets=events),
    start_date=START_DATE,
    catchup=False,
    tags=["streamledger", "example"],
    doc_md=__doc__,
):

    @task
    def interval_summary(dag_run: Any = None, triggering_asset_events: Any = None) -> dict[str, Any]:
        """What the backfill published for this run's interval (its partition key)."""
        extras = [event.extra for event in triggering_asset_events[events]]
        return {
            "partition_key": dag_run.partition_key,
            "events": len(extras),
            "records": sum(int(extra.get("records", 0)) for extra in extras),
            "ranges": [extra.get("ranges", {}) for extra in extras],
            "outputs": [extra.get("outputs", {}) for extra in extras],
        }

    interval_summary()
