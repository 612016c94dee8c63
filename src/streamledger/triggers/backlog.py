"""``StreamBacklogTrigger``: waits, in the triggerer, until a pipeline has enough unprocessed offsets.

The stream client and the ledger are synchronous, so each check runs in a worker thread
(``asyncio.to_thread``) and the event loop only sleeps between checks. The trigger serialises to
connection ids, never to credentials. Checks read the ledger through one engine per process and
never migrate it (:func:`streamledger.hooks.ledger.polling_ledger`).

Where a pipeline stands (its next start, the committed tail, whether a user record waits) is decided
in the position room, :mod:`streamledger.batch.position`; this module only polls it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from streamledger.batch.position import PipelineSource, StreamPosition, measure

__all__ = ["StreamBacklogTrigger", "StreamPosition", "measure_backlog", "poll_positions"]


def poll_positions(*, pipeline: str, stream: str | None, super_stream: str | None,
                   rabbitmq_stream_conn_id: str, ledger_conn_id: str | None, ledger_url: str | None,
                   then: Any = None) -> Any:
    """Connect, measure the positions of the stream or of every partition, and hand them to ``then``.

    ``rabbitmq_stream_conn_id`` names the source connection, of any type
    :mod:`streamledger.hooks.source` knows (``rabbitmq_stream``, ``mewbase``).

    ``then(client, positions)`` runs on the open connection (the event trigger stores its announced
    offsets there); without it the positions are returned.
    """
    from streamledger.hooks.ledger import OffsetLedgerHook
    from streamledger.hooks.source import source_hook

    hook = source_hook(rabbitmq_stream_conn_id)
    url = hook.get_url()
    source = PipelineSource(pipeline, url, stream=stream, super_stream=super_stream)  # refused before I/O
    ledger = OffsetLedgerHook(ledger_conn_id, ledger_url=ledger_url).get_polling_ledger()
    with hook.get_conn() as client:
        positions = measure(client, ledger, source)
        return then(client, positions) if then is not None else positions


def measure_backlog(*, pipeline: str, stream: str | None, super_stream: str | None,
                    rabbitmq_stream_conn_id: str, ledger_conn_id: str | None,
                    ledger_url: str | None) -> dict[str, int]:
    """Unprocessed offsets per partition (0 where only tracking chunks remain)."""
    positions = poll_positions(
        pipeline=pipeline, stream=stream, super_stream=super_stream,
        rabbitmq_stream_conn_id=rabbitmq_stream_conn_id, ledger_conn_id=ledger_conn_id, ledger_url=ledger_url,
    )
    return {p.stream: p.backlog for p in positions}


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
