"""Backfill a super stream one data interval at a time, exactly once per range.

Every DAG run reads, for each partition, the offsets from where the pipeline's ledger ends up to the
first offset stamped at or after the run's data interval end (chunk timestamps are the broker's
clock at publish), writes them to ``<output>/<pipeline>/<partition>/<start>-<end>/`` as Parquet,
commits the ranges in the ledger and stores the broker offset. With ``catchup=True`` the scheduler
creates one run per missed interval; ``max_active_runs=1`` (the default) keeps them in order.
More runs at once (``STREAMLEDGER_MAX_ACTIVE_RUNS``) stay exactly once: the ledger hands each run
the next range in claim order (a later interval may take an earlier one's records and leave it an
empty range), and a run redoes a failed range first, or one whose holder Airflow reports gone. The
Asset event of each run carries the ranges it processed, and each run ends by auditing the pipeline
(ledger invariants, the broker's stored offsets and the published outputs), so an
inconsistency fails the run that caused it.
"""

from __future__ import annotations

from datetime import timedelta

from _streamledger_settings import (
    LEDGER_URL,
    MAX_ACTIVE_RUNS,
    OUTPUT_ROOT,
    PIPELINE,
    RETRIES,
    SPARK_CONN_ID,
    SPARK_CONNECT_CONN_ID,
    START_DATE,
    SUPER_STREAM,
    data_interval_timetable,
)
from airflow.sdk import DAG, Asset

from streamledger.operators.audit import LedgerAuditOperator
from streamledger.operators.batch import StreamBatchOperator

events = Asset(name=f"streamledger-{PIPELINE}", uri=f"x-streamledger://{PIPELINE}/{SUPER_STREAM}")

with DAG(
    dag_id="streamledger_backfill",
    schedule=data_interval_timetable(),
    start_date=START_DATE,
    catchup=True,
    max_active_runs=MAX_ACTIVE_RUNS,
    default_args={"retries": RETRIES, "retry_delay": timedelta(seconds=1)},
    tags=["streamledger", "example"],
    doc_md=__doc__,
):
    read = StreamBatchOperator(
        task_id="read_interval",
        pipeline=PIPELINE,
        super_stream=SUPER_STREAM,
        bound_by_interval=True,
        initial_position="interval_start",
        spark_conn_id=SPARK_CONN_ID,
        spark_connect_conn_id=SPARK_CONNECT_CONN_ID,
        output_root=OUTPUT_ROOT,
        ledger_url=LEDGER_URL,
        outlets=[events],
    )
    audit = LedgerAuditOperator(
        task_id="audit", pipeline=PIPELINE, rabbitmq_stream_conn_id="rabbitmq_stream_default",
        ledger_url=LEDGER_URL, retries=0,
    )
    read >> audit
