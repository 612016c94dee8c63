"""The ledger's SQL, built once.

Constructing SQLAlchemy statements costs more Python time than running them, and a reused
statement also reuses its compiled form (cache key memoised). Every room of the ledger reads its
statements from here.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    column,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import aliased

from streamledger.ledger.models import Pipeline, Range, Source
from streamledger.ledger.types import RangeStatus

LIVE = Range.status != RangeStatus.FAILED.value
# PostgreSQL's clock as stored (naive UTC ``timestamp``): the ledger's one clock there (Ledger._clock).
PG_NOW = "(now() AT TIME ZONE 'UTC')"
DB_NOW = literal_column(PG_NOW, DateTime())

SOURCE_BY_NAME = (
    select(Source)
    .join(Pipeline, Pipeline.id == Source.pipeline_id)
    .where(
        Pipeline.name == bindparam("pipeline"),
        Source.broker == bindparam("broker"),
        Source.stream == bindparam("stream"),
    )
)


def tail_of(sid: Any) -> Any:
    """The tail's statement for source ``sid``: a bind parameter (one source) or ``Source.id``
    (correlated, one row per source: :meth:`Ledger._facts`). The same SQL either way."""
    return (
        select(Range.end_offset)
        .where(Range.source_id == sid, LIVE)
        .order_by(Range.start_offset.desc(), Range.end_offset.desc())
        .limit(1)
    )


TAIL = tail_of(bindparam("source_id"))


# -- the redo step of the claim rule (rule 2), one SQL text for both dialects -------------------------
# An offset is *to redo* when a failed range held it and no live non-empty range covers it: a failed
# range nobody redid, and the rest of one a later range covers only in part (a lost span reaching into
# it, a narrower pinned range of another run). The lowest such offset of each failed range is its
# start or the end of a live range inside it (live ranges never overlap, so the live range with the
# greatest start at or below an offset is the only one that may cover it: one index lookup).
# ``sources`` restricts the source ids (``IN :ids`` here, ``= sid`` inside the PostgreSQL claim
# function of migration 0010, which holds a copy of this text that a test compares); ``own`` further
# restricts the failed ranges (a pinned run's own: OWN_FAILED).
_REDO_POINTS = """
SELECT c.source_id, c.failed_id, c.redo_at, c.failed_end FROM (
  SELECT f.source_id, f.id AS failed_id, f.start_offset AS redo_at, f.end_offset AS failed_end
  FROM streamledger_range f
  WHERE f.source_id {sources} AND f.status = 'failed' AND f.end_offset > f.start_offset{own}
  UNION ALL
  SELECT f.source_id, f.id, l.end_offset, f.end_offset
  FROM streamledger_range f JOIN streamledger_range l
    ON l.source_id = f.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
   AND l.end_offset > f.start_offset AND l.end_offset < f.end_offset
  WHERE f.source_id {sources} AND f.status = 'failed' AND f.end_offset > f.start_offset{own}
) c
WHERE COALESCE((SELECT l.end_offset FROM streamledger_range l
                WHERE l.source_id = c.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
                  AND l.start_offset <= c.redo_at
                ORDER BY l.start_offset DESC LIMIT 1), -1) <= c.redo_at"""

# Per source, the span the next claim redoes: from the lowest offset to redo to the end of the failed
# range holding it (the nearest end when several do) or the next live range, whichever comes first.
# A failed range nobody redid comes back with exactly its span.
_REDO_END = """COALESCE((SELECT MIN(l.start_offset) FROM streamledger_range l
                 WHERE l.source_id = r.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
                   AND l.start_offset > r.redo_at AND l.start_offset < r.failed_end),
                r.failed_end)"""
_REDO_SPANS = """
SELECT r.source_id, r.redo_at,
       """ + _REDO_END + """ AS redo_end
FROM (
  SELECT p.source_id, p.redo_at, p.failed_end,
         ROW_NUMBER() OVER (PARTITION BY p.source_id ORDER BY p.redo_at, p.failed_end) AS pick
  FROM ({points}
  ) p
) r
WHERE r.pick = 1"""

OWN_FAILED = """
    AND f.pinned AND f.dag_id = :dag_id AND f.run_id = :run_id AND f.task_id = :task_id
    AND f.map_index = :map_index"""
"""A pinned run's own failed ranges: its retry gets back what they held and nothing covers."""


def redo_points_sql(sources: str, own: str = "") -> str:
    """The offsets to redo (see above), one row per failed range and candidate offset."""
    return _REDO_POINTS.format(sources=sources, own=own)


