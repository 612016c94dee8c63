"""Backfill a super stream by data interval, exactly once per range, several intervals at a time.

(With ``STREAMLEDGER_STREAM`` set it reads that one stream instead, from the source connection
``STREAMLEDGER_SOURCE_CONN_ID``: a RabbitMQ stream, or a mewbase channel through a ``mewbase``
connection; a mewbase event's persist time stands for the chunk timestamp below.)

Every DAG run reads, for each partition, exactly the offsets whose chunk is stamped inside the run's
data interval (``bound_by_interval=True``: ``[first offset stamped at or after the interval start,
first offset stamped at or after its end)``, chunk timestamps being the broker's clock at publish),
writes them to ``<output>/<pipeline>/<broker>/<partition>/<start>-<end>/`` as Parquet, commits the
ranges in the ledger and stores the broker offset. The ranges are pinned in the ledger, so runs may
go in any order: ``max_active_runs=4`` (or ``airflow backfill create --max-active-runs N``) runs
intervals in parallel, a rerun of an old interval reproduces its range, and a failed interval keeps
its range for its own retry (the broker offset waits at it meanwhile). A run whose interval end the
broker has not passed yet defers until it has. The Asset event of each run carries the ranges it
processed and the interval as its ``partition_key`` (``streamledger_downstream`` gets one run per
interval from it); each run ends by auditing the pipeline.
``STREAMLEDGER_MAX_ACTIVE_RUNS`` / ``STREAMLEDGER_RETRIES`` set how many intervals run at once (default 4)
and the batch task's retries (default 1); `make chaos-parallel` runs 3 at once with no retries.
``STREAMLEDGER_SINK=iceberg`` (or ``delta``) lands the ranges in a table instead (one table commit per
run; ``STREAMLEDGER_TABLE``, ``STREAMLEDGER_CATALOG_CONN_ID``), and the audit checks the table too.
``STREAMLEDGER_SQL_FILE`` (e.g. ``sql/orders.sql``, rendered as a template) with
``STREAMLEDGER_BODY_FORMAT=json``, ``STREAMLEDGER_BODY_SCHEMA`` and ``STREAMLEDGER_ON_BAD_RECORD`` turns
each range's raw records into typed rows inside the batch (docs/transforms.md): what ``make demo`` runs.
"""

from __future__ import annotations

from datetime import timedelta

from _streamledger_settings import (
    BODY_FORMAT,
    BODY_SCHEMA,
    BOUND_BY_INTERVAL,
    CATALOG_CONN_ID,
    END_DATE,
    INTERVAL_GRACE,
    LEDGER_URL,
    MAX_ACTIVE_RUNS,
    ON_BAD_RECORD,
    OUTPUT_ROOT,
    PIPELINE,
    RETRIES,
    SINK,
    SOURCE_CONN_ID,
    SPARK_CONN_ID,
    SPARK_CONNECT_CONN_ID,
    SQL_FILE,
    START_DATE,
    STREAM,
    SUPER_STREAM,
    TABLE,
    backfill_asset,
    data_interval_timetable,
)
from airflow.sdk import DAG

from streamledger.operators.audit import LedgerAuditOperator
from streamledger.operators.batch import StreamBatchOperator

events = backfill_asset()

with DAG(
    dag_id="streamledger_backfill",
    schedule=data_interval_timetable(),
    start_date=START_DATE,
    end_date=END_DATE,
    catchup=True,
    max_active_runs=MAX_ACTIVE_RUNS,
    default_args={"retries": RETRIES, "retry_delay": timedelta(seconds=1)},
    tags=["streamledger", "example"],
    doc_md=__doc__,
):
    read = StreamBatchOperator(
        task_id="read_interval",
        pipeline=PIPELINE,
        stream=STREAM,
        super_stream=None if STREAM else SUPER_STREAM,
        rabbitmq_stream_conn_id=SOURCE_CONN_ID,
        bound_by_interval=BOUND_BY_INTERVAL,
        interval_grace=INTERVAL_GRACE,
        initial_position="interval_start",
        spark_conn_id=SPARK_CONN_ID,
        spark_connect_conn_id=SPARK_CONNECT_CONN_ID,
        output_root=OUTPUT_ROOT,
        ledger_url=LEDGER_URL,
        sink=SINK,
        table=TABLE,
        catalog_conn_id=CATALOG_CONN_ID,
        sql_file=SQL_FILE,
        body_format=BODY_FORMAT,
        body_schema=BODY_SCHEMA,
        on_bad_record=ON_BAD_RECORD,
        outlets=[events],
    )
    audit = LedgerAuditOperator(
        task_id="audit", pipeline=PIPELINE, rabbitmq_stream_conn_id=SOURCE_CONN_ID,
        ledger_url=LEDGER_URL, catalog_conn_id=CATALOG_CONN_ID, retries=0,
    )
    read >> audit
