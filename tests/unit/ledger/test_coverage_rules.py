"""Issue 30, defects 1 and 2 on the ledger alone, and the audit's coverage rules (docs/ledger.md,
"Audit rules"). Re-collected against PostgreSQL by tests/integration/ledger/test_coverage_rules_pg.py.

The audit proves coverage: from the history's origin (its lowest range of any status) to its end,
every offset is in a committed, lost or deliberately skipped range; a failed range covers nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from streamledger.ledger import Ledger, LedgerError, RangeStatus, ViolationKind
from tests.unit.ledger.test_pinned_claims import _done, _pin
from tests.unit.ledger.util import SRC, check_invariants, run


def _findings(report, kind: ViolationKind) -> list[tuple[int | None, int | None]]:  # type: ignore[no-untyped-def]
    return [(v.start, v.end) for v in report.violations if v.kind == kind]


def test_a_pinned_retry_gets_back_the_span_its_failed_claim_held(ledger: Ledger) -> None:
    """Defect 1: the retry of a failed interval works out a narrower span (retention dropped its
    head, or the schedule changed); the ledger gives it the failed claim's span, not the new one."""
    first = _pin(ledger, 1, (10, 30), initial_start=10)
    ledger.fail(first.id, "executor lost")
    retry = _pin(ledger, 1, (15, 30), try_number=2)
    assert (retry.start, retry.end, retry.status) == (10, 30, RangeStatus.CLAIMED)
    # Retention took [10, 15): recorded lost, the rest stays the run's (a failed remainder) ...
    ledger.record_lost("p", SRC, 10, 15, run("i1", 2), "retention")
    again = _pin(ledger, 1, (15, 30), try_number=3)
    assert (again.start, again.end) == (15, 30)
    # ... and a retry asking for a wider span than it held still gets what it held.
    ledger.fail(again.id, "executor lost again")
    wider = _pin(ledger, 1, (12, 40), try_number=4)
    assert (wider.start, wider.end) == (15, 30)
    _done(ledger, wider.id, 15, 29)
    assert ledger.watermark("p", SRC).end == 30
    check_invariants(ledger)
    assert ledger.audit("p", stale_after=timedelta(0)).clean


def test_a_failed_range_never_covers_the_span_nobody_redid(ledger: Ledger) -> None:
    """Defect 1, the audit: [10, 30) failed, another run (a backfill) committed [15, 30);
    [10, 15) was neither read nor recorded lost. It is a finding, never excused by the failed range
    spanning it: the rest of a failed range is what the claim rule redoes, like a hole, so it is
    `failed_not_retried` (rule 4.1), a violation at once (it was a `gap`, a note while young)."""
    first = _pin(ledger, 1, (10, 30), initial_start=10)
    ledger.fail(first.id, "executor lost")
    other = _pin(ledger, 1, (15, 30), name="manual__i1")
    _done(ledger, other.id, 15, 29)
    assert ledger.watermark("p", SRC).end == 10
    young = ledger.audit("p")
    assert _findings(young, ViolationKind.FAILED_NOT_RETRIED) == [(10, 15)], young.to_text()
    assert not young.notes and not _findings(young, ViolationKind.GAP), young.to_text()
    stale = ledger.audit("p", stale_after=timedelta(0))
    assert _findings(stale, ViolationKind.FAILED_NOT_RETRIED) == [(10, 15)], stale.to_text()
    assert "[10, 30)" in stale.violations[0].detail  # it names what once held the span


def test_the_gap_between_the_origin_and_the_first_interval_that_ran_is_a_finding(ledger: Ledger) -> None:
    """Defect 2: the third interval claimed first records the origin [0, 0); [0, 200) is a gap
    whichever interval's run never comes (failed before claiming, or no catch-up)."""
    third = _pin(ledger, 3, (200, 300), initial_start=0)
    _done(ledger, third.id, 200, 299)
    young = ledger.audit("p")
    assert young.clean and [(v.kind, v.start, v.end) for v in young.notes] == [(ViolationKind.GAP, 0, 200)]
    stale = ledger.audit("p", stale_after=timedelta(0))
    assert _findings(stale, ViolationKind.GAP) == [(0, 200)], stale.to_text()