def redo_spans_sql(sources: str, own: str = "") -> str:
    """The span the next claim redoes, one row per source that has offsets to redo."""
    return _REDO_SPANS.format(points=redo_points_sql(sources, own))


def _by_ids(sql: str) -> Any:
    return text(sql).bindparams(bindparam("ids", expanding=True))


REDO_SPANS = _by_ids(redo_spans_sql("IN :ids"))
OWN_REDO_SPANS = _by_ids(redo_spans_sql("IN :ids", OWN_FAILED))
REDO_POINTS = _by_ids(redo_points_sql("IN :ids")).columns(
    column("source_id", BigInteger()), column("failed_id", BigInteger()), column("redo_at", BigInteger()),
    column("failed_end", BigInteger()),
).subquery("redo_points")
# Per source (of ``ids``), the first offset to redo: where the watermark stops (Ledger.watermark).
FIRST_REDO = (
    select(REDO_POINTS.c.source_id, func.min(REDO_POINTS.c.redo_at).label("redo_at"))
    .group_by(REDO_POINTS.c.source_id)
    .subquery("first_redo")
)


def any_pinned_of(sid: Any) -> Any:
    return select(Range.id).where(Range.source_id == sid, Range.pinned).limit(1)

ANY_PINNED = any_pinned_of(bindparam("source_id"))
# A range only a free claim makes (where the ledger ends: a batch without an interval, a streaming
# query): not pinned, not empty, claimed or committed with records. Lost and failed ranges are left
# out (retention's losses and refusals are recorded unpinned in pinned histories too), and so are
# tracking-only ranges (0 records committed).
FREE_CLAIM = and_(
    Range.pinned.is_(False), Range.end_offset > Range.start_offset,
    or_(Range.status == RangeStatus.CLAIMED.value,
        and_(Range.status == RangeStatus.COMMITTED.value, Range.records > 0)),
)
# A history starts at the lowest start of any of its ranges (audit rule 1): a failed first claim
# counts, or the span it held and nobody redid would lie before the "origin".
ORIGIN_START = select(func.min(Range.start_offset)).where(Range.source_id == bindparam("source_id"))
_NEXT = aliased(Range)
STARTS_AT = select(_NEXT.id).where(
    _NEXT.source_id == bindparam("source_id"),
    _NEXT.status != RangeStatus.FAILED.value,
    _NEXT.start_offset == bindparam("at", type_=BigInteger()),
    _NEXT.end_offset > _NEXT.start_offset,
).limit(1)
# Walks the live ranges by end (the partial unique index on (source_id, end_offset)) to the first one
# that no non-empty live range continues: for a contiguous history that is the tail, O(ranges).
FIRST_UNCONTINUED = (
    select(Range.end_offset)
    .where(
        Range.source_id == bindparam("source_id"),
        LIVE,
        Range.end_offset > Range.start_offset,
        ~select(_NEXT.id).where(
            _NEXT.source_id == Range.source_id,
            _NEXT.status != RangeStatus.FAILED.value,
            _NEXT.start_offset == Range.end_offset,
            _NEXT.end_offset > _NEXT.start_offset,
        ).exists(),
    )
    .order_by(Range.end_offset)
    .limit(1)
)

_RANGES = Range.__table__
assert isinstance(_RANGES, Table)
# Many rows in one statement (SQLAlchemy's "insert many values"): each row's id with its source (the
# rows of one statement have distinct sources, so no order of the rows returned is relied on).
INSERT_RANGES = insert(_RANGES).returning(_RANGES.c.source_id, _RANGES.c.id)
# The common commit in one statement: a claimed range whose span holds the seen offsets.
COMMIT_CLAIMED = (
    update(_RANGES)
    .where(
        _RANGES.c.id == bindparam("range_id"),
        _RANGES.c.status == RangeStatus.CLAIMED.value,
        or_(
            bindparam("empty_commit", type_=Boolean()),
            and_(
                _RANGES.c.start_offset <= bindparam("v_first", type_=BigInteger()),
                _RANGES.c.end_offset > bindparam("v_last", type_=BigInteger()),
            ),
        ),
    )
    .values(
        status=RangeStatus.COMMITTED.value,
        records=bindparam("v_records"),
        first_seen=bindparam("v_first", type_=BigInteger()),
        last_seen=bindparam("v_last", type_=BigInteger()),
        output=bindparam("v_output", type_=Text()),
        staging=bindparam("v_staging", type_=Text()),
        publisher=bindparam("v_publisher", type_=String()),
        published_at=bindparam("v_published", type_=DateTime()),
        publish_beat=bindparam("v_publish_beat", type_=DateTime()),
        chunk_offset=bindparam("v_chunk_offset", type_=BigInteger()),
        chunk_timestamp=bindparam("v_chunk_timestamp", type_=BigInteger()),
        chunk_crc=bindparam("v_chunk_crc", type_=BigInteger()),
        committed_at=bindparam("v_now", type_=DateTime()),
        updated_at=bindparam("v_now", type_=DateTime()),
    )
    .returning(*_RANGES.c)
)
IS_UNPUBLISHED = and_(
    Range.status == RangeStatus.COMMITTED.value,
    Range.records > 0,
    Range.published_at.is_(None),
)

