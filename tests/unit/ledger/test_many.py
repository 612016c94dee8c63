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


def test_claim_many_answers_nothing_new_without_a_row(ledger: Ledger) -> None:
    """Migration 0014: an idle source of a batch adds no row (its answer has id 0) and the run is
    recorded once; the batch's other sources are claimed as ever, whichever comes first (an idle
    source before one with data must not make that one "nothing again"); the retry gets the same
    answers though data came since; offsets probed to hold no user record are recorded committed."""
    for s in SOURCES[:4]:
        first = ledger.claim(PIPE, s, 10, run(1), initial_start=0)
        ledger.commit(first.id, records=10, first_seen=0, last_seen=9, output=f"/o/{s.stream}")
    asks = [ClaimRequest(SOURCES[0], 10), ClaimRequest(SOURCES[1], 15), ClaimRequest(SOURCES[2], 10),
            ClaimRequest(SOURCES[3], 11, record_free=(10, 11))]
    got = ledger.claim_many(PIPE, asks, run(2))
    assert [(r.start, r.end, r.status, r.recorded) for r in got] == [
        (10, 10, RangeStatus.COMMITTED, False), (10, 15, RangeStatus.CLAIMED, True),
        (10, 10, RangeStatus.COMMITTED, False), (10, 11, RangeStatus.COMMITTED, True)]
    assert got[3].records == 0
    assert len(ledger.ranges(PIPE)) == 6
    later = [ClaimRequest(s, 20) for s in SOURCES[:4]]
    again = ledger.claim_many(PIPE, later, run(2, try_number=2))
    assert [(r.start, r.end, r.id) for r in again] == [(10, 10, 0), (10, 15, got[1].id), (10, 10, 0),
                                                       (10, 11, got[3].id)]
    assert len(ledger.ranges(PIPE)) == 6
    nxt = ledger.claim_many(PIPE, later, run(3))
    assert [(r.start, r.end, r.status) for r in nxt] == [
        (10, 20, RangeStatus.CLAIMED), (15, 20, RangeStatus.CLAIMED), (10, 20, RangeStatus.CLAIMED),
        (11, 20, RangeStatus.CLAIMED)]
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


def test_first_claim_of_many_new_sources_costs_a_few_statements(ledger: Ledger) -> None:
    # issue 32, item 3: a first batch over 1,000 partitions created each new source with its own
    # statements (find, insert the pipeline, read it, insert the source, lock it, insert the range)
    many = [SourceRef(BROKER, f"new-{i}", "new") for i in range(40)]
    ledger.claim(PIPE, many[0], 10, run(1), initial_start=0)  # one exists already, claimed by run 1
    asks = [ClaimRequest(s, 10 + i, initial_start=3) for i, s in enumerate(many)]
    one_by_one = [(3, 10 + i) for i in range(1, 40)]
    seen = _statements(ledger)
    got = ledger.claim_many(PIPE, asks, run(2))
    assert len(seen) <= 16, seen  # per kind, not per source
    assert [(r.start, r.end) for r in got] == [(10, 10), *one_by_one]
    assert [r.source.stream for r in got] == [s.stream for s in many]
    assert {r.status for r in got[1:]} == {RangeStatus.CLAIMED} and got[0].status == RangeStatus.COMMITTED
    # the same run again gets the same ranges (no second source row, no second claim)
    assert [r.id for r in ledger.claim_many(PIPE, asks, run(2, try_number=2))] == [r.id for r in got]
    assert len({(r.source.broker, r.source.stream) for r in ledger.ranges(PIPE)}) == 40
    # a refused claim among new sources creates none of them
    more = [SourceRef(BROKER, f"more-{i}", "new") for i in range(3)]
    with pytest.raises(LedgerError, match=r"more-2.*initial_start"):
        ledger.claim_many(PIPE, [ClaimRequest(s, 5, initial_start=0) for s in more[:2]]
                          + [ClaimRequest(more[2], 5)], run(3))
    assert ledger.last_end(PIPE, more[0]) is None and ledger.position(PIPE, more[0]).end is None
    check_invariants(ledger, PIPE)


