"""The ledger's claim/commit/fail/lost/release rules (run on SQLite here, on PostgreSQL by
tests/integration/ledger, which re-collects these tests with a PostgreSQL ``ledger`` fixture)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from streamledger.ledger import (
    UNRECORDED,
    ClaimRequest,
    Ledger,
    LedgerError,
    RangeStatus,
    RunIdentity,
    SourceRef,
)
from tests.unit.ledger.util import SRC, SRC2, check_invariants, run


def test_first_claim_needs_initial_start(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="initial_start"):
        ledger.claim("p", SRC, 100, run(1))
    assert ledger.last_end("p", SRC) is None


def test_claims_are_contiguous_and_idempotent(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 100, run(1), initial_start=10)
    assert (a.start, a.end, a.status) == (10, 100, RangeStatus.CLAIMED)
    assert a.pipeline == "p" and a.source == SRC and a.run == run(1)
    again = ledger.claim("p", SRC, 5000, run(1, try_number=2), initial_start=0)
    assert (again.id, again.start, again.end) == (a.id, 10, 100)
    assert again.run.try_number == 2
    b = ledger.claim("p", SRC, 250, run(2), initial_start=0)  # initial_start ignored after the first range
    assert (b.start, b.end) == (100, 250)
    assert ledger.last_end("p", SRC) == 250
    other = ledger.claim("p", SRC2, 7, run(1), initial_start=3)  # sources are independent
    assert (other.start, other.end) == (3, 7)
    check_invariants(ledger)


def test_commit_rules(ledger: Ledger) -> None:
    r = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    with pytest.raises(LedgerError, match="not inside"):
        ledger.commit(r.id, records=3, first_seen=0, last_seen=100, output=None)
    with pytest.raises(LedgerError, match="cannot fit"):
        ledger.commit(r.id, records=11, first_seen=0, last_seen=9, output=None)
    with pytest.raises(LedgerError, match="0 records"):
        ledger.commit(r.id, records=0, first_seen=1, last_seen=None, output=None)
    with pytest.raises(LedgerError, match="need first_seen"):
        ledger.commit(r.id, records=2, first_seen=None, last_seen=None, output=None)
    c = ledger.commit(r.id, records=90, first_seen=2, last_seen=97, output="/out/p/0-100")
    assert c.status == RangeStatus.COMMITTED and c.committed_at is not None
    assert (c.records, c.first_seen, c.last_seen, c.output) == (90, 2, 97, "/out/p/0-100")
    # an identical repeat (a lost reply) is fine; a different one is refused
    assert ledger.commit(r.id, records=90, first_seen=2, last_seen=97, output="/out/p/0-100").id == r.id
    with pytest.raises(LedgerError, match="already committed"):
        ledger.commit(r.id, records=89, first_seen=2, last_seen=97, output=None)
    with pytest.raises(LedgerError, match="only a claimed range can fail"):
        ledger.fail(r.id, "too late")
    # a rerun of the committed run gets the committed range back, never a new one
    assert ledger.claim("p", SRC, 500, run(1)).id == r.id
    with pytest.raises(LedgerError, match="does not exist"):
        ledger.commit(999_999, records=0, first_seen=None, last_seen=None, output=None)


def test_offset_stored_only_after_commit(ledger: Ledger) -> None:
    r = ledger.claim("p", SRC, 10, run(1), initial_start=0)
    with pytest.raises(LedgerError, match="only stored after a commit"):
        ledger.mark_offset_stored(r.id, True)
    ledger.commit(r.id, records=10, first_seen=0, last_seen=9, output=None)
    ledger.mark_offset_stored(r.id, True)
    got = ledger.get(r.id)
    assert got.offset_stored and got.offset_verified


def test_failed_range_is_reclaimed_as_is(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    b = ledger.claim("p", SRC, 200, run(2))
    ledger.fail(a.id, "spark died")
    ledger.fail(a.id, "again")  # repeat: no-op
    assert ledger.get(a.id).error == "spark died"
    # the next claim, whatever its end_limit, redoes [0, 100) before anything new
    c = ledger.claim("p", SRC, 10_000, run(3))
    assert (c.start, c.end, c.status) == (0, 100, RangeStatus.CLAIMED)
    d = ledger.claim("p", SRC, 300, run(4))
    assert (d.start, d.end) == (200, 300)
    # the failed run's own retry also redoes its span when it is the open hole
    ledger.fail(d.id, "oom")
    retry = ledger.claim("p", SRC, 999, run(4, try_number=2))
    assert (retry.start, retry.end) == (200, 300) and retry.id != d.id
    check_invariants(ledger)
    assert b.status == RangeStatus.CLAIMED
    assert ledger.audit(stale_after=timedelta(hours=1)).clean


def test_an_empty_answer_is_not_stored_and_a_retry_gets_it_again(ledger: Ledger) -> None:
    """Migration 0014: "nothing new" on a source with a history is answered without a row (an idle
    batch adds none per source); the run is recorded once, so its retry gets nothing again even when
    data arrived since. A source's first range is stored even when empty (where the history begins)."""
    a = ledger.claim("p", SRC, 50, run(1), initial_start=0)
    ledger.commit(a.id, records=50, first_seen=0, last_seen=49, output=None)
    e = ledger.claim("p", SRC, 50, run(2))
    assert (e.start, e.end, e.status, e.records) == (50, 50, RangeStatus.COMMITTED, 0) and e.empty
    assert not e.recorded and e.id == UNRECORDED
    e2 = ledger.claim("p", SRC, 10, run(3))  # end_limit behind the tail: still empty at the tail
    assert (e2.start, e2.end) == (50, 50) and not e2.recorded
    again = ledger.claim("p", SRC, 60, run(2))  # idempotent, even when data arrived since
    assert (again.start, again.end, again.status) == (50, 50, RangeStatus.COMMITTED) and not again.recorded
    assert [(r.start, r.end) for r in ledger.ranges("p")] == [(0, 50)]
    with pytest.raises(LedgerError, match="does not exist"):  # nothing to commit
        ledger.commit(e.id, records=0, first_seen=None, last_seen=None, output=None)
    f = ledger.claim("p", SRC, 60, run(4))
    assert (f.start, f.end) == (50, 60)
    first_empty = ledger.claim("p", SRC2, 0, run(1), initial_start=0)
    assert first_empty.empty and first_empty.recorded and ledger.last_end("p", SRC2) == 0
    check_invariants(ledger)
    assert ledger.audit().clean


