"""Issue 24: a batch's claims and commits of all its sources in one transaction, by the same rule
as one source at a time (re-run against PostgreSQL in tests/integration/ledger/test_many_pg.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from streamledger.ledger import ClaimRequest, CommitRequest, Ledger, LedgerError, RangeStatus, SourceRef
from tests.unit.ledger.util import BROKER, check_invariants, run

PIPE = "p-many"
SOURCES = [SourceRef(BROKER, f"events-{i}", "events") for i in range(5)]


def test_claim_many_gives_what_claim_gives(ledger: Ledger) -> None:
    # history that exercises every branch of the rule: a held range, a hole, a plain tail, a new source
    ledger.claim(PIPE, SOURCES[0], 10, run(1), initial_start=0)                      # held by run 2 below
    held = ledger.claim(PIPE, SOURCES[1], 10, run(2), initial_start=0)
    failed = ledger.claim(PIPE, SOURCES[2], 10, run(1), initial_start=0)
    ledger.fail(failed.id, "boom")                                                   # a hole [0, 10)
    done = ledger.claim(PIPE, SOURCES[3], 10, run(1), initial_start=0)
    ledger.commit(done.id, records=0, first_seen=None, last_seen=None, output=None)
    asks = [ClaimRequest(s, 20, initial_start=5) for s in SOURCES]
    got = ledger.claim_many(PIPE, asks, run(2), max_span=7, abandon_after=timedelta(hours=1))
    assert [r.source.stream for r in got] == [s.stream for s in SOURCES]
    assert {r.status for r in got} == {RangeStatus.CLAIMED}
    assert [(r.start, r.end) for r in got] == [(10, 17), (held.start, held.end), (0, 10), (10, 17), (5, 12)]
    assert got[1].id == held.id
    # a retry of the same run gets the same ranges back, as claim() would
    again = ledger.claim_many(PIPE, asks, run(2, try_number=2))
    assert [r.id for r in again] == [r.id for r in got]
    check_invariants(ledger, PIPE)


def test_one_refused_claim_claims_nothing(ledger: Ledger) -> None:
    ledger.claim(PIPE, SOURCES[0], 10, run(1), initial_start=0)
    asks = [ClaimRequest(SOURCES[1], 10, initial_start=0), ClaimRequest(SOURCES[2], 10)]  # no initial_start
    with pytest.raises(LedgerError, match=r"events-2.*initial_start"):
        ledger.claim_many(PIPE, asks, run(2))
    assert [r.source.stream for r in ledger.ranges(PIPE)] == ["events-0"]
    with pytest.raises(LedgerError, match="named twice"):
        ledger.claim_many(PIPE, [asks[0], asks[0]], run(2))


def test_commit_many_is_all_or_nothing(ledger: Ledger) -> None:
    got = ledger.claim_many(PIPE, [ClaimRequest(s, 10, initial_start=0) for s in SOURCES[:3]], run(1))
    bad = [CommitRequest(got[0].id, 2, 3, 4, "/out/a"), CommitRequest(got[1].id, 1, 50, 50, "/out/b")]
    with pytest.raises(LedgerError, match="not inside"):
        ledger.commit_many(bad)
    assert {r.status for r in ledger.ranges(PIPE)} == {RangeStatus.CLAIMED}
    done = ledger.commit_many([CommitRequest(got[0].id, 2, 3, 4, "/out/a", staging="/st/a", publisher="me"),
                               CommitRequest(got[1].id, 0, None, None, None)])
    assert [(r.status, r.records, r.publisher) for r in done] == [(RangeStatus.COMMITTED, 2, "me"),
                                                                  (RangeStatus.COMMITTED, 0, None)]
    # an identical repeat returns them unchanged, as commit() does
    assert [r.id for r in ledger.commit_many([CommitRequest(got[0].id, 2, 3, 4, "/out/a")])] == [got[0].id]
    ledger.mark_offsets_stored([got[0].id], True)
    marks = ledger.watermarks(PIPE, SOURCES[:3])
    assert [m.end for m in marks] == [0, 10, 0]
    positions = ledger.positions(PIPE, SOURCES[:4])
    assert [p.end for p in positions] == [10, 10, 10, None]
    assert positions[0].stored == 4 and positions[0].watermark.end == 0  # unpublished: the watermark waits
    check_invariants(ledger, PIPE)


def test_claim_many_carries_pinned_claims(ledger: Ledger) -> None:
    # issue 25 through the batched path: each source's span and interval reach the claim rule
    when = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 5, tzinfo=UTC))
    later = ledger.claim(PIPE, SOURCES[0], 300, run(9), initial_start=0, span=(200, 300),
                         interval=(when[1], when[1] + timedelta(minutes=5)))
    asks = [ClaimRequest(SOURCES[0], 100, span=(0, 100), interval=when),
            ClaimRequest(SOURCES[1], 50, initial_start=10, span=(40, 50), interval=when)]
    got = ledger.claim_many(PIPE, asks, run(1), max_span=5)  # max_span does not apply to a pinned claim
    assert [(r.start, r.end, r.interval) for r in got] == [(0, 100, when), (40, 50, when)]
    assert later.start == 200 and ledger.watermark(PIPE, SOURCES[1]).end == 10  # origin 10: [10, 40) a gap
    # a span overlapping a live range is refused, and then no source of the batch is claimed
    clash = [ClaimRequest(SOURCES[2], 20, initial_start=0, span=(0, 20), interval=when),
             ClaimRequest(SOURCES[0], 300, span=(250, 300), interval=when)]
    with pytest.raises(LedgerError):
        ledger.claim_many(PIPE, clash, run(2))
    assert ledger.position(PIPE, SOURCES[2]).end is None  # (pinned gaps: no check_invariants here)


def _statements(ledger: Ledger) -> list[str]:
    """Every SQL statement the ledger's engine runs from now on (appended as they run)."""
    from sqlalchemy import event

    seen: list[str] = []
    event.listen(ledger.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def test_positions_and_watermarks_of_many_sources_cost_a_few_statements(ledger: Ledger) -> None:
    # sources in every state the rule distinguishes: done + stored, an open claim, a hole, committed
    # but unpublished, pinned with a gap, no history; then 40 more plain ones
    many = [SourceRef(BROKER, f"s-{i}", "s") for i in range(46)]
    asks = [ClaimRequest(s, 10 + i, initial_start=0) for i, s in enumerate(many[:45])]
    done = ledger.claim_many(PIPE, asks, run(1))
    ledger.commit_many([CommitRequest(r.id, 2, r.start, r.start + 1, f"/o/{r.id}") for r in done])
    ledger.mark_offsets_stored([done[0].id], True)
    ledger.claim(PIPE, many[1], 50, run(2))                                   # open claim [11, 50)
    ledger.fail(ledger.claim(PIPE, many[2], 50, run(2)).id, "boom")           # hole [12, 50)
    unpub = ledger.claim(PIPE, many[3], 50, run(2))
    ledger.commit(unpub.id, records=1, first_seen=20, last_seen=20, output="/o/u", staging="/st/u",
                  publisher="me")                                            # unpublished [13, 50)
    when = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 5, tzinfo=UTC))
    ledger.claim(PIPE, many[4], 99, run(3), span=(80, 99), interval=when)     # pinned: gap [14, 80)
    one_by_one = [ledger.positions(PIPE, [s])[0] for s in many]
    marks_alone = [ledger.watermarks(PIPE, [s])[0] for s in many]
    seen = _statements(ledger)
    together = ledger.positions(PIPE, many, stale_after=timedelta(hours=1))
    assert len(seen) <= 12, seen  # per kind, not per source (a pinned source walks its own gap)
    del seen[:]
    assert ledger.watermarks(PIPE, many) == marks_alone
    assert len(seen) <= 8, seen
    assert [p.watermark for p in together] == marks_alone
    assert [(p.end, p.stored, p.frontier, p.open_claims, p.holes) for p in together] == [
        (p.end, p.stored, p.frontier, p.open_claims, p.holes) for p in one_by_one]
    assert [m.end for m in marks_alone[:6]] + [marks_alone[45].end] == [10, 11, 12, 13, 14, 15, None]
    assert marks_alone[0].last_record == 1 and together[0].stored == 1
    assert marks_alone[1].blocked_by is not None and marks_alone[3].unpublished is not None
    assert [len(p.holes) for p in together[:3]] == [0, 0, 1] and together[45].end is None
    assert ledger.unpublished_many(PIPE, many) == [
        r for s in many for r in ledger.unpublished_many(PIPE, [s])]


