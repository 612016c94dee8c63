"""Process a super stream when new data arrives: event-driven scheduling, no clock, no waiting task.

The Asset ``arrivals`` is watched by ``MessageQueueTrigger(scheme="rabbitmq-stream", ...)`` from the
common-messaging provider, which streamledger serves with its ``StreamDataEventTrigger``. The
trigger runs in the triggerer and fires once per arrival of unannounced data (at least
``STREAMLEDGER_MIN_BACKLOG`` new offsets), keeping what it announced on the broker under the
reference ``<pipeline>.announced``; every event makes one DAG run, whose single task reads one
bounded batch up to the committed tail (capped by ``STREAMLEDGER_MAX_OFFSETS`` offsets per
partition) exactly once. Data that arrives while a run is busy is announced after it and picked up
by the next run; the pipeline's own StoreOffset never counts as new data.

Needs a running ``airflow triggerer`` (and ``apache-airflow-providers-common-messaging``).
"""

from __future__ import annotations

from _streamledger_settings import (
    EVENT_PIPELINE,
    MAX_OFFSETS,
    MIN_BACKLOG,
    OUTPUT_ROOT,
    POLL_INTERVAL,
    SPARK_CONN_ID,
    SPARK_CONNECT_CONN_ID,
    START_DATE,
    SUPER_STREAM,
)
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

from streamledger.operators.batch import StreamBatchOperator
from streamledger.spark.session import QUICK_START_JAVA_OPTIONS

arrivals = Asset(
    name=f"streamledger-{EVENT_PIPELINE}-arrivals",
    uri=f"x-streamledger://{EVENT_PIPELINE}/{SUPER_STREAM}/arrivals",
    watchers=[
        AssetWatcher(
            name=f"{EVENT_PIPELINE}-watcher",
            trigger=MessageQueueTrigger(
                scheme="rabbitmq-stream",
                super_stream=SUPER_STREAM,
                pipeline=EVENT_PIPELINE,
                rabbitmq_stream_conn_id="rabbitmq_stream_default",
                min_backlog=MIN_BACKLOG,
                poll_interval=POLL_INTERVAL,
            ),
        )
    ],
)
processed = Asset(name=f"streamledger-{EVENT_PIPELINE}", uri=f"x-streamledger://{EVENT_PIPELINE}/{SUPER_STREAM}")

with DAG(
    dag_id="streamledger_event_driven",
    schedule=[arrivals],
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,  # ranges are contiguous per partition: one batch at a time
    tags=["streamledger", "example"],
    doc_md=__doc__,
):
    StreamBatchOperator(
        task_id="read_new_data",
        pipeline=EVENT_PIPELINE,
        super_stream=SUPER_STREAM,
        max_offsets=MAX_OFFSETS,
        spark_conn_id=SPARK_CONN_ID,
        spark_connect_conn_id=SPARK_CONNECT_CONN_ID,
        # each task is a fresh process under a real executor: trade peak JIT speed for JVM start-up
        spark_conf={"spark.driver.extraJavaOptions": QUICK_START_JAVA_OPTIONS},
        output_root=OUTPUT_ROOT,
        outlets=[processed],
    )