def test_commit_many_of_many_ranges_costs_a_few_statements(ledger: Ledger) -> None:
    # issue 32, item 3: commit_many ran the one-range commit per range
    many = [SourceRef(BROKER, f"c-{i}", "c") for i in range(40)]
    done = ledger.claim_many(PIPE, [ClaimRequest(s, 10, initial_start=0) for s in many], run(1))
    asks = [CommitRequest(r.id, 2, 3, 4, f"/o/{r.id}", staging=f"/st/{r.id}", publisher="me")
            for r in done[:38]]
    asks.append(CommitRequest(done[38].id, 0, None, None, None))
    one = ledger.commit(done[39].id, records=1, first_seen=5, last_seen=5, output="/o/x")
    seen = _statements(ledger)
    got = ledger.commit_many(asks)
    assert len(seen) <= 8, seen  # not per range
    assert [r.id for r in got] == [r.id for r in done[:39]]
    assert [(r.status, r.records, r.first_seen, r.last_seen, r.publisher, r.staging) for r in got[:2]] == [
        (RangeStatus.COMMITTED, 2, 3, 4, "me", f"/st/{done[i].id}") for i in range(2)]
    assert got[0].output == f"/o/{done[0].id}" and got[0].published_at is None
    assert (got[38].records, got[38].publisher, got[38].output) == (0, None, None)
    assert one.published_at is not None  # no staging: published with the commit
    # an identical repeat (and the one committed alone) come back unchanged, as commit() gives them
    again = ledger.commit_many([*asks[:2], CommitRequest(one.id, 1, 5, 5, "/o/x")])
    assert [(r.id, r.committed_at) for r in again] == [(r.id, r.committed_at) for r in [*got[:2], one]]
    # a different commit of a committed range, or a range not claimed, refuses all: nothing changes
    fresh = ledger.claim_many(PIPE, [ClaimRequest(s, 20) for s in many[:3]], run(2))
    before = {r.id: (r.status, r.records) for r in ledger.ranges(PIPE)}
    with pytest.raises(LedgerError, match=rf"range {done[1].id} .*already committed with records=2"):
        ledger.commit_many([CommitRequest(fresh[0].id, 1, 12, 12, "/o/f"),
                            CommitRequest(done[1].id, 1, 3, 3, "/o/other")])
    ledger.fail(fresh[2].id, "boom")
    with pytest.raises(LedgerError, match=rf"range {fresh[2].id} .* is failed; only a claimed range"):
        ledger.commit_many([CommitRequest(fresh[1].id, 1, 12, 12, "/o/f"),
                            CommitRequest(fresh[2].id, 1, 12, 12, "/o/g")])
    with pytest.raises(LedgerError, match=r"range 99999 does not exist"):
        ledger.commit_many([CommitRequest(fresh[1].id, 1, 12, 12, "/o/f"),
                            CommitRequest(99999, 0, None, None, None)])
    with pytest.raises(LedgerError, match=rf"range {fresh[1].id} .*offsets 30..30 are not inside \[10, 20\)"):
        ledger.commit_many([CommitRequest(fresh[0].id, 1, 12, 12, "/o/f"),
                            CommitRequest(fresh[1].id, 1, 30, 30, "/o/g")])
    after = {r.id: (r.status, r.records) for r in ledger.ranges(PIPE)}
    assert after == {**before, fresh[2].id: (RangeStatus.FAILED, None)}
    check_invariants(ledger, PIPE)


def test_mark_published_many_costs_a_few_statements(ledger: Ledger) -> None:
    # issue 32, item 3: mark_published_many ran the one-range code per range
    many = [SourceRef(BROKER, f"m-{i}", "m") for i in range(40)]
    done = ledger.claim_many(PIPE, [ClaimRequest(s, 10, initial_start=0) for s in many], run(1))
    ledger.commit_many([CommitRequest(r.id, 2, 3, 4, f"/o/{r.id}", staging=f"/st/{r.id}", publisher="me")
                        for r in done[:39]])
    ids = [r.id for r in done[:39]]
    already = ledger.mark_published(ids[0], "me")
    seen = _statements(ledger)
    got = ledger.mark_published_many(ids, "me")
    assert len(seen) <= 6, seen  # not per range
    assert [r.id for r in got] == ids and all(r.published_at is not None for r in got)
    assert got[0].published_at == already.published_at  # idempotent for its publisher
    # refused as mark_published refuses: another lease holder, a range not committed; nothing marked
    more = ledger.claim_many(PIPE, [ClaimRequest(s, 20) for s in many[:3]], run(2))
    ledger.commit_many([CommitRequest(r.id, 1, 12, 12, f"/o/{r.id}", staging="/st", publisher="other")
                        for r in more[:2]])
    with pytest.raises(LedgerError, match=rf"range {more[1].id} .*held by other, not me"):
        ledger.mark_published_many([ids[1], more[1].id], "me")
    with pytest.raises(LedgerError, match=rf"range {more[2].id} .*is claimed; only a committed range"):
        ledger.mark_published_many([more[0].id, more[2].id], "other")
    assert [r.published_at for r in ledger.ranges(PIPE) if r.id in (more[0].id, more[1].id)] == [None, None]
    check_invariants(ledger, PIPE)


