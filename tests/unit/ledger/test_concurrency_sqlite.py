"""Several processes claiming the same SQLite ledger at once never get overlapping ranges."""

from __future__ import annotations

import itertools

from streamledger.ledger import Ledger, RangeStatus
from tests.unit.ledger.concurrency import PIPELINE, run_claimers
from tests.unit.ledger.util import check_invariants


def test_concurrent_claimers_on_sqlite(sqlite_url: str) -> None:
    Ledger(sqlite_url, create=True).close()
    claimed = run_claimers(sqlite_url, processes=4, claims=40)
    spans = sorted((s, e) for _id, s, e, _st in claimed if e > s)
    ledger = Ledger(sqlite_url)
    check_invariants(ledger)
    rows = ledger.ranges(PIPELINE)
    live = sorted((r.start, r.end) for r in rows if r.status != RangeStatus.FAILED and not r.empty)
    # every non-empty claim is a distinct span; failed ones were redone by later claims
    assert len(set(spans)) >= len(live)
    for (_s1, e1), (s2, _e2) in itertools.pairwise(live):
        assert e1 <= s2
    report = ledger.audit(PIPELINE)
    assert not [v for v in report.violations if v.kind in ("gap", "overlap", "record_count")], (
        report.to_text()
    )
