"""Coverage spans (streamledger.ledger.coverage): what the HTML report and the Airflow UI page draw."""

from __future__ import annotations

from pathlib import Path

from streamledger.ledger import Ledger
from streamledger.ledger.coverage import coverage, ranges_in, sources
from tests.support import ledger_fill


def test_spans_merge_runs_and_show_the_audit_findings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    filled = ledger_fill.fill(url, partitions=2, per_partition=30, span=10)
    with Ledger(url) as ledger:
        report = ledger.audit(filled.pipeline)
        covs = coverage(ledger, report, pipeline=filled.pipeline)
        assert [c.stream for c in covs] == ["events-0", "events-1"]
        planted = filled.planted[0]
        spans = [(s.kind, s.start, s.end, s.ranges) for s in covs[0].spans]
        # 26 committed ranges become 4 spans, cut by the gap, the lost span, the failed hole and the claim
        assert spans == [
            ("committed", 0, planted.gap[0], 10),
            ("gap", *planted.gap, 0),
            ("committed", planted.gap[1], planted.lost[0], 4),
            ("lost", *planted.lost, 1),
            ("committed", planted.lost[1], planted.failed[0], 4),
            ("failed", *planted.failed, 1),
            ("committed", planted.failed[1], planted.stuck[0], 8),
            ("claimed", *planted.stuck, 1),
            ("stuck", *planted.stuck, 1),
        ]
        # a window and a cap: only the spans touching [150, 250), at most two islands of them
        window = coverage(ledger, report, pipeline=filled.pipeline, source_id=covs[0].source_id, low=150,
                          high=250, max_spans=2)
        assert len(window) == 1 and window[0].truncated
        assert [(s.kind, s.start) for s in window[0].spans] == [
            ("lost", planted.lost[0]), ("committed", planted.lost[1]), ("failed", planted.failed[0])]


def test_sources_and_paged_ranges(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    filled = ledger_fill.fill(url, partitions=1, per_partition=30, span=10)
    with Ledger(url) as ledger:
        (src,) = sources(ledger, filled.pipeline)
        planted = filled.planted[0]
        assert src.by_status == {"committed": 26, "failed": 1, "lost": 1, "claimed": 1}
        assert (src.first, src.tail) == (0, 300)
        assert src.watermark_end == planted.failed[0]
        assert src.stored_offset == planted.failed[0] - 1 and src.stored_verified and src.stored_agrees

        first = ranges_in(ledger, src.id, 0, 300, limit=12)
        assert [r.start for r in first] == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 110, 120]  # 100: the gap
        rest = ranges_in(ledger, src.id, 0, 300, limit=100, after=(first[-1].start, first[-1].id))
        assert len(first) + len(rest) == 29 and rest[0].start == 130
        assert first[0].run_id == ledger_fill.run_id(0) and first[0].map_index == 0
        # the failed row is there too, next to nothing live (its hole was never redone)
        (failed,) = [r for r in rest if r.status == "failed"]
        assert (failed.start, failed.error) == (planted.failed[0], "Spark job failed")
