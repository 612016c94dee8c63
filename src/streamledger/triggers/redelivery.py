"""The consumer's half of ack mode: a run started only by redelivered announcements reads nothing.

Airflow 3.3.2 leaves one at-least-once window that no trigger can close (docs/airflow.md, "Ack
mode"): SIGKILLed after ``TriggerRunnerSupervisor.handle_events`` stored the asset event and before
the confirmation reached the producer's ``advance()``, the restarted triggerer yields the same
announcement again, and Airflow stores a second asset event (``AssetManager.register_asset_change``
has no idempotency key). Both carry the same ``announcement`` identity, so the dedupe is done where
the asset events are readable: in the task, through the Task SDK.

The rule (pure: :func:`repeated`): a run is a *repeat* when every asset event that triggered it is
an announcement of this pipeline flagged ``redelivered`` whose identity an earlier asset event of
the same asset already carried. One original among them (the first event and its repeat collapsed
into one run, or any other trigger of the run) and the run reads as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from streamledger.triggers.announcement import Announcement

#: How many earlier asset events of the asset are searched for the original. The original is the
#: previous event its watcher persisted (one announcement is outstanding at a time), so this only
#: leaves room for other watchers' events on the same asset in between.
LOOKBACK = 50


@dataclass(frozen=True)
class Event:
    """What the rule needs of an asset event (the Task SDK's result types, reduced)."""

    asset: tuple[str, str]  # (name, uri)
    timestamp: datetime
    extra: Mapping[str, Any]
    id: int | None = None  # known for looked-up events, not for a run's triggering references


@dataclass(frozen=True)
class Repeat:
    announcement: str
    original_event_id: int | None


def announcement_of(extra: Mapping[str, Any] | None, pipeline: str) -> tuple[str, bool] | None:
    """``(identity, redelivered)`` of a streamledger announcement of ``pipeline``, else ``None``."""
    found = Announcement.from_payload((extra or {}).get("payload"), pipeline)
    return (found.identity, found.redelivered) if found is not None else None


def repeated(triggering: Sequence[Event], earlier: Callable[[Event], Iterable[Event]],
             pipeline: str) -> list[Repeat] | None:
    """The repeats when *every* triggering event is one (see the module docstring), else ``None``.

    ``earlier(event)``: asset events of ``event.asset`` stamped at or before it (newest first is
    enough; at most :data:`LOOKBACK` are read). Only redelivered announcements are looked up."""
    if not triggering:
        return None  # not an asset-triggered run
    found: list[Repeat] = []
    for event in triggering:
        mine = announcement_of(event.extra, pipeline)
        if mine is None or not mine[1]:
            return None  # another trigger, or a first delivery: the run reads
        ident = mine[0]
        original = next((e for e in earlier(event) if e.timestamp < event.timestamp
                         and (a := announcement_of(e.extra, pipeline)) is not None and a[0] == ident), None)
        if original is None:
            return None  # the first persisted delivery of this identity
        found.append(Repeat(ident, original.id))
    return found


def repeated_in_run(context: Mapping[str, Any], pipeline: str) -> list[Repeat] | None:
    """:func:`repeated` on a task's context: its run's triggering asset events, and earlier events
    read through the Task SDK (``GetAssetEventByAsset``, the task process's comms)."""
    accessor = context.get("triggering_asset_events")
    if not accessor:
        return None
    seen: dict[tuple[tuple[str, str], datetime, str], Event] = {}
    for events in accessor.values():  # an event is listed under its asset and under each alias
        for ref in events:
            event = Event(asset=(ref.asset.name, ref.asset.uri), timestamp=ref.timestamp,
                          extra=dict(ref.extra or {}))
            seen[(event.asset, event.timestamp, repr(sorted(event.extra.items())))] = event

    def earlier(event: Event) -> list[Event]:
        from airflow.sdk.execution_time.context import InletEventsAccessor

        name, uri = event.asset
        found = InletEventsAccessor(asset_name=name, asset_uri=uri).before(
            event.timestamp.isoformat()).ascending(False).limit(LOOKBACK)
        return [Event(asset=event.asset, timestamp=e.timestamp, extra=dict(e.extra or {}), id=e.id)
                for e in found]

    return repeated(list(seen.values()), earlier, pipeline)