def test_last_try_counts_an_attempt_answered_nothing_new(ledger: Ledger) -> None:
    """Migration 0015: an attempt answered "nothing new" leaves no range, yet its try is kept with the
    run's idle row, raised by a later try answered so again (single and many-source claims alike),
    never lowered; the ranges' tries count too, and another pipeline or map index is another key."""
    a = ledger.claim("p", SRC, 50, run(1), initial_start=0)
    ledger.commit(a.id, records=50, first_seen=0, last_seen=49, output=None)
    b = ledger.claim("p", SRC2, 5, run(1), initial_start=0)
    ledger.commit(b.id, records=5, first_seen=0, last_seen=4, output=None)
    assert ledger.last_try("p", run(2)) == 0  # never ran
    assert ledger.last_try("p", run(1)) == 1
    assert not ledger.claim("p", SRC, 50, run(2)).recorded  # nothing new
    assert ledger.last_try("p", run(2)) == ledger.last_try("p", run(2, try_number=9)) == 1
    assert not ledger.claim("p", SRC, 70, run(2, try_number=2)).recorded  # the retry: nothing again
    assert ledger.last_try("p", run(2)) == 2
    many = ledger.claim_many("p", [ClaimRequest(SRC, 80), ClaimRequest(SRC2, 9)], run(2, try_number=3))
    assert [(r.start, r.end, r.recorded) for r in many] == [(50, 50, False), (5, 5, False)]
    assert ledger.last_try("p", run(2)) == 3
    assert not ledger.claim("p", SRC, 90, run(2, try_number=1)).recorded  # an older try lowers nothing
    assert ledger.last_try("p", run(2)) == 3
    assert ledger.last_try("other", run(2)) == 0
    assert ledger.last_try("p", RunIdentity("dag", "run-2", "read", 0)) == 0
    c = ledger.claim("p", SRC, 90, run(3, try_number=4))  # a range's try counts as ever
    assert c.recorded and ledger.last_try("p", run(3)) == 4


