"""Issue 10's ledger rules: the one claim rule (span cap, abandoned claims), heartbeats, the
watermark the broker's stored offset must follow, byte-limited pipeline names and one history per
broker. Re-collected against PostgreSQL by tests/integration/ledger/test_claim_rule_pg.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from streamledger.ledger import Ledger, LedgerError, RangeStatus, SourceRef
from tests.unit.ledger.util import SRC, check_invariants, run


def _age(ledger: Ledger, range_id: int, column: str, by: timedelta) -> None:
    when = datetime.now(UTC).replace(tzinfo=None) - by
    with ledger.engine.begin() as conn:
        statement = text(f"UPDATE streamledger_range SET {column} = :at WHERE id = :id")
        conn.execute(statement, {"at": when, "id": range_id})


def test_max_span_caps_a_new_tail_range_but_never_a_hole(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 1000, run(1), initial_start=0, max_span=100)
    assert (a.start, a.end) == (0, 100)
    ledger.fail(a.id, "boom")
    hole = ledger.claim("p", SRC, 1000, run(2), max_span=10)  # a hole is redone with its exact span
    assert (hole.start, hole.end) == (0, 100)
    nxt = ledger.claim("p", SRC, 130, run(3), max_span=100)
    assert (nxt.start, nxt.end) == (100, 130)


def test_abandoned_claim_is_failed_and_its_span_redone_in_the_same_claim(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    # A fresh claim of another run is left alone: the next run gets the next span.
    b = ledger.claim("p", SRC, 200, run(2), abandon_after=timedelta(minutes=5))
    assert (b.start, b.end) == (100, 200)
    ledger.commit(b.id, records=1, first_seen=150, last_seen=150, output=None)
    _age(ledger, a.id, "heartbeat_at", timedelta(minutes=10))
    c = ledger.claim("p", SRC, 300, run(3), abandon_after=timedelta(minutes=5))
    assert (c.start, c.end) == (0, 100)  # the abandoned span, before any new tail
    old = ledger.get(a.id)
    assert old.status == RangeStatus.FAILED and "abandoned" in (old.error or "")
    # The fenced holder cannot commit any more (its claim was taken).
    with pytest.raises(LedgerError, match="failed; only a claimed range can be committed"):
        ledger.commit(a.id, records=0, first_seen=None, last_seen=None, output=None)
    check_invariants(ledger)


def test_heartbeat_keeps_a_long_claim_and_reports_a_lost_one(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    _age(ledger, a.id, "claimed_at", timedelta(hours=3))  # a three-hour Spark job...
    _age(ledger, a.id, "heartbeat_at", timedelta(minutes=2))
    assert ledger.heartbeat([a.id], run(1)) == [a.id]  # ...that still beats
    assert ledger.release_stale(timedelta(hours=1)) == []
    assert ledger.claim("p", SRC, 200, run(2), abandon_after=timedelta(minutes=5)).start == 100
    assert ledger.heartbeat([a.id], run(9)) == []  # not the holder
    ledger.fail(a.id, "operator")
    assert ledger.heartbeat([a.id], run(1)) == []  # lost: the batch must stop


def test_watermark_stops_at_an_open_claim_and_at_a_hole(ledger: Ledger) -> None:
    assert ledger.watermark("p", SRC).end is None
    a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    b = ledger.claim("p", SRC, 200, run(2))
    ledger.commit(b.id, records=3, first_seen=120, last_seen=180, output=None)
    mark = ledger.watermark("p", SRC)
    assert (mark.end, mark.last_record) == (0, None)  # [100, 200) waits behind the open claim
    assert mark.blocked_by is not None and mark.blocked_by.id == a.id
    assert mark.accepts(None) and not mark.accepts(199) and not mark.accepts(0)
    ledger.fail(a.id, "killed")
    mark = ledger.watermark("p", SRC)
    assert (mark.end, mark.last_record, mark.blocked_by) == (0, None, None)  # now a hole stops it
    redo = ledger.claim("p", SRC, 500, run(3))
    assert (redo.start, redo.end) == (0, 100)
    ledger.commit(redo.id, records=2, first_seen=5, last_seen=90, output=None)
    mark = ledger.watermark("p", SRC)
    assert (mark.end, mark.last_record) == (200, 180)  # filled: the prefix covers both ranges
    assert mark.accepts(180) and mark.accepts(199) and not mark.accepts(179) and not mark.accepts(200)
    # Offsets without records (an empty-handed commit) move the end, not the last record.
    c = ledger.claim("p", SRC, 210, run(4))
    ledger.commit(c.id, records=0, first_seen=None, last_seen=None, output=None)
    assert (ledger.watermark("p", SRC).end, ledger.watermark("p", SRC).last_record) == (210, 180)


def test_pipeline_names_are_limited_in_bytes(ledger: Ledger) -> None:
    ledger.claim("é" * 127, SRC, 10, run(1), initial_start=0)  # 254 bytes: fine
    with pytest.raises(LedgerError, match="256 bytes of UTF-8; the broker's consumer reference allows"):
        ledger.claim("é" * 128, SRC, 10, run(1), initial_start=0)


def test_rename_broker_moves_a_history_and_refuses_to_merge_two(ledger: Ledger) -> None:
    old = SourceRef("rabbitmq://127.0.0.1:5552/%2F", "s-0", "s")
    new = SourceRef("rabbitmq://rabbit@cluster/%2F", "s-0", "s")
    r = ledger.claim("p", old, 50, run(1), initial_start=0)
    assert ledger.rename_broker(old.broker, new.broker) == 1
    again = ledger.claim("p", new, 500, run(1))
    assert again.id == r.id  # the same history, found under the new name
    ledger.claim("p", old, 10, run(2), initial_start=0)
    with pytest.raises(LedgerError, match="already has a history under broker"):
        ledger.rename_broker(old.broker, new.broker)


def test_adopt_identity_takes_over_other_spellings_and_never_merges_two(ledger: Ledger) -> None:
    """Issue 30, defect 8: rows recorded under `…/%2f` (and a retired epoch of them, and a 0.1
    host:port row) belong to `…/%2F`; a stream with histories under two spellings is refused."""
    own = "rabbitmq://rabbit@c1/%2F"
    lower = SourceRef("rabbitmq://rabbit@c1/%2f", "s-0")
    ledger.claim("p", lower, 50, run(1), initial_start=0)
    ledger.claim("p", SourceRef("rabbitmq://rabbit@c1/%2f#epoch0", "s-1"), 5, run(1), initial_start=0)
    ledger.claim("p", SourceRef("rabbitmq://10.0.0.1:5552/%2F", "s-2"), 5, run(1), initial_start=0)
    ledger.claim("q", SourceRef("rabbitmq://rabbit@c2/%2f", "s-0"), 5, run(1), initial_start=0)
    assert ledger.adopt_identity("p", own, legacy="rabbitmq://10.0.0.1:5552/%2F") == 3
    assert {(r.source.broker, r.source.stream) for r in ledger.ranges("p")} == {
        (own, "s-0"), (own + "#epoch0", "s-1"), (own, "s-2")}
    assert ledger.adopt_identity("p", own) == 0  # nothing left: one read, no write
    assert {r.source.broker for r in ledger.ranges("q")} == {"rabbitmq://rabbit@c2/%2f"}
    ledger.claim("p", lower, 10, run(2), initial_start=0)  # a fork written by an older version
    with pytest.raises(LedgerError, match="already has a history under broker"):
        ledger.adopt_identity("p", own)


def test_audit_names_ranges_behind_an_open_claim_and_drift_both_ways(ledger: Ledger) -> None:
    from streamledger.ledger import ViolationKind

    a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    b = ledger.claim("p", SRC, 200, run(2))
    ledger.commit(b.id, records=3, first_seen=120, last_seen=180, output=None)
    report = ledger.audit("p", broker=lambda stream, ref: None)
    assert report.clean  # in flight: a note, not a violation
    (note,) = report.notes
    assert note.kind == ViolationKind.BEHIND_OPEN_CLAIM and note.range_id == a.id
    assert "wait behind claim" in note.detail and "claimed 0 s ago" in note.detail
    _age(ledger, a.id, "heartbeat_at", timedelta(hours=2))
    stale = ledger.audit("p", broker=lambda stream, ref: None)
    assert {v.kind for v in stale.violations} == {ViolationKind.BEHIND_OPEN_CLAIM, ViolationKind.STUCK_CLAIM}
    # The broker jumped past the claim (issue 10, bug 1): AHEAD of the watermark.
    ahead = ledger.audit("p", broker=lambda stream, ref: 199, stale_after=timedelta(days=1))
    (drift,) = ahead.of_kind(ViolationKind.BROKER_DRIFT)
    assert "AHEAD of the watermark" in drift.detail
    ledger.fail(a.id, "killed")
    redo = ledger.claim("p", SRC, 100, run(3))
    ledger.commit(redo.id, records=1, first_seen=50, last_seen=50, output=None)
    behind = ledger.audit("p", broker=lambda stream, ref: 50)
    (drift,) = behind.of_kind(ViolationKind.BROKER_DRIFT)
    assert "BEHIND the ledger's last record 180" in drift.detail
    assert ledger.audit("p", broker=lambda stream, ref: 180).clean
    assert ledger.audit("p", broker=lambda stream, ref: 199).clean
