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
