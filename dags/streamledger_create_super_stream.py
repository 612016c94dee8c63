"""Create the example super stream (idempotent: an existing one of the same shape is success)."""

from __future__ import annotations

from _streamledger_settings import PARTITIONS, START_DATE, SUPER_STREAM
from airflow.sdk import DAG

from streamledger.operators.streams import CreateSuperStreamOperator

with DAG(
    dag_id="streamledger_create_super_stream",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    tags=["streamledger", "example"],
    doc_md=__doc__,
):
    CreateSuperStreamOperator(task_id="create_super_stream", super_stream=SUPER_STREAM, partitions=PARTITIONS)
