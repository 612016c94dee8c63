"""Process a super stream whenever enough new data has arrived, not on a clock.

The deferrable sensor waits in the triggerer (no worker slot held) until the pipeline has at least
``STREAMLEDGER_MIN_BACKLOG`` unprocessed offsets, then one batch reads up to the committed tail
(capped by ``STREAMLEDGER_MAX_RECORDS`` offsets per partition). Runs continuously: each run ends
and the next one starts waiting.
"""

from __future__ import annotations

import os

from _streamledger_settings import OUTPUT_ROOT, PIPELINE, SPARK_CONN_ID, START_DATE, SUPER_STREAM
from airflow.sdk import DAG

from streamledger.operators.batch import StreamBatchOperator
from streamledger.sensors.backlog import StreamBacklogSensor

with DAG(
    dag_id="streamledger_on_backlog",
    schedule=None,
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
        min_backlog=int(os.environ.get("STREAMLEDGER_MIN_BACKLOG", "1000")),
        deferrable=True,
        poke_interval=30,
        timeout=6 * 3600,
    )
    read = StreamBatchOperator(
        task_id="read_backlog",
        pipeline=f"{PIPELINE}-live",
        super_stream=SUPER_STREAM,
        max_records=int(os.environ.get("STREAMLEDGER_MAX_RECORDS", "1000000")),
        spark_conn_id=SPARK_CONN_ID,
        output_root=OUTPUT_ROOT,
    )
    wait >> read
