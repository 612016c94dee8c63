"""Issue 25: pinned claims (``Ledger.claim(..., span=...)``), the claim rule of ``bound_by_interval``.
Re-collected against PostgreSQL (the server-side ``streamledger_claim``) by
tests/integration/ledger/test_pinned_claims_pg.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from streamledger.ledger import Ledger, LedgerError, RangeStatus
from tests.unit.ledger.test_claim_rule import _age
from tests.unit.ledger.util import SRC, check_invariants, run

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _interval(n: int) -> tuple[datetime, datetime]:
    return T0 + timedelta(minutes=5 * n), T0 + timedelta(minutes=5 * (n + 1))


def _pin(ledger: Ledger, n: int, span: tuple[int, int], *, try_number: int = 1, name: str | None = None,
         **kw: object):  # type: ignore[no-untyped-def]
    return ledger.claim("p", SRC, span[1], run(name or f"i{n}", try_number), span=span,
                        interval=_interval(n), **kw)  # type: ignore[arg-type]


def _done(ledger: Ledger, rng_id: int, first: int, last: int) -> None:
    ledger.commit(rng_id, records=last - first + 1, first_seen=first, last_seen=last, output=None)


def test_out_of_order_pinned_claims_keep_their_spans_and_the_watermark_waits_at_gaps_and_holes(
    ledger: Ledger,
) -> None:
    third = _pin(ledger, 3, (200, 300), initial_start=0)
    assert (third.start, third.end, third.status) == (200, 300, RangeStatus.CLAIMED)
    assert third.interval == _interval(3)
    _done(ledger, third.id, 200, 299)
    # The origin (initial_start of the first claim) was recorded: [0, 200) is a gap, not done.
    mark = ledger.watermark("p", SRC)
    assert (mark.end, mark.last_record) == (0, None)

    first = _pin(ledger, 1, (0, 100), initial_start=150)  # initial_start only counts on the first claim
    _done(ledger, first.id, 0, 99)
    mark = ledger.watermark("p", SRC)
    assert (mark.end, mark.last_record) == (100, 99)  # the gap of interval 2 stops it

    second = _pin(ledger, 2, (100, 200))
    ledger.fail(second.id, "executor lost")
    assert ledger.watermark("p", SRC).end == 100  # now its hole stops it
    # The next interval's run does not take the failed interval over: it gets its own span.
    fourth = _pin(ledger, 4, (300, 400))
    assert (fourth.start, fourth.end) == (300, 400)
    _done(ledger, fourth.id, 300, 399)
    assert ledger.watermark("p", SRC).end == 100
    # An unpinned claim would take the hole; the interval's own retry redoes it, exactly.
    retry = _pin(ledger, 2, (100, 200), try_number=2)
    assert (retry.start, retry.end, retry.status) == (100, 200, RangeStatus.CLAIMED) and retry.id != second.id
    _done(ledger, retry.id, 100, 199)
    mark = ledger.watermark("p", SRC)
    assert (mark.end, mark.last_record) == (400, 399)
    check_invariants(ledger)


def test_a_pinned_rerun_returns_the_range_whoever_committed_it(ledger: Ledger) -> None:
    a = _pin(ledger, 1, (0, 100), initial_start=0)
    _done(ledger, a.id, 0, 99)
    same_run = _pin(ledger, 1, (0, 100))
    other_run = _pin(ledger, 1, (0, 100), name="manual__i1")  # a backfill's new run of the interval
    assert same_run.id == other_run.id == a.id and other_run.status == RangeStatus.COMMITTED
    # The run's own range wins even when the span it asks for now differs (the ledger remembers).
    assert _pin(ledger, 1, (0, 120)).id == a.id
    assert len(ledger.ranges("p")) == 1


def test_a_pinned_span_another_run_holds_is_refused_until_its_holder_is_gone(ledger: Ledger) -> None:
    a = _pin(ledger, 1, (0, 100), initial_start=0)
    with pytest.raises(LedgerError, match=r"\[0, 100\) is claimed by dag/run-i1/read.*one run at a time"):
        _pin(ledger, 1, (0, 100), name="manual__i1")
    _age(ledger, a.id, "heartbeat_at", timedelta(minutes=10))
    b = _pin(ledger, 1, (0, 100), name="manual__i1", abandon_after=timedelta(minutes=5))
    assert (b.start, b.end, b.status) == (0, 100, RangeStatus.CLAIMED) and b.run.run_id == "run-manual__i1"
    assert ledger.get(a.id).status == RangeStatus.FAILED


def test_overlapping_pinned_spans_are_refused_by_the_database(ledger: Ledger) -> None:
    _pin(ledger, 1, (0, 100), initial_start=0)
    with pytest.raises(LedgerError, match="refused"):
        _pin(ledger, 2, (50, 150))
    with pytest.raises(LedgerError, match="refused"):
        _pin(ledger, 2, (10, 20))  # inside


def test_an_empty_range_inside_a_live_one_does_not_hide_it_from_an_overlapping_claim(ledger: Ledger) -> None:
    """An empty interval's range [31, 31) lies inside [29, 39), claimed by another interval's run; a
    pinned claim of [37, 44) overlaps [29, 39) and is refused, whatever lies between their starts."""
    held = _pin(ledger, 3, (29, 39), initial_start=5)
    empty = _pin(ledger, 1, (31, 31))
    assert empty.empty and held.status == RangeStatus.CLAIMED
    with pytest.raises(LedgerError, match="refused"):
        _pin(ledger, 2, (37, 44))
    assert [(r.start, r.end) for r in ledger.ranges("p") if not r.empty] == [(29, 39)]


def test_an_empty_interval_is_committed_empty_and_bad_spans_are_refused(ledger: Ledger) -> None:
    empty = _pin(ledger, 1, (40, 40), initial_start=40)
    assert empty.empty and empty.status == RangeStatus.COMMITTED and empty.interval == _interval(1)
    with pytest.raises(LedgerError, match="reversed"):
        _pin(ledger, 2, (50, 40))
    with pytest.raises(LedgerError, match="needs the span"):
        ledger.claim("p", SRC, 50, run("x"), interval=_interval(2))
    with pytest.raises(LedgerError, match=r"span start .* must be an integer offset"):
        ledger.claim("p", SRC, 50, run("x"), span=(-1, 4))
    # Unpinned claims keep the contiguous rule on a source without pinned ranges.
    other = SRC.__class__(SRC.broker, "other", SRC.super_stream)
    tail = ledger.claim("p", other, 10, run("y"), initial_start=0)
    assert (tail.start, tail.end, tail.interval) == (0, 10, None)


def test_a_gap_before_a_young_pinned_range_is_a_note_until_it_is_stale(ledger: Ledger) -> None:
    """Parallel interval runs: an earlier interval whose run has not come yet is work in flight,
    not a hole in the proof, until the pinned range after it is older than ``stale_after``."""
    first = _pin(ledger, 1, (0, 100), initial_start=0)
    _done(ledger, first.id, 0, 99)
    third = _pin(ledger, 3, (200, 300))
    _done(ledger, third.id, 200, 299)
    fresh = ledger.audit("p")
    assert fresh.clean and [(v.kind.value, v.start, v.end) for v in fresh.notes] == [("gap", 100, 200)]
    stale = ledger.audit("p", stale_after=timedelta(0))
    assert [(v.kind.value, v.start, v.end) for v in stale.violations] == [("gap", 100, 200)]
