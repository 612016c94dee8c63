"""``Ledger.new_epoch`` on both ledgers (SQLite and the session's PostgreSQL): what the retired history
left unread is recorded lost, in ranges the database's contiguity rule accepts (audit rule 10)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from streamledger.ledger import Ledger, RangeStatus, RunIdentity, SourceRef
from tests.unit.ledger.util import INSERT_RANGE, raw

SRC = SourceRef("rabbitmq://cluster/%2F", "s")
T0 = datetime(2026, 11, 27, tzinfo=UTC)


def run(n: int) -> RunIdentity:
    return RunIdentity("dag", f"r{n}", "t")


def test_a_hole_below_the_end_and_the_unread_tail_are_recorded_lost_apart(any_ledger: Ledger) -> None:
    """The model checker's PostgreSQL seed 5001: a failed range [50, 90) is a hole below the live
    end (an empty range was recorded at 90 meanwhile) and batches saw the stream's tail at 120.
    The new epoch merged the hole and the tail into one lost range [50, 120), which the database
    refused ("does not start where the live ranges end"): `new-epoch` could never go ahead."""
    led = any_ledger
    a = led.claim("p", SRC, 50, run(1), initial_start=0)
    led.commit(a.id, records=50, first_seen=0, last_seen=49, output="/out/a")
    b = led.claim("p", SRC, 90, run(2))
    assert (b.start, b.end) == (50, 90)
    c = led.claim("p", SRC, 90, run(3))
    assert (c.start, c.end) == (90, 90) and not c.recorded  # not stored since migration 0014 ...
    with led.engine.begin() as conn:  # ... but a ledger written before it holds one
        sid = conn.execute(text("SELECT id FROM streamledger_source WHERE stream = 's'")).scalar_one()
    raw(led, INSERT_RANGE, sid=sid, start=90, end=90, status="committed", run="r3", records=0, first=None,
        last=None, at=datetime(2026, 11, 27))
    led.fail(b.id, "executor lost")
    led.saw_tails("p", {SRC: 120})
    assert led.new_epoch("p", SRC, reason="re-created") == (0, 1)
    retired = sorted((r.start, r.end) for r in led.ranges("p")
                     if r.source.broker != SRC.broker and r.status == RangeStatus.LOST)
    assert retired == [(50, 90), (90, 120)], retired


def test_a_history_no_batch_saw_a_tail_of_is_retired_with_nothing_lost(any_ledger: Ledger) -> None:
    """A history a ledger-recorded streaming query wrote has no tail seen (``saw_tails`` is the
    batch's): new-epoch retires it, recording lost only what no live range covers (nothing here).
    Failed first with "TypeError: 'int' object is not iterable" once gaps of pinned histories were
    recorded too."""
    led = any_ledger
    a = led.claim("p", SRC, 100, run(1), initial_start=0)
    led.commit(a.id, records=100, first_seen=0, last_seen=99, output="/out/a")
    assert led.new_epoch("p", SRC, reason="re-created") == (0, 1)
    assert [r for r in led.ranges("p") if r.status == RangeStatus.LOST] == []


def test_the_gaps_of_a_retired_pinned_history_are_recorded_lost(any_ledger: Ledger) -> None:
    """Pinned intervals [0, 30) and [60, 90) committed, [30, 60)'s run never claimed, a batch saw
    the tail at 95: retiring the history records [30, 60) and [90, 95) lost, so the retired
    history has no gap that a run which can no longer come would excuse."""
    led = any_ledger
    for n, (a, b) in enumerate([(0, 30), (60, 90)]):
        when = (T0 + timedelta(minutes=a), T0 + timedelta(minutes=b))
        r = led.claim("p", SRC, b, run(n), initial_start=0, span=(a, b), interval=when)
        led.commit(r.id, records=b - a, first_seen=a, last_seen=b - 1, output=f"/out/{a}")
    led.saw_tails("p", {SRC: 95})
    led.new_epoch("p", SRC, reason="re-created")
    lost = sorted((r.start, r.end) for r in led.ranges("p") if r.status == RangeStatus.LOST)
    assert lost == [(30, 60), (90, 95)], lost
    assert led.audit("p", stale_after=timedelta(0)).clean
