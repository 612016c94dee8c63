"""Process a super stream in a loop that waits for a backlog: a continuous DAG with a deferrable sensor.

``schedule="@continuous"`` starts the next run as soon as one ends (``max_active_runs=1``). Each run
first waits in the triggerer (no worker slot held) until the pipeline has at least
``STREAMLEDGER_MIN_BACKLOG`` unprocessed offsets, then reads one batch up to the committed tail
(capped by ``STREAMLEDGER_MAX_OFFSETS`` offsets per partition). Prefer ``streamledger_event_driven``
(no run exists until data arrives); this form fits when each run should gather a minimum amount.
Needs a running ``airflow triggerer``.
"""

from __future__ import annotations

from _streamledger_settings import (
    MAX_OFFSETS,
    MIN_BACKLOG,
    OUTPUT_ROOT,
    PIPELINE,
    SPARK_CONN_ID,
    SPARK_CONNECT_CONN_ID,
    START_DATE,
    SUPER_STREAM,
)
from airflow.sdk import DAG

from streamledger.operators.batch import StreamBatchOperator
from streamledger.sensors.backlog import StreamBacklogSensor

with DAG(
    dag_id="streamledger_on_backlog",
    schedule="@continuous",
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    tags=["streamledger", "example"],
    doc_md=__doc__,
):
    wait = StreamBacklogSensor(
        task_id="wait_for_backlog",
        pipeline=f"{PIPELINE}-live",
        super_stream=SUPER_STREAM,
        min_backlog=MIN_BACKLOG,
        deferrable=True,
        poke_interval=30,
        timeout=6 * 3600,
    )
    read = StreamBatchOperator(
        task_id="read_backlog",
        pipeline=f"{PIPELINE}-live",
        super_stream=SUPER_STREAM,
        max_offsets=MAX_OFFSETS,
        spark_conn_id=SPARK_CONN_ID,
        spark_connect_conn_id=SPARK_CONNECT_CONN_ID,
        output_root=OUTPUT_ROOT,
    )
    wait >> read
