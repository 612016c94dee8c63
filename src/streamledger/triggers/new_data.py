"""``StreamDataEventTrigger``: event-driven scheduling on new stream data (an Airflow ``AssetWatcher``).

Use it through the common-messaging provider, which dispatches on the scheme::

    MessageQueueTrigger(scheme="rabbitmq-stream", super_stream="events", pipeline="events-live",
                        rabbitmq_stream_conn_id="rabbitmq_stream_default", min_backlog=1, poll_interval=10)

Announcement semantics
======================

Airflow turns every event of a watcher's trigger into an Asset event and then builds a *fresh*
trigger instance, so nothing held in memory survives an announcement. The announced position is
therefore kept on the broker: per partition, the offset of the last announced position is stored
under the reference :func:`announced_reference` (``<pipeline>.announced``), next to, and never
touching, the pipeline's own stored offset.

Each check, per partition: ``from`` = the later of the pipeline's next start (ledger end, else its
stored offset + 1, else the first retained offset) and the announced offset + 1; the partition has
*new data* when a user chunk starts in ``[from, tail)`` (tracking chunks, which StoreOffset writes
and which take offsets, are not data). When the new offsets summed over partitions reach
``min_backlog``, the trigger waits ``settle`` seconds (so a burst published to several partitions a
moment apart is one announcement), measures again, stores ``tail - 1`` as announced for every
partition with new data (read back until visible), *then* fires one event and ends. So:

* data is announced once: a fresh instance starts from the stored announcement and stays silent
  until a user chunk lands past it;
* data the pipeline already processed is never announced, whatever the announcement says;
* on Airflow 3.0-3.2 (:meth:`run`), a crash between the store and Airflow persisting the event
  loses that one announcement (the data is not lost: the next arrival's batch reads from the
  pipeline's ledger position, so it includes it); on Airflow >= 3.3 the trigger runs in *ack mode*
  (:mod:`streamledger.triggers.acked`): the announcement is pinned, yielded, and stored as
  announced only after Airflow persisted the event, so a crash loses nothing (and one between the
  persist and the acknowledgement repeats the identity, whose run then reads nothing:
  :mod:`streamledger.triggers.redelivery`);
* a run reads up to the tail *when it starts*, so with ``max_active_runs=1`` data announced while
  an earlier run was still queued may already be read by that run: the later run then finds only
  tracking chunks (a short, empty batch). Announcements are per arrival, runs are per announcement.

The payload names the pipeline, the super stream, and per partition the ``tail``, the ``backlog``
(unprocessed offsets) and the ``new`` (newly announced) offsets, with the totals. Broker or ledger
errors are logged and retried at the next poll, never turned into an event (an event would start a
DAG run). The trigger serialises to connection ids, never credentials.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from streamledger.batch.position import source_problem
from streamledger.triggers.acked import AnnouncementProducer, ack_mode
from streamledger.triggers.announcement import Announcement, PartitionNews, announcement_id
from streamledger.triggers.backlog import StreamPosition, poll_positions

ANNOUNCED_SUFFIX = ".announced"
ANNOUNCING_SUFFIX = ".announcing"  # ack mode: the pinned, not yet acknowledged announcement
MAX_REFERENCE_BYTES = 255  # the broker's limit for an offset reference


def announced_reference(pipeline: str, suffix: str = ANNOUNCED_SUFFIX) -> str:
    """``<pipeline>.announced``; when that exceeds 255 UTF-8 bytes, a prefix of the pipeline plus a
    digest of the whole name, so distinct pipelines keep distinct references."""
    plain = pipeline + suffix
    if len(plain.encode("utf-8")) <= MAX_REFERENCE_BYTES:
        return plain
    tail = "~" + hashlib.sha256(pipeline.encode("utf-8")).hexdigest()[:16] + suffix
    room = MAX_REFERENCE_BYTES - len(tail.encode("utf-8"))
    prefix = pipeline.encode("utf-8")[:room].decode("utf-8", errors="ignore")
    return prefix + tail


def plan_announcement(positions: Sequence[StreamPosition], announced: dict[str, int | None]
                      ) -> dict[str, PartitionNews]:
    """Per partition what is new past both the pipeline's and the announced position (pure: the
    rule above, unit-tested)."""
    out: dict[str, PartitionNews] = {}
    for p in positions:
        seen = announced.get(p.stream)
        begin = max(p.start, seen + 1) if seen is not None else p.start
        new = p.tail - begin if p.has_user_data_from(begin) else 0
        out[p.stream] = PartitionNews(p.tail, p.backlog, new, begin)
    return out


class StreamDataEventTrigger(BaseEventTrigger):
    """Fires once per arrival of unannounced data for ``pipeline`` (see the module docstring).

    :param pipeline: the consumer reference the batch uses (the announcement is stored under
        ``<pipeline>.announced``).
    :param stream: / :param super_stream: what to watch (exactly one).
    :param rabbitmq_stream_conn_id: source connection (default ``rabbitmq_stream_default``): a
        ``rabbitmq_stream`` or ``mewbase`` one (:mod:`streamledger.hooks.source`); on mewbase the
        announcement is the durable subscription ``<pipeline>.announced`` of the channel (in ack
        mode also ``<pipeline>.announcing``).
    :param ledger_conn_id: / :param ledger_url: the pipeline's ledger (default: as the batch operator).
    :param min_backlog: new offsets, summed over partitions, needed to fire (default 1).
    :param poll_interval: seconds between checks (default 30).
    :param settle: seconds to wait, once new data is seen, before announcing (default 1): a burst
        published to several partitions a moment apart becomes one announcement, not one per
        partition. The announcement covers everything up to the tails measured after the wait.
    """

    def __init__(self, *, pipeline: str, stream: str | None = None, super_stream: str | None = None,
                 rabbitmq_stream_conn_id: str = "rabbitmq_stream_default", ledger_conn_id: str | None = None,
                 ledger_url: str | None = None, min_backlog: int = 1, poll_interval: float = 30.0,
                 settle: float = 1.0) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if not pipeline:
            raise ValueError("StreamDataEventTrigger: pipeline is required")
        problem = source_problem(pipeline, stream, super_stream, keywords=True)
        if problem is not None:
            raise ValueError(problem)
        if int(min_backlog) < 1:
            raise ValueError(f"pipeline {pipeline!r}: min_backlog must be >= 1, got {min_backlog}")
        if float(poll_interval) <= 0:
            raise ValueError(f"pipeline {pipeline!r}: poll_interval must be > 0, got {poll_interval}")
        self.pipeline = pipeline
        self.stream = stream
        self.super_stream = super_stream
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.min_backlog = int(min_backlog)
        self.poll_interval = float(poll_interval)
        if float(settle) < 0:
            raise ValueError(f"pipeline {pipeline!r}: settle must be >= 0, got {settle}")
        self.settle = float(settle)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "stream": self.stream,
                "super_stream": self.super_stream,
                "rabbitmq_stream_conn_id": self.rabbitmq_stream_conn_id,
                "ledger_conn_id": self.ledger_conn_id,
                "ledger_url": self.ledger_url,
                "min_backlog": self.min_backlog,
                "poll_interval": self.poll_interval,
                "settle": self.settle,
            },
        )

    @property
    def reference(self) -> str:
        return announced_reference(self.pipeline)

    @property
    def pinned_reference(self) -> str:
        """Ack mode: where an announcement is pinned before it is yielded (``<pipeline>.announcing``)."""
        return announced_reference(self.pipeline, ANNOUNCING_SUFFIX)

    def _poll(self, then: Any) -> Any:
        return poll_positions(
            pipeline=self.pipeline, stream=self.stream, super_stream=self.super_stream,
            rabbitmq_stream_conn_id=self.rabbitmq_stream_conn_id, ledger_conn_id=self.ledger_conn_id,
            ledger_url=self.ledger_url, then=then,
        )

    def check(self, *, announce: bool = True) -> dict[str, Any] | None:
        """One synchronous check: the event's payload when enough new data waits, else ``None``.
        With ``announce`` the announcement is stored first (without it nothing is written)."""
        found = self._poll(lambda client, positions: self._announce(client, positions, store=announce))
        return found.payload() if found is not None else None

    def check_pinned(self, *, pin: bool) -> Announcement | None:
        """Ack mode's check: the pinned announcement not yet acknowledged (a redelivery) if there is
        one, else new data's announcement, pinned under :attr:`pinned_reference` when ``pin``."""
        return self._poll(  # type: ignore[no-any-return]
            lambda client, positions: self._redelivery(client, positions)
            or self._announce(client, positions, store=pin, reference=self.pinned_reference))

    def acknowledge(self, upto: dict[str, int]) -> None:
        """Ack mode: store the announced offsets (verified) once Airflow persisted the event."""
        from streamledger.hooks.source import source_hook

        with source_hook(self.rabbitmq_stream_conn_id).get_conn() as client:
            for stream, offset in sorted(upto.items()):
                client.store_offset_verified(stream, self.reference, offset)

    def _announce(self, client: Any, positions: list[StreamPosition], *, store: bool,
                  reference: str | None = None) -> Announcement | None:
        announced = {p.stream: client.query_offset(p.stream, self.reference) for p in positions}
        plan = plan_announcement(positions, announced)
        new = sum(v.new for v in plan.values())
        if new < self.min_backlog:
            if new:
                self.log.info("pipeline %s: %d new offsets, waiting for %d", self.pipeline, new,
                              self.min_backlog)
            return None
        marks = {s: v.tail - 1 for s, v in plan.items() if v.new}
        if store:
            for stream, upto in marks.items():
                client.store_offset_verified(stream, reference or self.reference, upto)
        return self._announcement(plan, marks, {**announced, **marks})

    def _redelivery(self, client: Any, positions: list[StreamPosition]) -> Announcement | None:
        """The pinned announcement when it is ahead of the acknowledged one on any partition."""
        announced = {p.stream: client.query_offset(p.stream, self.reference) for p in positions}
        pinned = {p.stream: client.query_offset(p.stream, self.pinned_reference) for p in positions}
        marks: dict[str, int] = {}
        for s, upto in pinned.items():
            seen = announced[s]
            if upto is not None and (seen is None or upto > seen):
                marks[s] = upto
        if not marks:
            return None
        plan: dict[str, PartitionNews] = {}
        for p in positions:
            begin = max(p.start, (announced[p.stream] or -1) + 1)
            new = max(0, marks[p.stream] + 1 - begin) if p.stream in marks else 0
            plan[p.stream] = PartitionNews(p.tail, p.backlog, new, begin)
        found = self._announcement(plan, marks, {**announced, **marks}, redelivered=True)
        if found.new == 0:
            # the pipeline already read (or claimed) all of it: the first event was persisted and
            # ran, or another run took the data; either way it is not announced again
            for stream, upto in marks.items():
                client.store_offset_verified(stream, self.reference, upto)
            self.log.info("pipeline %s: pinned announcement %s already processed, acknowledged without "
                          "an event", self.pipeline, found.identity)
            return None
        return found

    def _announcement(self, plan: dict[str, PartitionNews], marks: dict[str, int],
                      vector: dict[str, int | None], *, redelivered: bool = False) -> Announcement:
        """``marks``: what this announcement stores, per partition; ``vector``: the announced
        position of every partition once it is acknowledged (its identity)."""
        return Announcement(pipeline=self.pipeline, super_stream=self.super_stream,
                            identity=announcement_id(self.pipeline, vector), upto=marks, streams=plan,
                            redelivered=redelivered)

    # -- Airflow >= 3.3: ack mode (one shared poll per key; see streamledger.triggers.acked) --

    def shared_stream_key(self) -> Hashable | None:
        """One poll per (connection, stream or super stream, pipeline) in ack mode, else ``None``
        (Airflow 3.0-3.2, or the gate forced off): :meth:`run` then polls as before."""
        if not ack_mode():
            return None
        return ("streamledger.announcements", self.rabbitmq_stream_conn_id,
                self.super_stream or "", self.stream or "", self.pipeline)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
        return AnnouncementProducer(cls(**kwargs))

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """Every announcement of the shared poll is this trigger's event. Never returns: leaving the
        group with an event awaiting its persist confirmation would abandon its acknowledgement."""
        watched = self.super_stream or self.stream
        async for found in shared_stream:
            self.log.info("pipeline %s on %s: announcing %d new offsets (backlog %d, announcement %s%s)",
                          self.pipeline, watched, found.new, found.backlog, found.identity,
                          ", redelivered" if found.redelivered else "")
            yield TriggerEvent(found.payload())  # type: ignore[no-untyped-call]

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watched = self.super_stream or self.stream
        while True:
            try:
                payload = await asyncio.to_thread(self.check, announce=self.settle == 0)
                if payload is not None and self.settle > 0:
                    await asyncio.sleep(self.settle)  # let a burst across partitions land first
                    payload = await asyncio.to_thread(self.check, announce=True)
            except Exception as exc:  # retried: an event would start a DAG run
                self.log.warning("pipeline %s on %s: check failed, retrying in %gs: %s: %s", self.pipeline,
                                 watched, self.poll_interval, type(exc).__name__, exc)
                payload = None
            if payload is not None:
                self.log.info("pipeline %s on %s: announcing %d new offsets (backlog %d)", self.pipeline,
                              watched, payload["new"], payload["backlog"])
                yield TriggerEvent(payload)  # type: ignore[no-untyped-call]
                return
            await asyncio.sleep(self.poll_interval)