def test_a_failed_first_interval_is_reported_from_the_origin(ledger: Ledger) -> None:
    """The history starts at its lowest range of any status: a failed first claim whose span a
    narrower range of another run covers only in part leaves [0, 50) uncovered: the rest of a
    failed range, `failed_not_retried` (rule 4.1; it was a `gap`)."""
    a = _pin(ledger, 1, (0, 100), initial_start=0)
    ledger.fail(a.id, "executor lost")
    b = _pin(ledger, 1, (50, 100), name="manual__i1")
    _done(ledger, b.id, 50, 99)
    stale = ledger.audit("p", stale_after=timedelta(0))
    assert _findings(stale, ViolationKind.FAILED_NOT_RETRIED) == [(0, 50)], stale.to_text()
    assert not _findings(stale, ViolationKind.GAP)


def test_a_span_nobody_will_read_is_recorded_skipped_and_audited_as_such(ledger: Ledger) -> None:
    third = _pin(ledger, 3, (200, 300), initial_start=0)
    _done(ledger, third.id, 200, 299)
    skip = ledger.record_skipped("p", SRC, 0, 200, reason="the DAG does not catch up")
    assert (skip.start, skip.end, skip.status, skip.skipped) == (0, 200, RangeStatus.LOST, True)
    assert "the DAG does not catch up" in (skip.error or "")
    assert ledger.watermark("p", SRC).end == 300  # skipped offsets are done: the broker may pass them
    report = ledger.audit("p", stale_after=timedelta(0))
    assert report.clean, report.to_text()
    assert [(v.kind, v.start, v.end) for v in report.notes] == [(ViolationKind.SKIPPED, 0, 200)]
    assert "the DAG does not catch up" in report.notes[0].detail
    # A pinned claim of the skipped interval is refused: nobody reads a skipped span.
    with pytest.raises(LedgerError):
        _pin(ledger, 1, (0, 100))
    check_invariants(ledger)


def test_a_skip_is_refused_where_it_would_overlap_or_open_a_gap(ledger: Ledger) -> None:
    third = _pin(ledger, 3, (200, 300), initial_start=0)
    _done(ledger, third.id, 200, 299)
    with pytest.raises(LedgerError, match=r"skip \[150, 250\) .*covers part of it"):
        ledger.record_skipped("p", SRC, 150, 250, reason="x")
    with pytest.raises(LedgerError, match=r"skip \[50, 100\) .*must start where"):
        ledger.record_skipped("p", SRC, 50, 100, reason="x")  # would leave [0, 50) uncovered
    with pytest.raises(LedgerError, match=r"empty or reversed"):
        ledger.record_skipped("p", SRC, 10, 10, reason="x")
    with pytest.raises(LedgerError, match=r"no history"):
        ledger.record_skipped("p", SRC.__class__(SRC.broker, "nowhere", None), 0, 10, reason="x")
    # Two skips in a row, each where the covered history stops.
    ledger.record_skipped("p", SRC, 0, 100, reason="a")
    ledger.record_skipped("p", SRC, 100, 200, reason="b")
    assert ledger.audit("p", stale_after=timedelta(0)).clean
    assert [r.skipped for r in ledger.ranges("p") if not r.empty] == [True, True, False]


def test_a_skip_fills_a_failed_hole_of_an_unpinned_history(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 10, run(1), initial_start=0)
    _done(ledger, a.id, 0, 9)
    b = ledger.claim("p", SRC, 20, run(2))
    ledger.fail(b.id, "poison records")
    c = ledger.claim("p", SRC, 20, run(3))
    ledger.fail(c.id, "poison records again")
    assert _findings(ledger.audit("p"), ViolationKind.FAILED_NOT_RETRIED) == [(10, 20), (10, 20)]
    ledger.record_skipped("p", SRC, 10, 20, reason="poison records, replayed by hand")
    assert ledger.audit("p", stale_after=timedelta(0)).clean
    nxt = ledger.claim("p", SRC, 30, run(4))
    assert (nxt.start, nxt.end) == (20, 30)
