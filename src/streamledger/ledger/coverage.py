"""Coverage of each source's offsets, aggregated in SQL, for the HTML report and the Airflow UI page.

Adjacent ranges of the same status are merged in SQL ("gaps and islands": a LAG window marks each
break, a running SUM numbers the islands), so a million contiguous ranges come back as a handful of
spans and a page never ships one row per range. What the audit finds (gaps, failed ranges never
retried, stuck claims) is drawn over the islands: the audit stays the one rule for what is wrong,
this module only lays it out. Individual rows are read per window (:func:`ranges_in`), a page at
a time, when someone looks closer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, Integer, String, and_, bindparam, or_, select, text

from streamledger.ledger.audit import AuditReport, ViolationKind
from streamledger.ledger.models import Range
from streamledger.ledger.types import SourceRef

if TYPE_CHECKING:
    from streamledger.ledger.store import Ledger

__all__ = ["RangeRow", "SourceCoverage", "SourceSummary", "Span", "coverage", "ranges_in", "sources"]

# The islands of live (non-failed, non-empty) ranges; failed rows are history under a redone span
# and the audit reports the ones never redone. Optionally one source and an offset window.
_ISLANDS = """
SELECT i.source_id, i.status, MIN(i.start_offset), MAX(i.end_offset), COUNT(*), MIN(i.id)
FROM (
  SELECT x.id, x.source_id, x.status, x.start_offset, x.end_offset,
         SUM(x.brk) OVER (PARTITION BY x.source_id ORDER BY x.start_offset
                          ROWS UNBOUNDED PRECEDING) AS island
  FROM (
    SELECT r.id, r.source_id, r.status, r.start_offset, r.end_offset,
           CASE WHEN LAG(r.status) OVER w = r.status AND LAG(r.end_offset) OVER w = r.start_offset
                THEN 0 ELSE 1 END AS brk
    FROM streamledger_range r
    WHERE r.status <> 'failed' AND r.end_offset > r.start_offset
      AND r.source_id IN (SELECT s.id FROM streamledger_source s
                          JOIN streamledger_pipeline p ON p.id = s.pipeline_id
                          WHERE (:pipeline IS NULL OR p.name = :pipeline))
      AND (:source_id IS NULL OR r.source_id = :source_id)
      AND (:low IS NULL OR r.end_offset > :low) AND (:high IS NULL OR r.start_offset < :high)
    WINDOW w AS (PARTITION BY r.source_id ORDER BY r.start_offset)
  ) x
) i
GROUP BY i.source_id, i.status, i.island
ORDER BY i.source_id, MIN(i.start_offset)
"""

_SOURCES = """
SELECT s.id, p.name, s.broker, s.stream, s.super_stream, s.epoch,
       (SELECT COUNT(*) FROM streamledger_range r WHERE r.source_id = s.id)
FROM streamledger_source s JOIN streamledger_pipeline p ON p.id = s.pipeline_id
WHERE (:pipeline IS NULL OR p.name = :pipeline)
ORDER BY p.name, s.stream, s.broker
"""

# Per source and status: how many rows, and the offsets they span (one scan of the source index).
_COUNTS = """
SELECT r.source_id, r.status, COUNT(*), MIN(r.start_offset), MAX(r.end_offset)
FROM streamledger_range r WHERE r.source_id IN :ids GROUP BY r.source_id, r.status
"""

# What the ledger recorded of the broker's stored offset: the greatest last record of a committed
# range whose offset a run stored (and, when verified, read back from the broker).
_STORED = """
SELECT r.source_id, r.last_seen, r.offset_verified, r.id FROM streamledger_range r
WHERE r.id IN (
  SELECT (SELECT s.id FROM streamledger_range s
          WHERE s.source_id = x.source_id AND s.status = 'committed' AND s.offset_stored
            AND s.last_seen IS NOT NULL
          ORDER BY s.last_seen DESC LIMIT 1)
  FROM (SELECT DISTINCT source_id FROM streamledger_range WHERE source_id IN :ids) x)
