"""``StreamBacklogTrigger``: waits, in the triggerer, until a pipeline has enough unprocessed offsets.

The stream client and the ledger are synchronous, so each check runs in a worker thread
(``asyncio.to_thread``) and the event loop only sleeps between checks. The trigger serialises to
connection ids, never to credentials.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


def measure_backlog(*, pipeline: str, stream: str | None, super_stream: str | None,
                    rabbitmq_stream_conn_id: str, ledger_conn_id: str | None,
                    ledger_url: str | None) -> dict[str, int]:
    """Unprocessed offsets per partition (see :func:`streamledger.batch.backlog`)."""
    from streamledger.batch import backlog
    from streamledger.hooks.ledger import OffsetLedgerHook
    from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook

    hook = RabbitMQStreamHook(rabbitmq_stream_conn_id)
    ledger = OffsetLedgerHook(ledger_conn_id, ledger_url=ledger_url).get_conn()
    with hook.get_conn() as client:
        streams = list(client.partitions(super_stream)) if super_stream else [str(stream)]
        return backlog(ledger, client, pipeline=pipeline, url=hook.get_url(), streams=streams,
                       super_stream=super_stream)


class StreamBacklogTrigger(BaseTrigger):
    """Fires once the summed backlog reaches ``min_backlog`` (checked every ``poll_interval`` s)."""

    def __init__(self, *, pipeline: str, min_backlog: int, stream: str | None = None,
                 super_stream: str | None = None, rabbitmq_stream_conn_id: str = "rabbitmq_stream_default",
                 ledger_conn_id: str | None = None, ledger_url: str | None = None,
                 poll_interval: float = 30.0) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.pipeline = pipeline
        self.min_backlog = int(min_backlog)
        self.stream = stream
        self.super_stream = super_stream
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "min_backlog": self.min_backlog,
                "stream": self.stream,
                "super_stream": self.super_stream,
                "rabbitmq_stream_conn_id": self.rabbitmq_stream_conn_id,
                "ledger_conn_id": self.ledger_conn_id,
                "ledger_url": self.ledger_url,
                "poll_interval": self.poll_interval,
            },
        )

    def _measure(self) -> dict[str, int]:
        return measure_backlog(
            pipeline=self.pipeline, stream=self.stream, super_stream=self.super_stream,
            rabbitmq_stream_conn_id=self.rabbitmq_stream_conn_id, ledger_conn_id=self.ledger_conn_id,
            ledger_url=self.ledger_url,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                per_stream = await asyncio.to_thread(self._measure)
            except Exception as exc:
                yield TriggerEvent(  # type: ignore[no-untyped-call]
                    {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
                )
                return
            total = sum(per_stream.values())
            self.log.info("pipeline %s backlog %d offsets (want %d)", self.pipeline, total, self.min_backlog)
            if total >= self.min_backlog:
                yield TriggerEvent(  # type: ignore[no-untyped-call]
                    {"status": "ready", "backlog": total, "streams": per_stream}
                )
                return
            await asyncio.sleep(self.poll_interval)
