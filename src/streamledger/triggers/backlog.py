"""``StreamBacklogTrigger``: waits, in the triggerer, until a pipeline has enough unprocessed offsets.

The stream client and the ledger are synchronous, so each check runs in a worker thread
(``asyncio.to_thread``) and the event loop only sleeps between checks. The trigger serialises to
connection ids, never to credentials. Checks read the ledger through one engine per process and
never migrate it (:func:`streamledger.hooks.ledger.polling_ledger`).

This module also holds the position rules every poller shares (:func:`measure_positions`): where the
pipeline's next batch starts, the committed tail, and whether any *user* data lies between them.
The last check matters because StoreOffset on an idle stream writes a tracking chunk that takes an
offset: after a batch stores its offset the tail moves by one with nothing to read, and a poller
that only compared offsets would report a backlog of 1 forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from airflow.triggers.base import BaseTrigger, TriggerEvent


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """One partition as a poller sees it.

    ``start``: where the pipeline's next batch starts (the batch planning rule); ``tail``: the
    committed tail (exclusive); ``last_user``: first offset of the last user chunk (``tail`` when the
    stream holds no user chunk).
    """

    stream: str
    start: int
    tail: int
    last_user: int

    def has_user_data_from(self, offset: int) -> bool:
        """Whether a user chunk starts at or after ``offset`` (chunk boundaries: tails always are one)."""
        return offset <= self.last_user < self.tail

    @property
    def backlog(self) -> int:
        """Unprocessed offsets (an upper bound on records), 0 when only tracking chunks follow ``start``."""
        return self.tail - self.start if self.has_user_data_from(self.start) else 0


class _NoHistory:
    """A ledger that does not exist yet: no pipeline has any range."""

    def last_end(self, pipeline: str, source: Any) -> int | None:
        return None


class _PinnedTails:
    """The broker as the batch's backlog rule sees it, with each tail read once by the caller, so
    ``start = tail - backlog`` is exact even while data arrives."""

    def __init__(self, client: Any, tails: Mapping[str, int]) -> None:
        self._client = client
        self._tails = tails

    def committed_tail(self, name: str) -> int:
        return self._tails[name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def measure_positions(client: Any, ledger: Any, *, pipeline: str, url: str, streams: Sequence[str],
                      super_stream: str | None) -> list[StreamPosition]:
    """Positions of ``streams`` for ``pipeline``; ``ledger=None`` means the ledger has no history yet.

    The start rule is :func:`streamledger.batch.backlog` (ledger end, else broker stored offset + 1,
    else the first retained offset): one rule, used by the batch, the sensor and the triggers.
    """
    from streamledger.batch import backlog
    from streamledger.protocol.rabbitmq import OffsetSpec

    last = {s: client.resolve_offset(s, OffsetSpec.last()) for s in streams}  # before the tails
    tails = {s: client.committed_tail(s) for s in streams}
    pending = backlog(cast(Any, ledger if ledger is not None else _NoHistory()), _PinnedTails(client, tails),
                      pipeline=pipeline, url=url, streams=streams, super_stream=super_stream)
    return [StreamPosition(s, tails[s] - pending[s], tails[s], last[s]) for s in streams]


def poll_positions(*, pipeline: str, stream: str | None, super_stream: str | None,
                   rabbitmq_stream_conn_id: str, ledger_conn_id: str | None, ledger_url: str | None,
                   then: Any = None) -> Any:
    """Connect, measure the positions of the stream or of every partition, and hand them to ``then``.

    ``then(client, positions)`` runs on the open connection (the event trigger stores its announced
    offsets there); without it the positions are returned.
    """
    from streamledger.hooks.ledger import OffsetLedgerHook
    from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook

    hook = RabbitMQStreamHook(rabbitmq_stream_conn_id)
    url = hook.get_url()
    ledger = OffsetLedgerHook(ledger_conn_id, ledger_url=ledger_url).get_polling_ledger()
    with hook.get_conn() as client:
        streams = list(client.partitions(super_stream)) if super_stream else [str(stream)]
        positions = measure_positions(client, ledger, pipeline=pipeline, url=url, streams=streams,
                                      super_stream=super_stream)
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