def test_last_try_counts_a_retry_handed_back_its_committed_range(ledger: Ledger) -> None:
    """Migration 0017: a later try handed back the range its key committed is counted by
    ``last_try`` (single and many-source claims alike) while the range keeps the try that committed
    it; a source the key never claimed answers that retry "nothing new" at its tail, offsets added
    since or not (rule 1, read as for an idle run: a retry takes no new work)."""
    a = ledger.claim("p", SRC, 50, run(1), initial_start=0)
    ledger.commit(a.id, records=50, first_seen=0, last_seen=49, output=None)
    b = ledger.claim("p", SRC2, 5, run(2), initial_start=0)
    ledger.commit(b.id, records=5, first_seen=0, last_seen=4, output=None)
    again = ledger.claim("p", SRC, 90, run(1))  # the same try claims again: nothing to record
    assert again.id == a.id and ledger.last_try("p", run(1)) == 1
    retry = ledger.claim("p", SRC, 90, run(1, try_number=2))
    assert (retry.id, retry.start, retry.end, retry.status) == (a.id, 0, 50, RangeStatus.COMMITTED)
    assert ledger.last_try("p", run(1)) == 2 and ledger.get(a.id).run.try_number == 1
    many = ledger.claim_many("p", [ClaimRequest(SRC, 90), ClaimRequest(SRC2, 9)], run(1, try_number=3))
    assert [(r.id, r.start, r.end) for r in many] == [(a.id, 0, 50), (0, 5, 5)]
    assert ledger.last_try("p", run(1)) == 3
    assert ledger.claim("p", SRC, 90, run(1, try_number=2)).id == a.id  # a zombie lowers nothing
    assert ledger.last_try("p", run(1)) == 3 and ledger.get(a.id).run.try_number == 1
    assert ledger.audit().clean


