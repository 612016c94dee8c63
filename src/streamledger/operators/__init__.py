"""The Airflow operators, by name: ``from streamledger.operators import StreamBatchOperator``.

``StreamBatchOperator`` (one ledgered batch per task run), ``LedgerAuditOperator`` (the ledger's
audit, failing the task on violations), and the stream topology operators
(``CreateStreamOperator``, ``DeleteStreamOperator``, ``CreateSuperStreamOperator``,
``DeleteSuperStreamOperator``); docs/airflow.md.
"""

from streamledger.operators.audit import LedgerAuditFailed, LedgerAuditOperator
from streamledger.operators.batch import SparkSubmitRunner, StreamBatchOperator
from streamledger.operators.streams import (
    CreateStreamOperator,
    CreateSuperStreamOperator,
    DeleteStreamOperator,
    DeleteSuperStreamOperator,
)

__all__ = [
    "CreateStreamOperator", "CreateSuperStreamOperator", "DeleteStreamOperator", "DeleteSuperStreamOperator",
    "LedgerAuditFailed", "LedgerAuditOperator", "SparkSubmitRunner", "StreamBatchOperator",
]
