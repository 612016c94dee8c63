"""One batch task per partition of a super stream, with dynamic task mapping.

``list_partitions`` asks the broker for the super stream's partitions at run time; the batch
operator is then mapped over them (``.partial(...).expand(stream=...)``), so each partition is its
own task instance: it claims, reads, commits and stores the offset of its partition alone, under
its own ledger identity (dag, run, task, **map index**), and a failed partition is retried or
cleared without touching the others. All partitions share one pipeline (the broker offset
reference), each as its own ledger source.

Keep one form per pipeline: a pipeline read partition by partition here records its sources without
a super stream, so do not also read it with ``StreamBatchOperator(super_stream=...)``.
"""

from __future__ import annotations

from _streamledger_settings import (
    MAX_OFFSETS,
    OUTPUT_ROOT,
    PIPELINE,
    SPARK_CONN_ID,
    SPARK_CONNECT_CONN_ID,
    START_DATE,
    SUPER_STREAM,
)
from airflow.sdk import DAG, task

from streamledger.operators.batch import StreamBatchOperator

with DAG(
    dag_id="streamledger_per_partition",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    tags=["streamledger", "example"],
    doc_md=__doc__,
):

    @task
    def list_partitions(super_stream: str) -> list[str]:
        from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook

        with RabbitMQStreamHook().get_conn() as client:
            return list(client.partitions(super_stream))

    StreamBatchOperator.partial(
        task_id="read_partition",
        pipeline=f"{PIPELINE}-per-partition",
        max_offsets=MAX_OFFSETS,
        spark_conn_id=SPARK_CONN_ID,
        spark_connect_conn_id=SPARK_CONNECT_CONN_ID,
        output_root=OUTPUT_ROOT,
        map_index_template="{{ task.stream }}",
    ).expand(stream=list_partitions(SUPER_STREAM))
