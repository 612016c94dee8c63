"""``LedgerAuditOperator``: prove the ledger is consistent, or fail the task saying why.

The audit (gaps, overlaps, stuck claims, unretried failures, count mismatches and, with a broker
connection, drift between the ledger's end and the broker's stored offset) runs in the ledger;
this operator logs the readable report, pushes the JSON form as its XCom, and fails on violations.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from streamledger.batch.proof import audit
from streamledger.errors import StreamledgerError
from streamledger.hooks.ledger import OffsetLedgerHook
from streamledger.hooks.masking import MaskRenderedUrls
from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook
from streamledger.hooks.source import source_hook


class LedgerAuditFailed(StreamledgerError):
    """The audit found violations."""


class LedgerAuditOperator(MaskRenderedUrls, BaseOperator):
    """Audit the offset ledger.

    :param pipeline: audit one pipeline (default: all). Templated.
    :param ledger_conn_id: ledger connection; ``None`` uses ``ledger_url`` or the default SQLite file.
    :param ledger_url: SQLAlchemy URL (wins over the connection). Templated.
    :param rabbitmq_stream_conn_id: also compare with the source's stored offsets through this
        connection (a ``rabbitmq_stream`` or ``mewbase`` connection); the default is
        ``StreamBatchOperator``'s, ``rabbitmq_stream_default``; ``None`` audits the ledger alone.
        Connection ids are templated too.
    :param fail_on_violations: fail the task when the audit is not clean (default ``True``).
    :param catalog_conn_id: for a pipeline with an Iceberg sink in a catalog other than the default
        SQL catalog in the ledger: the connection holding its properties (``streamledger.hooks.catalog``).
    """

    template_fields: Sequence[str] = ("pipeline", "ledger_conn_id", "ledger_url", "rabbitmq_stream_conn_id",
                                      "catalog_conn_id")
    ui_color = "#dcfce7"

    def __init__(self, *, pipeline: str | None = None, ledger_conn_id: str | None = None,
                 ledger_url: str | None = None,
                 rabbitmq_stream_conn_id: str | None = RabbitMQStreamHook.default_conn_name,
                 fail_on_violations: bool = True, catalog_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id
        self.fail_on_violations = fail_on_violations
        self.catalog_conn_id = catalog_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        ledger = OffsetLedgerHook(self.ledger_conn_id, ledger_url=self.ledger_url).get_conn()
        pipeline = self.pipeline or None
        catalog = None
        if self.catalog_conn_id:
            from streamledger.hooks.catalog import catalog_properties

            catalog = catalog_properties(self.catalog_conn_id)
        if self.rabbitmq_stream_conn_id:
            with source_hook(self.rabbitmq_stream_conn_id).get_conn() as client:
                report = audit(ledger, pipeline, broker=client, catalog=catalog)
        else:
            report = audit(ledger, pipeline, catalog=catalog)
        data: dict[str, Any] = json.loads(report.to_json())
        self.log.info("ledger audit%s:\n%s", f" of {pipeline}" if pipeline else "", report.to_text())
        if not report.clean and self.fail_on_violations:
            context["ti"].xcom_push(key="audit", value=data)
            raise LedgerAuditFailed(
                f"ledger audit found {len(report.violations)} violation(s)"
                + (f" for pipeline {pipeline!r}" if pipeline else "")
                + "; see the task log or the 'audit' XCom"
            )
        return data
