"""``Ledger.new_epoch`` on both ledgers (SQLite and the session's PostgreSQL): what the retired history
left unread is recorded lost, in ranges the database's contiguity rule accepts (audit rule 10)."""

from __future__ import annotations

from streamledger.ledger import Ledger, RangeStatus, RunIdentity, SourceRef

SRC = SourceRef("rabbitmq://cluster/%2F", "s")


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
    assert (c.start, c.end) == (90, 90)
    led.fail(b.id, "executor lost")
    led.saw_tails("p", {SRC: 120})
    assert led.new_epoch("p", SRC, reason="re-created") == (0, 1)
    retired = sorted((r.start, r.end) for r in led.ranges("p")
                     if r.source.broker != SRC.broker and r.status == RangeStatus.LOST)
    assert retired == [(50, 90), (90, 120)], retired