def test_offsets_stored_for_many_ranges_cost_a_few_statements(ledger: Ledger) -> None:
    # issue 32: a batch over 1,000 partitions records its StoreOffsets for every range at once
    many = [SourceRef(BROKER, f"st-{i}", "st") for i in range(40)]
    done = ledger.claim_many(PIPE, [ClaimRequest(s, 10, initial_start=0) for s in many], run(1))
    ledger.commit_many([CommitRequest(r.id, 2, r.start, r.start + 1, f"/o/{r.id}") for r in done[:39]])
    seen = _statements(ledger)
    ledger.mark_offsets_stored([r.id for r in done[:39]], True)
    assert len(seen) <= 6, seen  # not per range
    stored = {r.id: (r.offset_stored, r.offset_verified) for r in ledger.ranges(PIPE)}
    assert all(stored[r.id] == (True, True) for r in done[:39])
    # one range not committed: refused as mark_offset_stored refuses it, and nothing is marked
    with pytest.raises(LedgerError, match="is claimed; the broker offset is only stored after a commit"):
        ledger.mark_offsets_stored([done[0].id, done[39].id], False)
    now = {r.id: (r.offset_stored, r.offset_verified) for r in ledger.ranges(PIPE)}
    assert now[done[0].id] == (True, True)
    check_invariants(ledger, PIPE)
