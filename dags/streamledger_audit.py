"""Audit the offset ledger daily, including drift against the broker's stored offsets.

Fails (and so alerts) on gaps, overlaps, claims stuck in ``claimed``, failed ranges never retried,
record counts that disagree with the offsets seen, or a broker offset that disagrees with the
ledger; for a pipeline with a table sink, also the table (every committed range in exactly one
table commit, row counts, no duplicate). The JSON report is the task's XCom.
"""

from __future__ import annotations

from _streamledger_settings import CATALOG_CONN_ID, PIPELINE, START_DATE
from airflow.sdk import DAG
from airflow.timetables.trigger import CronTriggerTimetable

from streamledger.operators.audit import LedgerAuditOperator

with DAG(
    dag_id="streamledger_audit",
    schedule=CronTriggerTimetable("0 6 * * *", timezone="UTC"),
    start_date=START_DATE,
    catchup=False,
    tags=["streamledger", "example"],
    doc_md=__doc__,
):
    LedgerAuditOperator(task_id="audit", pipeline=PIPELINE, rabbitmq_stream_conn_id="rabbitmq_stream_default",
                        catalog_conn_id=CATALOG_CONN_ID)
