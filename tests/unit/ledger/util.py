"""Shared helpers of the ledger tests (both dialects)."""

from __future__ import annotations

import itertools

from sqlalchemy import text

from streamledger.ledger import Ledger, OffsetRange, RangeStatus, RunIdentity, SourceRef

BROKER = "rabbitmq://127.0.0.1:5552/"
SRC = SourceRef(BROKER, "events-0", "events")
SRC2 = SourceRef(BROKER, "events-1", "events")


def run(n: int | str, try_number: int = 1, task: str = "read") -> RunIdentity:
    return RunIdentity("dag", f"run-{n}", task, -1, try_number)


def check_invariants(ledger: Ledger, pipeline: str | None = None) -> None:
    """Per source: live ranges are contiguous and disjoint; holes are failed spans not yet redone."""
    by_source: dict[tuple[str, str, str], list[OffsetRange]] = {}
    for r in ledger.ranges(pipeline):
        by_source.setdefault((r.pipeline, r.source.broker, r.source.stream), []).append(r)
    for key, rows in by_source.items():
        live = sorted(
            (r for r in rows if r.status != RangeStatus.FAILED), key=lambda r: (r.start, r.end, r.id)
        )
        failed = [r for r in rows if r.status == RangeStatus.FAILED and not r.empty]
        for prev, cur in itertools.pairwise(live):
            if cur.start == prev.end:
                continue
            # The only holes allowed are failed spans not yet redone.
            assert cur.start > prev.end, f"{key}: overlap {prev.describe()} / {cur.describe()}"
            assert any(f.start <= prev.end and f.end >= cur.start for f in failed) or any(
                f.start == prev.end for f in failed
            ), f"{key}: gap [{prev.end}, {cur.start}) not left by a failed range"
        for r in rows:
            assert r.start <= r.end
            if r.status == RangeStatus.COMMITTED:
                assert r.records is not None
                if r.records:
                    assert r.first_seen is not None and r.last_seen is not None
                    assert r.start <= r.first_seen <= r.last_seen < r.end
                    assert r.records <= r.last_seen - r.first_seen + 1
                else:
                    assert r.first_seen is None and r.last_seen is None


def raw(ledger: Ledger, sql: str, **params: object) -> None:
    """Run SQL straight at the database, bypassing the Ledger API."""
    with ledger.engine.begin() as conn:
        conn.execute(text(sql), params)


INSERT_RANGE = """
INSERT INTO streamledger_range (source_id, start_offset, end_offset, status, dag_id, run_id, task_id,
  map_index, try_number, records, first_seen, last_seen, offset_stored, offset_verified,
  claimed_at, committed_at, updated_at)
VALUES (:sid, :start, :end, :status, 'dag', :run, 'read', -1, 1, :records, :first, :last, false, false,
  :at, :at, :at)
"""