def test_record_lost(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    ledger.commit(a.id, records=100, first_seen=0, last_seen=99, output=None)
    with pytest.raises(LedgerError, match="must start at the ledger's tail 100"):
        ledger.record_lost("p", SRC, 150, 200, run(2), "retention")
    lost = ledger.record_lost("p", SRC, 100, 200, run(2), "retention removed it")
    assert (lost.start, lost.end, lost.status) == (100, 200, RangeStatus.LOST)
    b = ledger.claim("p", SRC, 400, run(2))
    assert (b.start, b.end) == (200, 400)
    # loss discovered while reading a claim: the claim fails, the rest is redone by the next claim
    part = ledger.record_lost("p", SRC, 200, 260, run(2), "segment deleted during the read")
    assert (part.start, part.end) == (200, 260)
    assert ledger.get(b.id).status == RangeStatus.FAILED
    redo = ledger.claim("p", SRC, 1000, run(3))
    assert (redo.start, redo.end) == (260, 400)
    ledger.commit(redo.id, records=1, first_seen=300, last_seen=300, output=None)
    check_invariants(ledger)
    assert ledger.audit().clean
    with pytest.raises(LedgerError, match="empty or reversed"):
        ledger.record_lost("p", SRC, 5, 5, run(9), "x")


def test_release_stale(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    assert ledger.release_stale(timedelta(hours=1)) == []
    time.sleep(0.05)
    released = ledger.release_stale(timedelta(milliseconds=10))
    assert [r.id for r in released] == [a.id]
    assert released[0].status == RangeStatus.FAILED and "released" in (released[0].error or "")
    with pytest.raises(LedgerError, match="failed; only a claimed range can be committed"):
        ledger.commit(a.id, records=0, first_seen=None, last_seen=None, output=None)
    again = ledger.claim("p", SRC, 50, run(1, try_number=2))
    assert (again.start, again.end) == (0, 100)  # the crashed run's retry redoes its span
    assert ledger.release_stale(timedelta(0), pipeline="other") == []


def test_bad_input_is_named(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match=r"256 bytes of UTF-8.*at most 255"):
        ledger.claim("x" * 256, SRC, 10, run(1), initial_start=0)
    with pytest.raises(LedgerError, match="end_limit for stream 'events-0'"):
        ledger.claim("p", SRC, -1, run(1), initial_start=0)
    with pytest.raises(LedgerError, match="initial_start"):
        ledger.claim("p", SRC, 10, run(1), initial_start=-5)
    with pytest.raises(ValueError):
        SourceRef("", "s")
    assert str(run(1)) == "dag/run-1/read try 1"
    assert str(RunIdentity("d", "r", "t", 3)) == "d/r/t[3] try 1"


def test_ranges_listing(ledger: Ledger) -> None:
    ledger.claim("p", SRC, 10, run(1), initial_start=0)
    ledger.claim("q", SRC, 5, run(1), initial_start=0)
    ledger.claim("p", SRC2, 10, run(1), initial_start=0)
    assert [(r.pipeline, r.source.stream) for r in ledger.ranges()] == [
        ("p", "events-0"),
        ("p", "events-1"),
        ("q", "events-0"),
    ]
    assert len(ledger.ranges("p")) == 2
    assert len(ledger.ranges("p", stream="events-1")) == 1
    d = ledger.ranges("q")[0].to_dict()
    assert d["status"] == "claimed" and d["super_stream"] == "events" and d["committed_at"] is None


def test_redone_hole_next_to_empty_ranges_is_not_redone_twice(ledger: Ledger) -> None:
    """Empty ranges share their start with the next range; they must not hide that a hole was redone."""
    a = ledger.claim("p", SRC, 15, run(1), initial_start=0)
    ledger.commit(a.id, records=0, first_seen=None, last_seen=None, output=None)
    for n in range(2, 6):
        assert ledger.claim("p", SRC, 15, run(n)).empty
    b = ledger.claim("p", SRC, 20, run(6))
    for n in range(7, 10):
        assert ledger.claim("p", SRC, 20, run(n)).empty
    ledger.fail(b.id, "x")
    redo = ledger.claim("p", SRC, 20, run(10))
    assert (redo.start, redo.end) == (15, 20)
    nxt = ledger.claim("p", SRC, 30, run(11))
    assert (nxt.start, nxt.end) == (20, 30)
    check_invariants(ledger)
    assert ledger.audit().clean


def test_lost_span_at_a_hole_away_from_the_tail(ledger: Ledger) -> None:
    """A lost span may start at any hole; the rest of that hole stays failed for the next claim."""
    ledger.claim("p", SRC, 60, run(1), initial_start=0)
    ledger.claim("p", SRC, 72, run(2))
    c = ledger.claim("p", SRC, 106, run(3))
    ledger.record_lost("p", SRC, 60, 71, run(2), "cut")  # run 2's claim fails, [71, 72) stays open
    ledger.fail(c.id, "x")  # hole [72, 106)
    assert ledger.last_end("p", SRC) == 71
    lost = ledger.record_lost("p", SRC, 72, 76, run(9), "retention")
    assert (lost.start, lost.end, lost.status) == (72, 76, RangeStatus.LOST)
    open_spans = ledger.audit(stale_after=timedelta(days=1)).violations
    assert [(v.kind.value, v.start, v.end) for v in open_spans] == [
        ("failed_not_retried", 71, 72),
        ("failed_not_retried", 76, 106),
    ]
    redo = [ledger.claim("p", SRC, 500, run(n)) for n in (10, 11)]
    assert [(r.start, r.end) for r in redo] == [(71, 72), (76, 106)]
    check_invariants(ledger)