def test_take_publish_many_costs_a_few_statements_and_decides_as_take_publish(ledger: Ledger) -> None:
    # issue 44, item 1: take_publish_many ran take_publish per range (a load and a flush each)
    many = [SourceRef(BROKER, f"l-{i}", "l") for i in range(40)]
    done = ledger.claim_many(PIPE, [ClaimRequest(s, 10, initial_start=0) for s in many], run(1))
    ledger.commit_many([CommitRequest(r.id, 2, 3, 4, f"/o/{r.id}", staging=f"/st/{r.id}",
                                      publisher="other" if i == 1 else "me")  # 1: another's live lease
                        for i, r in enumerate(done[:36])])
    ledger.commit_many([CommitRequest(r.id, 0, None, None, None) for r in done[36:38]])  # nothing to publish
    ids = [r.id for r in done]
    ledger.mark_published(ids[2], "me")  # published already
    seen = _statements(ledger)
    got = ledger.take_publish_many([(i, None) for i in ids[:38]] + [(ids[0], None)], "me",
                                   lease=timedelta(minutes=5))
    assert len(seen) <= 6, seen  # not per range
    assert got[1] is None and got[2] is None and got[36] is None and got[37] is None
    taken = [g for i, g in enumerate(got[:36]) if i not in (1, 2)]
    assert all(g is not None and g.publisher == "me" for g in taken), got
    assert got[38] is not None and got[38].id == ids[0]  # asked twice: its own lease again
    # the holder named as gone is replaced, as take_publish replaces it; claimed ranges are refused
    again = ledger.take_publish_many([(ids[1], "other")], "me", lease=timedelta(minutes=5))
    assert again[0] is not None and again[0].publisher == "me"
    assert ledger.take_publish_many([(ids[38], None)], "me", lease=timedelta(minutes=5)) == [None]
    with pytest.raises(LedgerError, match="lease must not be negative"):
        ledger.take_publish_many([(ids[0], None)], "me", lease=timedelta(seconds=-1))
    with pytest.raises(LedgerError, match="does not exist"):
        ledger.take_publish_many([(ids[0], None), (10**9, None)], "me", lease=timedelta(minutes=5))
    check_invariants(ledger, PIPE)


def test_tails_seen_on_many_sources_cost_a_few_statements(ledger: Ledger) -> None:
    # issue 32, item 3: every batch (idle ones too) remembers the tail it saw on each partition
    many = [SourceRef(BROKER, f"t-{i}", "t") for i in range(40)]
    ledger.claim_many(PIPE, [ClaimRequest(s, 10, initial_start=0) for s in many], run(1))
    seen = _statements(ledger)
    ledger.saw_tails(PIPE, {s: 10 + i for i, s in enumerate(many)})
    assert len(seen) <= 4, seen  # not per source
    del seen[:]
    ledger.saw_tails(PIPE, {s: 10 + i - (i % 2) * 5 for i, s in enumerate(many)})  # the same or lower
    assert len(seen) <= 3, seen
    ledger.saw_tails(PIPE, {many[0]: 99, SourceRef(BROKER, "no-history", "t"): 5})
    with ledger.engine.connect() as conn:
        from sqlalchemy import text
        got = dict(conn.execute(text("SELECT stream, seen_tail FROM streamledger_source")).all())
    assert got == {**{s.stream: 10 + i for i, s in enumerate(many)}, "t-0": 99}
