"""Settings shared by the example DAGs, read from the environment so the same DAG files serve
production-like daily runs, the demo (short intervals) and the end-to-end tests.

| variable | default | meaning |
|---|---|---|
| ``STREAMLEDGER_SUPER_STREAM`` | ``events`` | super stream the pipeline reads |
| ``STREAMLEDGER_STREAM`` | (unset) | read this one stream, or mewbase channel, instead (backfill DAG) |
| ``STREAMLEDGER_SOURCE_CONN_ID`` | ``rabbitmq_stream_default`` | the backfill DAG's source connection |
| ``STREAMLEDGER_PARTITIONS`` | ``3`` | partitions the creation DAG makes |
| ``STREAMLEDGER_PIPELINE`` | ``events-backfill`` | consumer reference (ledger + broker offset) |
| ``STREAMLEDGER_INTERVAL`` | ``@daily`` | cron expression, or ``<n>s`` / ``<n>m`` for a fixed delta |
| ``STREAMLEDGER_START_DATE`` | ``2026-01-01T00:00:00+00:00`` | first data interval's start |
| ``STREAMLEDGER_END_DATE`` | (unset) | the backfill DAG schedules no interval after this |
| ``STREAMLEDGER_SPARK_CONN_ID`` | (unset) | run the job via spark-submit on this connection |
| ``STREAMLEDGER_SPARK_CONNECT_CONN_ID`` | (unset) | run the batch jobs on this ``spark_connect`` server |
| ``STREAMLEDGER_DAG_LEDGER_URL`` | (unset) | templated ``ledger_url`` of the backfill tasks |
| ``STREAMLEDGER_OUTPUT_ROOT`` | ``$STREAMLEDGER_HOME/output`` | where range directories are written |
| ``STREAMLEDGER_EVENT_PIPELINE`` | ``<pipeline>-on-arrival`` | pipeline of the event-driven DAG |
| ``STREAMLEDGER_MIN_BACKLOG`` | ``1`` | new offsets that start an event-driven run |
| ``STREAMLEDGER_POLL_INTERVAL`` | ``30`` | seconds between the event trigger's checks |
| ``STREAMLEDGER_MAX_OFFSETS`` | ``1000000`` | offsets per partition and batch (was ``..._MAX_RECORDS``) |
| ``STREAMLEDGER_MAX_ACTIVE_RUNS`` | ``4`` | ``max_active_runs`` of the backfill DAG |
| ``STREAMLEDGER_BOUND_BY_INTERVAL`` | ``1`` | pinned ranges in the backfill DAG (``0``: claim order) |
| ``STREAMLEDGER_INTERVAL_GRACE`` | 60 | idle stream: seconds past an interval end until the tail is its end |
| ``STREAMLEDGER_RETRIES`` | ``1`` | ``retries`` of the backfill DAG's batch task (its audit never retries) |
| ``STREAMLEDGER_SINK`` | ``directory`` | the backfill DAG's sink: ``directory``, ``iceberg`` or ``delta`` |
| ``STREAMLEDGER_TABLE`` | (unset) | its table: Iceberg ``namespace.name`` / Delta location (sink's default) |
| ``STREAMLEDGER_CATALOG_CONN_ID`` | (unset) | Iceberg catalog connection (default: SQL catalog in ledger) |
| ``STREAMLEDGER_SQL_FILE`` | (unset) | the backfill DAG's transform: a ``.sql`` file over ``records`` |
| ``STREAMLEDGER_BODY_FORMAT`` | ``raw`` | ``json``: decode bodies with ``STREAMLEDGER_BODY_SCHEMA`` |
| ``STREAMLEDGER_BODY_SCHEMA`` | (unset) | the body's fields as Spark DDL (with ``json``) |
| ``STREAMLEDGER_ON_BAD_RECORD`` | ``fail`` | a body not decoded: ``fail``, ``null``, ``dead_letter`` |

The source comes from the ``rabbitmq_stream_default`` connection (the backfill DAG: from
``STREAMLEDGER_SOURCE_CONN_ID``, which may be a ``mewbase`` connection read with
``STREAMLEDGER_STREAM``), the ledger from the backfill DAG's ``ledger_url`` when
``STREAMLEDGER_DAG_LEDGER_URL`` is set, else ``STREAMLEDGER_LEDGER_URL`` (default: SQLite under
``$STREAMLEDGER_HOME``).
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk import Asset

SUPER_STREAM = os.environ.get("STREAMLEDGER_SUPER_STREAM", "events")
STREAM = os.environ.get("STREAMLEDGER_STREAM") or None
SOURCE_CONN_ID = os.environ.get("STREAMLEDGER_SOURCE_CONN_ID") or "rabbitmq_stream_default"
PARTITIONS = int(os.environ.get("STREAMLEDGER_PARTITIONS", "3"))
PIPELINE = os.environ.get("STREAMLEDGER_PIPELINE", "events-backfill")
INTERVAL = os.environ.get("STREAMLEDGER_INTERVAL", "@daily")
START_DATE = datetime.fromisoformat(os.environ.get("STREAMLEDGER_START_DATE", "2026-01-01T00:00:00+00:00"))
_END = os.environ.get("STREAMLEDGER_END_DATE")
END_DATE = datetime.fromisoformat(_END) if _END else None
SPARK_CONN_ID = os.environ.get("STREAMLEDGER_SPARK_CONN_ID") or None
SPARK_CONNECT_CONN_ID = os.environ.get("STREAMLEDGER_SPARK_CONNECT_CONN_ID") or None
OUTPUT_ROOT = os.environ.get("STREAMLEDGER_OUTPUT_ROOT") or None
LEDGER_URL = os.environ.get("STREAMLEDGER_DAG_LEDGER_URL") or None
EVENT_PIPELINE = os.environ.get("STREAMLEDGER_EVENT_PIPELINE") or f"{PIPELINE}-on-arrival"
MIN_BACKLOG = int(os.environ.get("STREAMLEDGER_MIN_BACKLOG", "1"))
POLL_INTERVAL = float(os.environ.get("STREAMLEDGER_POLL_INTERVAL", "30"))
MAX_OFFSETS = int(os.environ.get("STREAMLEDGER_MAX_OFFSETS") or os.environ.get("STREAMLEDGER_MAX_RECORDS")
                  or "1000000")
MAX_ACTIVE_RUNS = int(os.environ.get("STREAMLEDGER_MAX_ACTIVE_RUNS", "4"))
RETRIES = int(os.environ.get("STREAMLEDGER_RETRIES", "1"))
SINK = os.environ.get("STREAMLEDGER_SINK") or "directory"
TABLE = os.environ.get("STREAMLEDGER_TABLE") or None
CATALOG_CONN_ID = os.environ.get("STREAMLEDGER_CATALOG_CONN_ID") or None
INTERVAL_GRACE = float(os.environ.get("STREAMLEDGER_INTERVAL_GRACE", "60"))
BOUND_BY_INTERVAL = os.environ.get("STREAMLEDGER_BOUND_BY_INTERVAL", "1") not in ("0", "false", "False")
SQL_FILE = os.environ.get("STREAMLEDGER_SQL_FILE") or None
BODY_FORMAT = os.environ.get("STREAMLEDGER_BODY_FORMAT") or "raw"
BODY_SCHEMA = os.environ.get("STREAMLEDGER_BODY_SCHEMA") or None
ON_BAD_RECORD = os.environ.get("STREAMLEDGER_ON_BAD_RECORD") or "fail"


def data_interval_timetable(spec: str = INTERVAL) -> object:
    """A timetable with real data intervals (Airflow 3's plain cron schedules have none)."""
    from airflow.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable

    match = re.fullmatch(r"(\d+)([sm])", spec.strip())
    if match:
        n, unit = int(match.group(1)), match.group(2)
        return DeltaDataIntervalTimetable(timedelta(seconds=n) if unit == "s" else timedelta(minutes=n))
    return CronDataIntervalTimetable(spec, timezone="UTC")


def backfill_asset() -> Asset:
    """The Asset the backfill DAG updates once per interval (partition key = the interval); the
    downstream DAG is scheduled on it."""
    from airflow.sdk import Asset

    return Asset(name=f"streamledger-{PIPELINE}", uri=f"x-streamledger://{PIPELINE}/{STREAM or SUPER_STREAM}")
