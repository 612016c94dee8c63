"""8 processes x 200 claims of the same pipeline+source on PostgreSQL never overlap."""

from __future__ import annotations

import itertools

import pytest

from streamledger.ledger import Ledger, RangeStatus
from tests.unit.ledger.concurrency import PIPELINE, run_claimers
from tests.unit.ledger.util import check_invariants

pytestmark = pytest.mark.postgres


def test_eight_processes_two_hundred_claims_each(postgres_url: str) -> None:
    Ledger(postgres_url, create=True).close()
    claimed = run_claimers(postgres_url, processes=8, claims=200)
    ledger = Ledger(postgres_url)
    check_invariants(ledger)
    rows = ledger.ranges(PIPELINE)
    live = sorted((r.start, r.end) for r in rows if r.status != RangeStatus.FAILED and not r.empty)
    failed = sorted((r.start, r.end) for r in rows if r.status == RangeStatus.FAILED)
    assert live, "no range was claimed"
    assert live[0][0] == 0
    for (_s1, e1), (s2, _e2) in itertools.pairwise(live):
        # disjoint, and any hole is exactly a failed span nobody redid yet (workers stopped)
        assert e1 <= s2, f"live ranges overlap at {e1} / {s2}"
        if e1 < s2:
            assert (e1, s2) in failed, f"hole [{e1}, {s2}) is not a failed span"
    nonempty = {(s, e) for _id, s, e, status in claimed if e > s}
    assert len(nonempty) >= len(live)
    report = ledger.audit(PIPELINE)
    assert not [v for v in report.violations if v.kind in ("gap", "overlap", "record_count")], (
        report.to_text()
    )
