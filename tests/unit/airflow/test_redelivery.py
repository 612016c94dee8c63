"""The consumer's dedupe rule of ack mode (``streamledger.triggers.redelivery.repeated``): which runs
are repeats of an announcement an earlier asset event already delivered. The rule on a real Task
SDK run is tested in test_event_trigger_ack.py (the repeat run reads nothing)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from streamledger.triggers.redelivery import Event, Repeat, repeated

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
ASSET = ("arrivals", "x-streamledger://p/events/arrivals")


def _event(seconds: int, ident: str, *, redelivered: bool = False, pipeline: str = "p",
           event_id: int | None = None) -> Event:
    payload = {"pipeline": pipeline, "announcement": ident, **({"redelivered": True} if redelivered else {})}
    return Event(asset=ASSET, timestamp=T0 + timedelta(seconds=seconds),
                 extra={"from_trigger": True, "payload": payload}, id=event_id)


def _store(*events: Event):  # type: ignore[no-untyped-def]
    """Earlier events of the asset as the Task SDK returns them (stamped at or before, newest first)."""

    def earlier(event: Event) -> Iterable[Event]:
        return sorted((e for e in events if e.timestamp <= event.timestamp), key=lambda e: e.timestamp,
                      reverse=True)

    return earlier


def test_a_run_of_the_repeat_alone_is_a_repeat() -> None:
    first, again = _event(0, "A", event_id=1), _event(5, "A", redelivered=True, event_id=2)
    assert repeated([again], _store(first, again), "p") == [Repeat("A", 1)]


def test_a_first_delivery_reads() -> None:
    first = _event(0, "A", event_id=1)
    assert repeated([first], _store(first), "p") is None
    # a redelivery that is the first persisted event of its identity (killed before the persist)
    again = _event(5, "A", redelivered=True, event_id=2)
    assert repeated([again], _store(_event(-5, "Z", event_id=0), again), "p") is None


def test_the_original_and_its_repeat_in_one_run_read() -> None:
    first, again = _event(0, "A", event_id=1), _event(5, "A", redelivered=True, event_id=2)
    assert repeated([first, again], _store(first, again), "p") is None


def test_any_other_event_of_the_run_makes_it_read() -> None:
    first, again = _event(0, "A", event_id=1), _event(5, "A", redelivered=True, event_id=2)
    other = Event(asset=ASSET, timestamp=T0 + timedelta(seconds=6), extra={"note": "by hand"})
    assert repeated([again, other], _store(first, again, other), "p") is None
    new = _event(7, "B", event_id=3)
    assert repeated([again, new], _store(first, again, new), "p") is None


def test_another_pipelines_announcement_is_not_an_original() -> None:
    theirs, again = _event(0, "A", pipeline="q", event_id=1), _event(5, "A", redelivered=True, event_id=2)
    assert repeated([again], _store(theirs, again), "p") is None


def test_a_run_without_triggering_events_reads() -> None:
    assert repeated([], _store(), "p") is None
