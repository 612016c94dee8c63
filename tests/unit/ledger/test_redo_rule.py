"""The claim rule's redo step (rule 2 of docs/ledger.md): every offset a failed range held that no
live (claimed, committed, lost) range covers is claimable again, a failed range only partly covered
included, and the watermark stops at the first such offset. Re-collected against PostgreSQL (the
server-side ``streamledger_claim``) by tests/integration/ledger/test_redo_rule_pg.py."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from streamledger.ledger import Ledger, RangeStatus, ViolationKind
from streamledger.ledger.statements import OWN_FAILED, redo_points_sql, redo_spans_sql
from streamledger.migrations.revisions import function_text
from tests.unit.ledger.test_pinned_claims import _done, _pin
from tests.unit.ledger.util import SRC, check_invariants, run

P = "p"


def _span(rng) -> tuple[int, int, str]:  # type: ignore[no-untyped-def]
    return rng.start, rng.end, rng.status.value


def _three_released_claims(ledger: Ledger) -> None:
    """The property test's sequence: lost at the tail [5, 7), three claims [7, 9), [9, 12),
    [12, 14), all released (their holders gone): the tail is back at 7, three holes after it."""
    ledger.record_lost(P, SRC, 5, 7, run(0), "retention")
    claims = [ledger.claim(P, SRC, end, run(k), initial_start=5) for k, end in ((1, 9), (2, 12), (3, 14))]
    assert [_span(c) for c in claims] == [(7, 9, "claimed"), (9, 12, "claimed"), (12, 14, "claimed")]
    assert len(ledger.release_stale(timedelta(0), pipeline=P)) == 3


def test_the_uncovered_rest_of_a_partly_covered_failed_range_is_claimed_again(ledger: Ledger) -> None:
    """A lost span at the tail reaching into the second hole ([7, 10) over [9, 12)): [10, 12) was
    held by a failed claim and nothing covers it; the next claim takes it before the hole after it,
    so the history closes without a gap."""
    _three_released_claims(ledger)
    ledger.record_lost(P, SRC, 7, 10, run(4), "retention")
    assert ledger.watermark(P, SRC).end == 10
    rest = ledger.claim(P, SRC, 20, run(5))
    assert _span(rest) == (10, 12, "claimed")
    _done(ledger, rest.id, 10, 11)
    nxt = ledger.claim(P, SRC, 20, run(6))
    assert _span(nxt) == (12, 14, "claimed")  # then the whole hole, then the tail
    _done(ledger, nxt.id, 12, 13)
    tail = ledger.claim(P, SRC, 20, run(7))
    assert _span(tail) == (14, 20, "claimed")
    _done(ledger, tail.id, 14, 19)
    assert ledger.watermark(P, SRC).end == 20
    check_invariants(ledger)
    report = ledger.audit(P, stale_after=timedelta(0))
    assert report.clean, report.to_text()


def test_an_uncovered_rest_below_the_tail_is_claimed_and_the_watermark_waits_for_it(ledger: Ledger) -> None:
    """The rest [10, 12) lies below the tail once a lost span is recorded at the start of the hole
    after it ([12, 13), whose remainder [13, 14) is a hole of its own): the watermark stops at 10,
    not at 13, and the next claims take [10, 12), then [13, 14)."""
    _three_released_claims(ledger)
    ledger.record_lost(P, SRC, 7, 10, run(4), "retention")
    ledger.record_lost(P, SRC, 12, 13, run(4), "retention")
    assert ledger.watermark(P, SRC).end == 10  # never past offsets nobody read
    position = ledger.position(P, SRC)
    assert {(h.start, h.end) for h in position.holes} >= {(9, 12), (13, 14)}  # both are work to redo
    rest = ledger.claim(P, SRC, 20, run(5))
    assert _span(rest) == (10, 12, "claimed")
    _done(ledger, rest.id, 10, 11)
    assert ledger.watermark(P, SRC).end == 13
    last = ledger.claim(P, SRC, 20, run(6))
    assert _span(last) == (13, 14, "claimed")
    _done(ledger, last.id, 13, 13)
    check_invariants(ledger)
    report = ledger.audit(P, stale_after=timedelta(0))
    assert report.clean, report.to_text()


def test_the_rest_between_two_live_ranges_is_claimed_exactly(ledger: Ledger) -> None:
    """A failed claim [0, 30) with a lost head [0, 10) and a lost span [20, 25) inside what it held:
    the next claims redo exactly [10, 20), then [25, 30), never overlapping what is covered."""
    a = ledger.claim(P, SRC, 30, run(1), initial_start=0)
    ledger.fail(a.id, "executor lost")
    ledger.record_lost(P, SRC, 0, 10, run(2), "retention")  # at the hole's start: remainder [10, 30)
    b = ledger.claim(P, SRC, 40, run(3))
    assert _span(b) == (10, 30, "claimed")
    ledger.fail(b.id, "executor lost")
    ledger.record_lost(P, SRC, 10, 20, run(4), "retention")  # remainder [20, 30)
    c = ledger.claim(P, SRC, 40, run(5))
    assert _span(c) == (20, 30, "claimed")
    assert ledger.record_lost(P, SRC, 20, 25, run(5), "retention").status == RangeStatus.LOST
    d = ledger.claim(P, SRC, 40, run(6))
    assert _span(d) == (25, 30, "claimed")
    _done(ledger, d.id, 25, 29)
    assert ledger.watermark(P, SRC).end == 30
    check_invariants(ledger)
    assert ledger.audit(P, stale_after=timedelta(0)).clean


def test_a_pinned_retry_gets_back_the_rest_of_its_failed_span_another_run_left(ledger: Ledger) -> None:
    """Interval 1 claimed [10, 30) and failed; a manual run of it committed [15, 30). The interval's
    retry gets back what its failed claim held and nothing covers, [10, 15) (not a refusal for
    overlapping [15, 30), and not a gap for ever); then the history is whole."""
    first = _pin(ledger, 1, (10, 30), initial_start=10)
    ledger.fail(first.id, "executor lost")
    other = _pin(ledger, 1, (15, 30), name="manual__i1")
    _done(ledger, other.id, 15, 29)
    assert ledger.watermark(P, SRC).end == 10
    retry = _pin(ledger, 1, (10, 30), try_number=2)
    assert (retry.start, retry.end, retry.status) == (10, 15, RangeStatus.CLAIMED)
    _done(ledger, retry.id, 10, 14)
    assert ledger.watermark(P, SRC).end == 30
    check_invariants(ledger)
    report = ledger.audit(P, stale_after=timedelta(0))
    assert report.clean, report.to_text()
    assert not report.of_kind(ViolationKind.GAP)


def test_a_pinned_retry_gets_back_every_separate_piece_of_its_failed_span(ledger: Ledger) -> None:
    """Interval 1 claimed [10, 50) and failed; a run of a narrower interval committed [20, 30) inside
    it. What the failed claim held and nothing covers is two pieces, [10, 20) and [30, 50): the
    interval's retry gets the lower one, and its next claim (the batch claims again while pieces are
    left) the upper one, never left a gap for ever; once none is left, its claims are idempotent."""
    first = _pin(ledger, 1, (10, 50), initial_start=10)
    ledger.fail(first.id, "executor lost")
    inner = _pin(ledger, 1, (20, 30), name="manual__i1")
    _done(ledger, inner.id, 20, 29)
    low = _pin(ledger, 1, (10, 50), try_number=2)
    assert (low.start, low.end, low.status) == (10, 20, RangeStatus.CLAIMED)
    _done(ledger, low.id, 10, 19)
    assert ledger.own_redo_left(P, [SRC], run("i1", 2)) == [True]
    high = _pin(ledger, 1, (10, 50), try_number=2)
    assert (high.start, high.end, high.status) == (30, 50, RangeStatus.CLAIMED)
    assert _span(_pin(ledger, 1, (10, 50), try_number=3)) == (30, 50, "claimed")  # its claim: rule 1
    _done(ledger, high.id, 30, 49)
    assert ledger.own_redo_left(P, [SRC], run("i1", 2)) == [False]
    again = _pin(ledger, 1, (10, 50), try_number=4)
    assert again.id in (low.id, high.id) and again.status == RangeStatus.COMMITTED
    assert ledger.watermark(P, SRC).end == 50
    check_invariants(ledger)
    report = ledger.audit(P, stale_after=timedelta(0))
    assert report.clean, report.to_text()


def test_retentions_loss_is_recorded_at_the_uncovered_rest_of_a_failed_range(ledger: Ledger) -> None:
    """A failed claim [0, 30) whose head [0, 10) a lost span covers, and a pinned range [20, 25)
    inside it: the rest [10, 20) is what the claim rule redoes next. When retention took it, the
    truthful record is a lost span right there (before: refused, "must start at the ledger's tail"),
    and what follows it in the failed range, [25, 30), stays to redo."""
    a = ledger.claim(P, SRC, 30, run(1), initial_start=0)
    ledger.fail(a.id, "executor lost")
    ledger.record_lost(P, SRC, 0, 10, run(2), "retention")  # at the hole: remainder [10, 30)
    inner = _pin(ledger, 1, (20, 25), name="manual")
    _done(ledger, inner.id, 20, 24)
    lost = ledger.record_lost(P, SRC, 10, 20, run(3), "retention removed [10, 20)")
    assert _span(lost) == (10, 20, "lost")
    assert ledger.watermark(P, SRC).end == 25
    rest = ledger.claim(P, SRC, 40, run(4))
    assert _span(rest) == (25, 30, "claimed")
    _done(ledger, rest.id, 25, 29)
    assert ledger.watermark(P, SRC).end == 30
    check_invariants(ledger)
    report = ledger.audit(P, stale_after=timedelta(0))
    assert report.clean, report.to_text()


def test_postgresql_claims_by_the_same_redo_statement_as_sqlite(ledger: Ledger) -> None:
    """One rule in one place: the claim function of migration 0011 (sql/streamledger_claim/0011.sql,
    and every later version) holds a frozen copy of the redo statement both dialects run; the copy
    is the statement, and PostgreSQL runs it."""
    assert redo_spans_sql("= sid") in function_text("streamledger_claim", "0011")
    if ledger.engine.dialect.name == "postgresql":
        with ledger.engine.connect() as conn:
            body = conn.execute(text("SELECT prosrc FROM pg_proc WHERE proname = 'streamledger_claim'")
                                ).scalar_one()
        assert redo_spans_sql("= sid") in body


def test_postgresql_answers_a_pinned_run_by_the_same_own_redo_statement_as_sqlite(ledger: Ledger) -> None:
    """Migration 0012's rule 1 (sql/streamledger_claim/0012.sql, and every later version) holds a
    frozen copy of the redo points of a run's own failed pinned claims (its parameters spelled as
    the function's); the copy is the statement, and PostgreSQL runs it."""
    own = redo_points_sql("= sid", OWN_FAILED.replace(":", "p_"))
    assert own in function_text("streamledger_claim", "0012")
    if ledger.engine.dialect.name == "postgresql":
        with ledger.engine.connect() as conn:
            body = conn.execute(text("SELECT prosrc FROM pg_proc WHERE proname = 'streamledger_claim'")
                                ).scalar_one()
        assert own in body
