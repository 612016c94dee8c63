"""``StreamBacklogSensor``: wait until a pipeline has at least N unprocessed offsets.

Backlog = committed tail minus the pipeline's next start (ledger end, else broker stored offset + 1,
else the first retained offset), summed over the partitions; a partition where only tracking chunks
(StoreOffset) follow the start has none. Offsets, not records: tracking chunks between data take
offsets too, so the count is an upper bound on records. Checks share one read-only ledger engine
per process and never migrate it. With ``deferrable=True`` the wait
happens in the triggerer (:class:`~streamledger.triggers.backlog.StreamBacklogTrigger`) and frees
the worker slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context
from airflow.sdk.exceptions import AirflowException

from streamledger.batch.position import source_problem
from streamledger.hooks.masking import MaskRenderedUrls
from streamledger.triggers.backlog import StreamBacklogTrigger, measure_backlog


class StreamBacklogSensor(MaskRenderedUrls, BaseSensorOperator):
    """Succeeds when ``min_backlog`` offsets wait to be processed for ``pipeline``.

    :param pipeline: consumer reference. Templated.
    :param stream: / :param super_stream: what to watch (exactly one). Templated.
    :param min_backlog: threshold in offsets (>= 1). Templated, as are the connection ids.
    :param rabbitmq_stream_conn_id: source connection (``rabbitmq_stream`` or ``mewbase``).
    :param ledger_conn_id: / :param ledger_url: ledger.
    :param deferrable: wait in the triggerer instead of poking from a worker (default ``False``).
    """

    template_fields: Sequence[str] = (
        "pipeline", "stream", "super_stream", "min_backlog", "rabbitmq_stream_conn_id", "ledger_conn_id",
        "ledger_url",
    )
    ui_color = "#e0f2fe"

    def __init__(self, *, pipeline: str, min_backlog: int | str, stream: str | None = None,
                 super_stream: str | None = None, rabbitmq_stream_conn_id: str = "rabbitmq_stream_default",
                 ledger_conn_id: str | None = None, ledger_url: str | None = None,
                 deferrable: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        problem = source_problem(pipeline, stream, super_stream, keywords=True)
        if problem is not None:
            raise ValueError(f"{self.task_id}: {problem}")
        self.pipeline = pipeline
        self.stream = stream
        self.super_stream = super_stream
        self.min_backlog = min_backlog
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.deferrable = deferrable
        if not (isinstance(min_backlog, str) and "{{" in min_backlog):
            self._threshold()

    def _threshold(self) -> int:
        """``min_backlog`` as a number >= 1 (checked at parse time, and again once templated)."""
        try:
            value = int(self.min_backlog)
        except (TypeError, ValueError):
            value = 0
        if value < 1:
            raise ValueError(f"{self.task_id}: min_backlog must be >= 1, got {self.min_backlog!r}")
        return value

    def _backlog(self) -> dict[str, int]:
        return measure_backlog(
            pipeline=self.pipeline, stream=self.stream, super_stream=self.super_stream,
            rabbitmq_stream_conn_id=self.rabbitmq_stream_conn_id, ledger_conn_id=self.ledger_conn_id,
            ledger_url=self.ledger_url,
        )

    def poke(self, context: Context) -> bool:
        per_stream = self._backlog()
        total = sum(per_stream.values())
        self.log.info("pipeline %s backlog %d offsets %s (want %d)", self.pipeline, total, per_stream,
                      self._threshold())
        return total >= self._threshold()

    def trigger(self) -> StreamBacklogTrigger:
        return StreamBacklogTrigger(
            pipeline=self.pipeline, min_backlog=self._threshold(), stream=self.stream,
            super_stream=self.super_stream, rabbitmq_stream_conn_id=self.rabbitmq_stream_conn_id,
            ledger_conn_id=self.ledger_conn_id, ledger_url=self.ledger_url,
            poll_interval=float(self.poke_interval),
        )

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        if self.poke(context):
            return None
        self.defer(trigger=self.trigger(), method_name="execute_complete",
                   timeout=timedelta(seconds=float(self.timeout)))
        return None

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        if not event or event.get("status") != "ready":
            raise AirflowException(f"backlog wait for pipeline {self.pipeline!r} failed: {event}")
        self.log.info("pipeline %s backlog reached %s offsets", self.pipeline, event.get("backlog"))
        return event