"""

_OVERLAYS = {ViolationKind.GAP: "gap", ViolationKind.FAILED_NOT_RETRIED: "failed",
             ViolationKind.STUCK_CLAIM: "stuck"}


@dataclass(frozen=True, slots=True)
class Span:
    """One coloured stretch of a timeline: ``kind`` is a range status (committed, lost, claimed) for
    merged ledger rows, or an audit finding drawn over them (gap, failed, stuck)."""

    kind: str
    start: int
    end: int
    ranges: int
    """Ledger rows merged into it (0 for a gap)."""
    range_id: int | None
    """The row, when the span is exactly one (its run can be linked straight away)."""


@dataclass(frozen=True, slots=True)
class SourceSummary:
    """One source of a pipeline: its extent, counts, watermark and the stored offset on record."""

    id: int
    pipeline: str
    source: SourceRef
    epoch: int
    ranges: int
    by_status: dict[str, int]
    first: int | None
    tail: int | None
    watermark_end: int | None
    last_record: int | None
    stored_offset: int | None
    """The broker offset the ledger recorded as stored (None: none stored yet)."""
    stored_verified: bool
    stored_agrees: bool | None
    """Whether that offset lies where the watermark allows (:meth:`Watermark.accepts`)."""


@dataclass(frozen=True, slots=True)
class SourceCoverage:
    source_id: int
    pipeline: str
    stream: str
    broker: str
    spans: list[Span]
    truncated: bool
    """More islands than asked for: ``spans`` stops early; ask again from the last span's end."""


@dataclass(frozen=True, slots=True)
class RangeRow:
    """One ledger row as a page shows it, with the run identity to link to."""

    id: int
    start: int
    end: int
    status: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    records: int | None
    first_seen: int | None
    last_seen: int | None
    error: str | None
    claimed_at: datetime
    committed_at: datetime | None
    heartbeat_at: datetime | None
    pinned: bool
    interval_start: datetime | None
    interval_end: datetime | None


def _islands(ledger: Ledger, pipeline: str | None, source_id: int | None, low: int | None,
             high: int | None) -> dict[int, list[Span]]:
    query = text(_ISLANDS).bindparams(
        bindparam("pipeline", type_=String()), bindparam("source_id", type_=Integer()),
        bindparam("low", type_=BigInteger()), bindparam("high", type_=BigInteger()),
    )
    out: dict[int, list[Span]] = defaultdict(list)
    params = {"pipeline": pipeline, "source_id": source_id, "low": low, "high": high}
    with ledger.read_connection("read the ledger's coverage") as conn:
        for sid, status, start, end, count, first_id in conn.execute(query, params):
            out[int(sid)].append(Span(str(status), int(start), int(end), int(count),
                                      int(first_id) if count == 1 else None))
    return out


def coverage(ledger: Ledger, report: AuditReport, *, pipeline: str | None = None,
             source_id: int | None = None, low: int | None = None, high: int | None = None,
             max_spans: int | None = None) -> list[SourceCoverage]:
    """Each source's merged islands in ``[low, high)`` with ``report``'s findings drawn over them.

    ``report`` is an audit of (at least) the same pipeline. ``max_spans`` caps the islands per
    source (``truncated`` says so); findings in the window are always included.
    """
    named = {int(s.id): s for s in sources(ledger, pipeline, counts=False)}
    islands = _islands(ledger, pipeline, source_id, low, high)
    by_name = {(s.pipeline, s.source.stream, s.source.broker): sid for sid, s in named.items()}
    overlays: dict[int, list[Span]] = defaultdict(list)
    for v in report.violations:
        kind = _OVERLAYS.get(v.kind)
        sid = by_name.get((v.pipeline, v.stream, v.broker))
        if kind is None or sid is None or v.start is None or v.end is None:
            continue
        if (low is not None and v.end <= low) or (high is not None and v.start >= high):
            continue
        overlays[sid].append(Span(kind, v.start, v.end, 0 if kind == "gap" else 1, v.range_id))
    out = []
    for sid, src in named.items():
        if source_id is not None and sid != source_id:
            continue
        spans = islands.get(sid, [])
        truncated = max_spans is not None and len(spans) > max_spans
        if truncated:
            spans = spans[:max_spans]
        merged = sorted([*spans, *overlays.get(sid, [])], key=lambda s: (s.start, s.end))
        out.append(SourceCoverage(sid, src.pipeline, src.source.stream, src.source.broker, merged, truncated))
    return out