COMMIT_CLAIMED_PG = COMMIT_CLAIMED.values(
    published_at=case((bindparam("v_publish_now", type_=Boolean()), DB_NOW), else_=null()),
    publish_beat=case((bindparam("v_publisher", type_=String()).is_not(None), DB_NOW), else_=null()),
    committed_at=DB_NOW,
    updated_at=DB_NOW,
)
PG_CLAIM = (
    text(
        "SELECT * FROM streamledger_claim(:pipeline, :broker, :stream, :super_stream, :end_limit, "
        f":dag_id, :run_id, :task_id, :map_index, :try_number, :initial, {PG_NOW}, :max_span, "
        f"{PG_NOW} - make_interval(secs => :abandon_secs), :span_start, :span_end, :interval_start, "
        ":interval_end, :free_start, :free_end, NULL)"
    )
    .bindparams(
        bindparam("super_stream", type_=String()),
        bindparam("end_limit", type_=BigInteger()),
        bindparam("map_index", type_=Integer()),
        bindparam("try_number", type_=Integer()),
        bindparam("initial", type_=BigInteger()),
        bindparam("max_span", type_=BigInteger()),
        bindparam("abandon_secs", type_=Float()),
        bindparam("span_start", type_=BigInteger()),
        bindparam("span_end", type_=BigInteger()),
        bindparam("interval_start", type_=DateTime()),
        bindparam("interval_end", type_=DateTime()),
        bindparam("free_start", type_=BigInteger()),
        bindparam("free_end", type_=BigInteger()),
    )
    .columns(*_RANGES.c)
)
# The claims of many sources in one call (migrations 0013, 0014): one array element per source.
PG_CLAIM_MANY = (
    text(
        "SELECT * FROM streamledger_claim_many(:pipeline, :brokers, :streams, :super_streams, :end_limits, "
        f":dag_id, :run_id, :task_id, :map_index, :try_number, :initials, {PG_NOW}, :max_span, "
        f"{PG_NOW} - make_interval(secs => :abandon_secs), :span_starts, :span_ends, :interval_starts, "
        ":interval_ends, :free_starts, :free_ends)"
    )
    .bindparams(
        bindparam("brokers", type_=ARRAY(String())),
        bindparam("streams", type_=ARRAY(String())),
        bindparam("super_streams", type_=ARRAY(String())),
        bindparam("end_limits", type_=ARRAY(BigInteger())),
        bindparam("map_index", type_=Integer()),
        bindparam("try_number", type_=Integer()),
        bindparam("initials", type_=ARRAY(BigInteger())),
        bindparam("max_span", type_=BigInteger()),
        bindparam("abandon_secs", type_=Float()),
        bindparam("span_starts", type_=ARRAY(BigInteger())),
        bindparam("span_ends", type_=ARRAY(BigInteger())),
        bindparam("interval_starts", type_=ARRAY(DateTime())),
        bindparam("interval_ends", type_=ARRAY(DateTime())),
        bindparam("free_starts", type_=ARRAY(BigInteger())),
        bindparam("free_ends", type_=ARRAY(BigInteger())),
    )
    .columns(*_RANGES.c)
)
# A tail a batch saw, kept when it is the greatest (Ledger.saw_tails, executed for many sources).
_SOURCES = Source.__table__
assert isinstance(_SOURCES, Table)
RAISE_SEEN_TAIL = (
    update(_SOURCES)
    .where(_SOURCES.c.id == bindparam("sid"),
           or_(_SOURCES.c.seen_tail.is_(None), _SOURCES.c.seen_tail < bindparam("tail", type_=BigInteger())))
    .values(seen_tail=bindparam("tail", type_=BigInteger()))
)
# The first chunk a batch saw on a source without one (Ledger.saw_tails, executed for many sources).
KEEP_SEEN_CHUNK = (
    update(_SOURCES)
    .where(_SOURCES.c.id == bindparam("sid"), _SOURCES.c.seen_chunk_offset.is_(None))
    .values(seen_chunk_offset=bindparam("offset", type_=BigInteger()),
            seen_chunk_timestamp=bindparam("timestamp", type_=BigInteger()),
            seen_chunk_crc=bindparam("crc", type_=BigInteger()))
)
LOAD = (
    select(Range, Source, Pipeline.name)
    .join(Source, Source.id == Range.source_id)
    .join(Pipeline, Pipeline.id == Source.pipeline_id)
    .where(Range.id == bindparam("range_id"))
)
LOAD_LOCKED = LOAD.with_for_update(of=Range)
LOAD_MANY = (
    select(Range, Source, Pipeline.name)
    .join(Source, Source.id == Range.source_id)
    .join(Pipeline, Pipeline.id == Source.pipeline_id)
    .where(Range.id.in_(bindparam("ids", expanding=True)))
    .order_by(Range.id)
)

