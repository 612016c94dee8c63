"""Ack mode for :class:`~streamledger.triggers.new_data.StreamDataEventTrigger` (Airflow >= 3.3).

Airflow 3.3's shared streams run one poll per ``shared_stream_key`` in the triggerer and call the
producer's :meth:`AnnouncementProducer.advance` only once every trigger event derived from a raw
event is persisted in the metadata database. The announcement's life on the broker, per partition:

1. *pin*: the announcement's end (``tail - 1``) is stored, verified, under ``<pipeline>.announcing``
   before the raw event is yielded (so a restart finds exactly the same range, not a wider one);
2. *yield*: every trigger of the group turns it into a ``TriggerEvent``; Airflow persists it;
3. *acknowledge*: ``advance`` stores the same offset under ``<pipeline>.announced`` (verified).

A poll first looks for a pinned announcement ahead of the acknowledged one and yields it again
(``redelivered``) with the same ``announcement`` identity (a digest of every partition's announced
position once acknowledged: on the broker from the pin on). So a triggerer killed at any moment:

* before the pin is verified: nothing was announced; the next poll announces the data (killed
  between two partitions' pins, the pinned partitions are announced first and the others next:
  one arrival in two announcements, no offset in both);
* after the pin, before the persist: the pinned range is announced after the restart, once;
* after the persist, before the acknowledgement (the one window Airflow's design leaves
  at-least-once: confirmations travel on the next state sync, about a second): the same range
  is announced again with the *same* identity, unless the pipeline has already read (or claimed)
  all of it: then it is acknowledged without an event. No trigger can do better in Airflow 3.3.2:
  the runner process has no database access and no asset-event read among its requests, and
  asset events have no idempotency key (docs/airflow.md, "Ack mode", names the code paths). The
  consumer dedupes instead: a run started only by such repeats reads nothing
  (:mod:`streamledger.triggers.redelivery`). Consumers that count arrivals count distinct
  ``announcement`` identities. Killed between two partitions' acknowledgements, the rest is
  yielded again under the same identity.

Only one announcement is outstanding per group: new data waits until the pending one is
acknowledged (or failed by Airflow's ack timeout, which redelivers it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from airflow import __version__ as airflow_version
from packaging.version import Version

from streamledger.triggers.announcement import Announcement

log = logging.getLogger(__name__)

#: The version gate (as the Kafka provider gates its ack mode): shared streams with a producer
#: exist from Airflow 3.3 on. Tests force it off to exercise the 3.0-3.2 path.
ACK_MODE = Version(Version(airflow_version).base_version) >= Version("3.3.0")


def ack_mode() -> bool:
    return ACK_MODE


try:
    from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer
except ImportError:  # Airflow < 3.3: never instantiated (the gate is off)
    SharedStreamProducer = object  # type: ignore[assignment,misc]
    AdvanceItem = Any  # type: ignore[assignment,misc]


class AnnouncingTrigger(Protocol):
    """What the shared poll asks of its trigger (``StreamDataEventTrigger`` is one): named here, so
    this module needs nothing from the trigger's and the trigger's may import it plainly."""

    pipeline: str
    stream: str | None
    super_stream: str | None
    poll_interval: float
    settle: float

    def check_pinned(self, *, pin: bool) -> Announcement | None: ...

    def acknowledge(self, upto: dict[str, int]) -> None: ...


class AnnouncementProducer(SharedStreamProducer):
    """The shared poll of one (connection, stream or super stream, pipeline)."""

    def __init__(self, trigger: AnnouncingTrigger) -> None:
        self.trigger = trigger
        self.inflight: str | None = None  # the announcement yielded and not yet advanced

    async def open_stream(self) -> AsyncIterator[tuple[Announcement, tuple[str, dict[str, int]]]]:
        t = self.trigger
        watched = t.super_stream or t.stream
        while True:
            found = None
            if self.inflight is None:
                try:
                    found = await self._next()
                except Exception as exc:  # retried: an event would start a DAG run
                    log.warning("pipeline %s on %s: check failed, retrying in %gs: %s: %s", t.pipeline,
                                watched, t.poll_interval, type(exc).__name__, exc)
            if found is not None:
                self.inflight = found.identity
                yield found, (found.identity, dict(found.upto))
            await asyncio.sleep(t.poll_interval)

    async def _next(self) -> Announcement | None:
        t = self.trigger
        found = await asyncio.to_thread(t.check_pinned, pin=t.settle == 0)
        if found is not None and not found.redelivered and t.settle > 0:
            await asyncio.sleep(t.settle)  # let a burst across partitions land first
            found = await asyncio.to_thread(t.check_pinned, pin=True)
        return found

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Acknowledge each announcement every subscriber persisted; leave others pinned, so the
        next poll yields them again."""
        for item in batch:
            ident, upto = item.broker_payload
            try:
                if item.outcome.is_clean:
                    await asyncio.to_thread(self.trigger.acknowledge, upto)
                    log.info("pipeline %s: announcement %s acknowledged at %s", self.trigger.pipeline,
                             ident, upto)
                else:
                    log.warning("pipeline %s: announcement %s not persisted by every trigger (%s); it "
                                "stays pinned and is announced again", self.trigger.pipeline, ident,
                                item.outcome)
            finally:
                if self.inflight == ident:
                    self.inflight = None
