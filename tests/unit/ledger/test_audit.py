"""The audit finds every kind of violation (re-run on PostgreSQL by tests/integration/ledger).

Violations the database itself refuses are created the way a broken deployment would have them:
by raw SQL on a scratch database whose guards (triggers, exclusion constraint) were dropped.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from streamledger.errors import StreamledgerError
from streamledger.ledger import Ledger, LedgerError, ViolationKind
from tests.unit.ledger.util import INSERT_RANGE, SRC, SRC2, raw, run


def drop_guards(ledger: Ledger) -> None:
    if ledger.dialect == "postgresql":
        raw(ledger, "DROP TRIGGER streamledger_range_guard ON streamledger_range")
        raw(ledger, "ALTER TABLE streamledger_range DROP CONSTRAINT ex_streamledger_range_no_overlap")
    else:
        raw(ledger, "DROP TRIGGER streamledger_range_insert_guard")
        raw(ledger, "DROP TRIGGER streamledger_range_update_guard")


def committed(ledger: Ledger, pipeline: str, end: int, n: int, src=SRC) -> int:  # type: ignore[no-untyped-def]
    r = ledger.claim(pipeline, src, end, run(n), initial_start=0)
    ledger.commit(r.id, records=r.end - r.start, first_seen=r.start, last_seen=r.end - 1, output=None)
    return r.id


def source_id(ledger: Ledger) -> int:
    from sqlalchemy import text

    with ledger.engine.connect() as conn:
        return int(conn.execute(text("SELECT MIN(id) FROM streamledger_source")).scalar_one())


def kinds(ledger: Ledger, **kw: object) -> list[ViolationKind]:
    return [v.kind for v in ledger.audit(**kw).violations]  # type: ignore[arg-type]


def test_clean_ledger(ledger: Ledger) -> None:
    assert ledger.audit().clean
    committed(ledger, "p", 10, 1)
    committed(ledger, "p", 20, 2)
    report = ledger.audit("p")
    assert report.clean and report.ranges == 2 and report.sources == 1 and report.pipelines == ["p"]
    assert "CLEAN" in report.to_text()
    assert json.loads(report.to_json())["clean"] is True


def test_gap(ledger: Ledger) -> None:
    committed(ledger, "p", 10, 1)
    middle = committed(ledger, "p", 20, 2)
    committed(ledger, "p", 30, 3)
    raw(ledger, "DELETE FROM streamledger_range WHERE id = :id", id=middle)
    report = ledger.audit()
    assert [v.kind for v in report.violations] == [ViolationKind.GAP]
    gap = report.violations[0]
    assert (gap.start, gap.end, gap.stream, gap.pipeline) == (10, 20, "events-0", "p")
    assert "[10, 20) belong to no range" in report.to_text()


def test_overlap_is_refused_by_the_database_then_found_by_the_audit(ledger: Ledger) -> None:
    committed(ledger, "p", 10, 1)
    committed(ledger, "p", 20, 2)
    sid = source_id(ledger)
    at = datetime.now(UTC).replace(tzinfo=None)
    row = dict(sid=sid, start=5, end=15, status="lost", run="x", records=None, first=None, last=None, at=at)
    with pytest.raises(Exception, match=r"overlap|start at the end|start where|conflicting key|exclusion"):
        raw(ledger, INSERT_RANGE, **row)
    drop_guards(ledger)
    raw(ledger, INSERT_RANGE, **row)
    report = ledger.audit()
    assert ViolationKind.OVERLAP in [v.kind for v in report.violations]
    assert ViolationKind.GAP not in [v.kind for v in report.violations]


def test_stuck_claim_and_release(ledger: Ledger) -> None:
    r = ledger.claim("p", SRC, 10, run(1), initial_start=0)
    assert ledger.audit().clean  # young claims are in flight, not stuck
    old = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=3)
    raw(ledger, "UPDATE streamledger_range SET claimed_at = :at WHERE id = :id", at=old, id=r.id)
    # Old but beating (a long job): neither stuck nor released.
    assert ledger.audit().clean
    assert ledger.release_stale(timedelta(hours=1)) == []
    raw(ledger, "UPDATE streamledger_range SET heartbeat_at = :at WHERE id = :id", at=old, id=r.id)
    report = ledger.audit()
    assert [v.kind for v in report.violations] == [ViolationKind.STUCK_CLAIM]
    assert "not heard from for" in report.violations[0].detail and report.violations[0].range_id == r.id
    assert ledger.audit(stale_after=timedelta(hours=4)).clean
    assert [x.id for x in ledger.release_stale(timedelta(hours=1))] == [r.id]
    assert kinds(ledger) == [ViolationKind.FAILED_NOT_RETRIED]


def test_failed_never_retried(ledger: Ledger) -> None:
    committed(ledger, "p", 10, 1)
    r = ledger.claim("p", SRC, 20, run(2))
    ledger.fail(r.id, "executor lost")
    report = ledger.audit()
    assert [v.kind for v in report.violations] == [ViolationKind.FAILED_NOT_RETRIED]
    assert "executor lost" in report.violations[0].detail
    redo = ledger.claim("p", SRC, 99, run(3))
    ledger.commit(redo.id, records=0, first_seen=None, last_seen=None, output=None)
    assert ledger.audit().clean


def test_record_count_disagreements(ledger: Ledger) -> None:
    a = committed(ledger, "p", 10, 1)
    b = committed(ledger, "p", 20, 2)
    c = committed(ledger, "p", 30, 3)
    raw(ledger, "UPDATE streamledger_range SET records = 50 WHERE id = :id", id=a)  # > last-first+1
    raw(ledger, "UPDATE streamledger_range SET records = 0 WHERE id = :id", id=b)  # 0 with first/last
    raw(ledger, "UPDATE streamledger_range SET last_seen = 35 WHERE id = :id", id=c)  # outside the span
    report = ledger.audit()
    assert [v.kind for v in report.violations] == [ViolationKind.RECORD_COUNT] * 3
    assert {v.range_id for v in report.violations} == {a, b, c}


def test_broker_drift(ledger: Ledger) -> None:
    r = ledger.claim("p", SRC, 10, run(1), initial_start=0)
    ledger.commit(r.id, records=5, first_seen=0, last_seen=7, output=None)
    ledger.mark_offset_stored(r.id, True)
    stored = {("events-0", "p"): 7}
    assert ledger.audit(broker=lambda s, ref: stored.get((s, ref))).clean
    stored[("events-0", "p")] = 9  # offsets 8, 9 hold no records: the same resume point
    assert ledger.audit(broker=lambda s, ref: stored.get((s, ref))).clean
    stored[("events-0", "p")] = 5
    report = ledger.audit(broker=lambda s, ref: stored.get((s, ref)))
    assert [v.kind for v in report.violations] == [ViolationKind.BROKER_DRIFT]
    assert "stores offset 5" in report.violations[0].detail
    assert kinds(ledger, broker=lambda s, ref: None) == [ViolationKind.BROKER_DRIFT]
    # a source with nothing committed must have no stored offset
    ledger.claim("p", SRC2, 10, run(1), initial_start=0)
    both = {("events-0", "p"): 7, ("events-1", "p"): 3}
    drift = ledger.audit(broker=lambda s, ref: both.get((s, ref))).violations
    assert [(v.kind, v.stream) for v in drift] == [(ViolationKind.BROKER_DRIFT, "events-1")]

    def broken(stream: str, reference: str) -> int | None:
        raise StreamledgerError(f"stream {stream!r} does not exist")

    assert set(kinds(ledger, broker=broken)) == {ViolationKind.BROKER_ERROR}

    class Client:  # anything with the stream client's query_offset method will do
        def query_offset(self, stream: str, reference: str) -> int | None:
            return both.get((stream, reference))

    assert kinds(ledger, broker=Client()) == [ViolationKind.BROKER_DRIFT]


def test_pipeline_filter_and_html(ledger: Ledger) -> None:
    from streamledger.ledger.html import render_html

    committed(ledger, "p", 10, 1)
    mid = committed(ledger, "q", 10, 1)
    committed(ledger, "q", 20, 2)
    committed(ledger, "q", 30, 3)
    raw(ledger, "DELETE FROM streamledger_range WHERE id = :id", id=mid + 1)
    assert ledger.audit("p").clean
    report = ledger.audit("q")
    assert not report.clean and report.pipelines == ["q"]
    page = render_html(ledger, report, pipeline="q")
    assert page.startswith("<!doctype html>") and "gap [10, 20)" in page and "committed [0, 10)" in page
    assert "events-0" in page and ">p<" not in page


def test_audit_needs_a_schema(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LedgerError, match="no ledger schema"):
        Ledger(f"sqlite:///{tmp_path / 'none.sqlite'}").audit()
