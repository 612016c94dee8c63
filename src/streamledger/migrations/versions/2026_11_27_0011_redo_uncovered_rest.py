"""The claim rule redoes every offset a failed range held that no live range covers, not only failed
ranges nobody redid at all.

A failed range a later range covers in part (a lost span recorded at the tail reaching into it, a
narrower pinned range of another run) was no *hole* any more, so the rest of it was never handed out
again: a gap the watermark could pass. Rule 2 of the claim now takes the lowest such offset and
claims from there to the end of the failed range holding it or the next live range.

* ``streamledger_claim`` (PostgreSQL): rule 2 is the redo statement of
  ``streamledger.ledger.statements.redo_spans_sql`` (the text below is a copy of it, frozen here; a
  test compares the two), in place of "the failed range with the lowest start no live range
  overlaps".
* 0002's contiguity guard (both dialects) lets a range start anywhere inside a failed range that
  holds all of it (before: only at a failed range's start), so the rest after a covered head may be
  claimed while the tail lies further on. Overlaps stay refused.

Revision ID: 0011_redo_uncovered_rest
Revises: 0010_source_tail_replaced
Create Date: 2026-11-27
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0011_redo_uncovered_rest"
down_revision: str | None = "0010_source_tail_replaced"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# redo_spans_sql("= sid") as of this revision (``sid``: the claim function's source id variable).
REDO_SPANS = """
SELECT r.source_id, r.redo_at,
       COALESCE((SELECT MIN(l.start_offset) FROM streamledger_range l
                 WHERE l.source_id = r.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
                   AND l.start_offset > r.redo_at AND l.start_offset < r.failed_end),
                r.failed_end) AS redo_end
FROM (
  SELECT p.source_id, p.redo_at, p.failed_end,
         ROW_NUMBER() OVER (PARTITION BY p.source_id ORDER BY p.redo_at, p.failed_end) AS pick
  FROM (
SELECT c.source_id, c.failed_id, c.redo_at, c.failed_end FROM (
  SELECT f.source_id, f.id AS failed_id, f.start_offset AS redo_at, f.end_offset AS failed_end
  FROM streamledger_range f
  WHERE f.source_id = sid AND f.status = 'failed' AND f.end_offset > f.start_offset
  UNION ALL
  SELECT f.source_id, f.id, l.end_offset, f.end_offset
  FROM streamledger_range f JOIN streamledger_range l
    ON l.source_id = f.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
   AND l.end_offset > f.start_offset AND l.end_offset < f.end_offset
  WHERE f.source_id = sid AND f.status = 'failed' AND f.end_offset > f.start_offset
) c
WHERE COALESCE((SELECT l.end_offset FROM streamledger_range l
                WHERE l.source_id = c.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
                  AND l.start_offset <= c.redo_at
                ORDER BY l.start_offset DESC LIMIT 1), -1) <= c.redo_at
  ) p
) r
WHERE r.pick = 1"""

# 0008's rule 2: the failed range with the lowest start that no live range overlaps.
_OLD_HOLE = """    SELECT f.start_offset, f.end_offset INTO hole_start, hole_end FROM streamledger_range f
     WHERE f.source_id = sid AND f.status = 'failed' AND f.end_offset > f.start_offset
       AND COALESCE((SELECT l.end_offset FROM streamledger_range l
                      WHERE l.source_id = f.source_id AND l.status <> 'failed'
                        AND l.start_offset < f.end_offset
                      ORDER BY l.start_offset DESC, l.end_offset DESC LIMIT 1), -1) <= f.start_offset
     ORDER BY f.start_offset LIMIT 1;"""
_NEW_HOLE = f"""    SELECT x.redo_at, x.redo_end INTO hole_start, hole_end FROM ({REDO_SPANS}
    ) x;"""

# 0002's exception to contiguity: NEW refills the start of a failed range ...
_OLD_REFILL = "f.start_offset = NEW.start_offset AND f.end_offset >= NEW.end_offset"
# ... now anywhere inside one (the rest after a covered head).
_NEW_REFILL = "f.start_offset <= NEW.start_offset AND f.end_offset >= NEW.end_offset"


def _previous(name: str) -> ModuleType:
    """An earlier revision's module (their names start with a digit, so load them by path)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"_streamledger_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _texts(redo: bool) -> tuple[str, str, str]:
    """The claim function (PostgreSQL) and the contiguity guards (PostgreSQL, SQLite) of this
    revision (``redo``) or of 0008."""
    m = _previous("2026_11_24_0008_pinned_interval_claims.py")
    function = str(m._FUNCTION).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    pg, lite = m._guards(pinned=True)
    if redo:
        assert function.count(_OLD_HOLE) == 1 and pg.count(_OLD_REFILL) == 1 and lite.count(_OLD_REFILL) == 1
        function = function.replace(_OLD_HOLE, _NEW_HOLE)
        pg, lite = pg.replace(_OLD_REFILL, _NEW_REFILL), lite.replace(_OLD_REFILL, _NEW_REFILL)
    return function, pg, lite


def _install(redo: bool) -> None:
    function, pg, lite = _texts(redo)
    if op.get_context().dialect.name == "postgresql":
        op.execute(pg)
        op.execute(function)  # same signature: replaced in place
    else:
        op.execute("DROP TRIGGER IF EXISTS streamledger_range_insert_guard")
        op.execute(lite)


def upgrade() -> None:
    _install(redo=True)


def downgrade() -> None:
    _install(redo=False)