def sources(ledger: Ledger, pipeline: str | None = None, *, counts: bool = True) -> list[SourceSummary]:
    """Every source (of ``pipeline``), with counts, extent, watermark and stored offset when ``counts``."""
    with ledger.read_connection("read the ledger's sources") as conn:
        rows = conn.execute(text(_SOURCES).bindparams(bindparam("pipeline", type_=String())),
                            {"pipeline": pipeline}).all()
        ids = [int(r[0]) for r in rows]
        by_status: dict[int, dict[str, int]] = defaultdict(dict)
        extent: dict[int, tuple[int, int]] = {}
        stored: dict[int, tuple[int, bool]] = {}
        if counts and ids:
            for sid, status, n, lo, hi in conn.execute(
                    text(_COUNTS).bindparams(bindparam("ids", expanding=True)), {"ids": ids}):
                by_status[int(sid)][str(status)] = int(n)
                old = extent.get(int(sid))
                extent[int(sid)] = (int(lo), int(hi)) if old is None else (min(old[0], lo), max(old[1], hi))
            for sid, last, verified, _rid in conn.execute(
                    text(_STORED).bindparams(bindparam("ids", expanding=True)), {"ids": ids}):
                stored[int(sid)] = (int(last), bool(verified))
    out = []
    for sid, name, broker, stream, super_stream, epoch, n in rows:
        ref = SourceRef(str(broker), str(stream), super_stream)
        mark = ledger.watermark(str(name), ref) if counts else None
        lo_hi = extent.get(int(sid))
        live = {k: v for k, v in by_status[int(sid)].items() if k != "failed"}
        out.append(SourceSummary(
            id=int(sid), pipeline=str(name), source=ref, epoch=int(epoch), ranges=int(n),
            by_status=by_status[int(sid)], first=lo_hi[0] if lo_hi else None,
            tail=ledger.last_end(str(name), ref) if counts and live else None,
            watermark_end=mark.end if mark else None, last_record=mark.last_record if mark else None,
            stored_offset=stored[int(sid)][0] if int(sid) in stored else None,
            stored_verified=stored[int(sid)][1] if int(sid) in stored else False,
            stored_agrees=mark.accepts(stored[int(sid)][0] if int(sid) in stored else None) if mark else None,
        ))
    return out


def ranges_in(ledger: Ledger, source_id: int, low: int, high: int, *, limit: int = 200,
              after: tuple[int, int] | None = None) -> list[RangeRow]:
    """The rows of one source touching ``[low, high)``, by start offset, ``limit`` at a time; ``after``
    is the ``(start, id)`` of the previous page's last row (keyset paging: no OFFSET scans)."""
    after_start, after_id = after if after is not None else (-1, -1)
    query = (
        select(Range.id, Range.start_offset.label("start"), Range.end_offset.label("end"), Range.status,
               Range.dag_id, Range.run_id, Range.task_id, Range.map_index, Range.try_number, Range.records,
               Range.first_seen, Range.last_seen, Range.error, Range.claimed_at, Range.committed_at,
               Range.heartbeat_at, Range.pinned, Range.interval_start, Range.interval_end)
        .where(Range.source_id == source_id, Range.start_offset < high,
               or_(Range.end_offset > low, Range.start_offset >= low),
               or_(Range.start_offset > after_start,
                   and_(Range.start_offset == after_start, Range.id > after_id)))
        .order_by(Range.start_offset, Range.id)
        .limit(limit)
    )
    with ledger.read_connection("read the ledger's ranges") as conn:
        return [RangeRow(**row._asdict()) for row in conn.execute(query)]