# -- the audit's checks: set-based SQL text (streamledger.ledger.audit names the findings) ----------

# Restricting to one pipeline is a semi-join on its sources; without it, no join at all.
AUDIT_PIPELINE_SCOPE = """r.source_id IN (SELECT s.id FROM streamledger_source s
  JOIN streamledger_pipeline p ON p.id = s.pipeline_id WHERE p.name = :pipeline)"""

# Each live non-empty range against the greatest end of the live ranges before it (a running MAX
# rather than a plain LAG, so a range hidden inside an earlier, longer one still counts as an
# overlap). The rows come in the order of the partial unique index on (source_id, start_offset),
# which on PostgreSQL also carries end_offset and id: an index-only scan feeding the window, no
# sort. Empty ranges cannot open a gap or overlap anything (the gap before the first range read is
# AUDIT_HEAD_GAPS'). A failed range excuses no gap (audit rule 2): only the parts of a gap that are
# failed holes are left to AUDIT_FAILED (rule 4.1), in Python.
AUDIT_GAPS_OVERLAPS = """
WITH live AS (
  SELECT r.id, r.source_id, r.start_offset, r.end_offset,
         MAX(r.end_offset) OVER (
           PARTITION BY r.source_id ORDER BY r.start_offset
           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM streamledger_range r
  WHERE {scope} AND r.status <> 'failed' AND r.end_offset > r.start_offset
)
SELECT l.id, l.source_id, l.start_offset, l.end_offset, l.prev_end
FROM live l
WHERE l.prev_end IS NOT NULL AND l.start_offset <> l.prev_end
ORDER BY l.source_id, l.start_offset
LIMIT :cap
"""

# Audit rule 1: a history starts at its origin, the lowest start of any of its ranges (the empty
# marker of a pinned history, a failed first claim). Offsets from there to the first live range
# with offsets are a gap (rule 4.2). Two index lookups per source on (source_id, start_offset).
AUDIT_HEAD_GAPS = """
SELECT x.sid, x.origin, x.first, (
    SELECT l.id FROM streamledger_range l
    WHERE l.source_id = x.sid AND l.status <> 'failed' AND l.start_offset = x.first
      AND l.end_offset > l.start_offset
    ORDER BY l.id LIMIT 1)
FROM (
  SELECT s.id AS sid,
         (SELECT MIN(r.start_offset) FROM streamledger_range r WHERE r.source_id = s.id) AS origin,
         (SELECT MIN(r.start_offset) FROM streamledger_range r
          WHERE r.source_id = s.id AND r.status <> 'failed' AND r.end_offset > r.start_offset) AS first
  FROM streamledger_source s
  WHERE (:pipeline IS NULL OR s.pipeline_id IN (
      SELECT p.id FROM streamledger_pipeline p WHERE p.name = :pipeline))
) x
WHERE x.first > x.origin
ORDER BY x.sid
LIMIT :cap
"""

# The failed ranges overlapping a gap (its finding names them: they held the span once and cover
# nothing, audit rule 2).
AUDIT_FAILED_IN = """
SELECT r.id, r.start_offset, r.end_offset FROM streamledger_range r
WHERE r.source_id = :source_id AND r.status = 'failed' AND r.start_offset < :high AND r.end_offset > :low
ORDER BY r.start_offset, r.id
LIMIT 3
"""

# Audit rule 6: spans recorded as deliberately skipped (``Ledger.record_skipped``). They are pinned,
# so the partial index of pinned ranges finds them without a scan of the table.
AUDIT_SKIPPED = """
SELECT r.id, r.source_id, r.start_offset, r.end_offset, r.error FROM streamledger_range r
WHERE {scope} AND r.pinned AND r.status = 'lost' AND r.dag_id = :skip_dag AND r.task_id = :skip_task
ORDER BY r.source_id, r.start_offset
LIMIT :cap
"""

# One scan for the per-row checks and the status counts: rows that break a rule keep their id,
# all others collapse into one group per status.
AUDIT_ROW_CHECKS_AND_COUNTS = """
SELECT x.status, x.bad, COUNT(*) FROM (
  SELECT r.status,
         CASE WHEN (r.status = 'claimed' AND COALESCE(r.heartbeat_at, r.claimed_at) < :cutoff)
                OR (r.status = 'committed' AND (
                      r.records IS NULL
                   OR (r.records = 0 AND (r.first_seen IS NOT NULL OR r.last_seen IS NOT NULL))
                   OR (r.records > 0 AND (
                         r.first_seen IS NULL OR r.last_seen IS NULL OR r.first_seen > r.last_seen
                      OR r.first_seen < r.start_offset OR r.last_seen >= r.end_offset
                      OR r.records > r.last_seen - r.first_seen + 1))))
              THEN r.id END AS bad
  FROM streamledger_range r
  WHERE {scope}
) x
GROUP BY x.status, x.bad
"""

AUDIT_ROW_DETAILS = """
SELECT r.id, r.source_id, r.start_offset, r.end_offset, r.status,
       COALESCE(r.heartbeat_at, r.claimed_at), r.records, r.first_seen, r.last_seen,
       r.dag_id, r.run_id, r.task_id, r.map_index
FROM streamledger_range r
WHERE r.id IN :ids
ORDER BY r.source_id, r.start_offset
"""

# Audit rule 4.1: every piece of a failed range that no live range covers, from each offset to redo
# (the claim rule's redo points: a failed range nobody redid, and the rest of one a later range
# covers in part) to the end of that failed range or the next live range. One row per failed range
# and piece; ``redo_points_sql`` restricted to the audited sources.
_AUDIT_SOURCES_IN = """IN (SELECT s.id FROM streamledger_source s
  JOIN streamledger_pipeline p ON p.id = s.pipeline_id WHERE p.name = :pipeline)"""


def audit_failed_sql(scoped: bool) -> str:
    """Rule 4.1's statement, for one pipeline (``scoped``) or all of them."""
    return ("""
SELECT r.failed_id, r.source_id, r.redo_at, """ + _REDO_END + """ AS redo_end, f.error,
       f.start_offset, f.end_offset
FROM (""" + redo_points_sql(_AUDIT_SOURCES_IN if scoped else "IS NOT NULL") + """
) r JOIN streamledger_range f ON f.id = r.failed_id
ORDER BY r.source_id, r.redo_at, r.failed_id
LIMIT :cap
""")

# Committed ranges with records whose output is not published: in flight while their publish lease
# is renewed, stranded once it is not (the next run of the pipeline finishes them).
AUDIT_UNPUBLISHED = """
SELECT r.id, r.source_id, r.start_offset, r.end_offset, r.publisher, r.publish_beat, r.committed_at
FROM streamledger_range r
WHERE {scope} AND r.status = 'committed' AND r.records > 0 AND r.published_at IS NULL
ORDER BY r.source_id, r.start_offset
LIMIT :cap
"""

# Pinned ranges (bound_by_interval) among ``ids`` claimed after ``cutoff``.
AUDIT_PINNED_SINCE = """
SELECT r.id FROM streamledger_range r WHERE r.id IN :ids AND r.pinned AND r.claimed_at >= :cutoff
"""

# The fingerprinted committed chunks (few per source); the newest per source is checked.
AUDIT_CHUNK_PRINTS = """
SELECT r.source_id, r.chunk_offset, r.chunk_timestamp, r.chunk_crc FROM streamledger_range r
WHERE {scope} AND r.chunk_offset IS NOT NULL AND r.status = 'committed'
ORDER BY r.source_id, r.chunk_offset
"""

AUDIT_SOURCES = """
SELECT s.id, p.name, s.stream, s.broker
FROM streamledger_source s JOIN streamledger_pipeline p ON p.id = s.pipeline_id
WHERE (:pipeline IS NULL OR p.name = :pipeline)
ORDER BY p.name, s.stream, s.broker
"""

# Committed ranges that wait behind an open claim (the watermark stops at the claim).
AUDIT_BEHIND = """
SELECT COUNT(*), MIN(r.start_offset), MAX(r.end_offset) FROM streamledger_range r
WHERE r.source_id = :source_id AND r.status = 'committed' AND r.start_offset >= :mark
  AND r.end_offset > r.start_offset
"""
