"""Enforce the range invariants in the database itself.

Per source, live (non-failed) ranges never overlap and each new one starts where the live ranges
end (or fills the exact hole a failed range left); a range's span is immutable and its status only
moves ``claimed -> committed | failed``. PostgreSQL gets a btree_gist exclusion constraint plus a
PL/pgSQL trigger; SQLite gets equivalent BEFORE triggers (it has no exclusion constraints).

Revision ID: 0002_range_invariants
Revises: 0001_ledger_tables
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002_range_invariants"
down_revision: str | None = "0001_ledger_tables"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The live tail of a source: the end of its live range with the greatest start.
_TAIL = """(SELECT r.end_offset FROM streamledger_range r
   WHERE r.source_id = NEW.source_id AND r.status <> 'failed'
   ORDER BY r.start_offset DESC, r.end_offset DESC LIMIT 1)"""
# NEW refills (the start of) a hole that a failed range left.
_REFILLS_HOLE = """EXISTS (SELECT 1 FROM streamledger_range f
   WHERE f.source_id = NEW.source_id AND f.status = 'failed'
     AND f.start_offset = NEW.start_offset AND f.end_offset >= NEW.end_offset)"""

_PG_FUNCTION = f"""
CREATE FUNCTION streamledger_range_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  tail bigint;
BEGIN
  IF TG_OP = 'UPDATE' THEN
    IF NEW.source_id <> OLD.source_id OR NEW.start_offset <> OLD.start_offset
       OR NEW.end_offset <> OLD.end_offset THEN
      RAISE EXCEPTION 'streamledger: the span of range % is immutable', OLD.id
        USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status <> OLD.status
       AND NOT (OLD.status = 'claimed' AND NEW.status IN ('committed', 'failed')) THEN
      RAISE EXCEPTION 'streamledger: range % cannot move from % to %', OLD.id, OLD.status, NEW.status
        USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
  END IF;
  IF NEW.status = 'failed' THEN
    RETURN NEW;
  END IF;
  IF NEW.status = 'committed' AND NEW.end_offset > NEW.start_offset THEN
    RAISE EXCEPTION 'streamledger: only empty ranges may be inserted as committed'
      USING ERRCODE = 'check_violation';
  END IF;
  tail := {_TAIL};
  IF tail IS NOT NULL AND NEW.start_offset <> tail AND NOT {_REFILLS_HOLE} THEN
    RAISE EXCEPTION 'streamledger: range [%, %) of source % does not start where the live ranges end (%)',
      NEW.start_offset, NEW.end_offset, NEW.source_id, tail USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END;
$$
"""

_SQLITE_INSERT = f"""
CREATE TRIGGER streamledger_range_insert_guard BEFORE INSERT ON streamledger_range
WHEN NEW.status <> 'failed'
BEGIN
  SELECT RAISE(ABORT, 'streamledger: only empty ranges may be inserted as committed')
    WHERE NEW.status = 'committed' AND NEW.end_offset > NEW.start_offset;
  SELECT RAISE(ABORT, 'streamledger: range does not start at the end of the previous range')
    WHERE {_TAIL} IS NOT NULL AND NEW.start_offset <> {_TAIL} AND NOT {_REFILLS_HOLE};
  SELECT RAISE(ABORT, 'streamledger: range overlaps a live range of the same source')
    WHERE NEW.end_offset > NEW.start_offset AND (
      EXISTS (SELECT 1 FROM streamledger_range o
              WHERE o.source_id = NEW.source_id AND o.status <> 'failed' AND o.end_offset > o.start_offset
                AND o.start_offset >= NEW.start_offset AND o.start_offset < NEW.end_offset)
      OR (SELECT p.end_offset FROM streamledger_range p
          WHERE p.source_id = NEW.source_id AND p.status <> 'failed' AND p.start_offset < NEW.start_offset
          ORDER BY p.start_offset DESC, p.end_offset DESC LIMIT 1) > NEW.start_offset);
END
"""

_SQLITE_UPDATE = """
CREATE TRIGGER streamledger_range_update_guard BEFORE UPDATE ON streamledger_range
BEGIN
  SELECT RAISE(ABORT, 'streamledger: the span of a range is immutable')
    WHERE NEW.source_id <> OLD.source_id OR NEW.start_offset <> OLD.start_offset
       OR NEW.end_offset <> OLD.end_offset;
  SELECT RAISE(ABORT, 'streamledger: illegal range status transition')
    WHERE NEW.status <> OLD.status AND NOT (OLD.status = 'claimed' AND NEW.status IN ('committed', 'failed'));
END
"""


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        op.execute(
            "ALTER TABLE streamledger_range ADD CONSTRAINT ex_streamledger_range_no_overlap "
            "EXCLUDE USING gist (source_id WITH =, int8range(start_offset, end_offset) WITH &&) "
            "WHERE (status <> 'failed')"
        )
        op.execute(_PG_FUNCTION)
        op.execute(
            "CREATE TRIGGER streamledger_range_guard BEFORE INSERT OR UPDATE ON streamledger_range "
            "FOR EACH ROW EXECUTE FUNCTION streamledger_range_guard()"
        )
    else:
        op.execute(_SQLITE_INSERT)
        op.execute(_SQLITE_UPDATE)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS streamledger_range_guard ON streamledger_range")
        op.execute("DROP FUNCTION IF EXISTS streamledger_range_guard()")
        op.execute(
            "ALTER TABLE streamledger_range DROP CONSTRAINT IF EXISTS ex_streamledger_range_no_overlap"
        )
    else:
        op.execute("DROP TRIGGER IF EXISTS streamledger_range_insert_guard")
        op.execute("DROP TRIGGER IF EXISTS streamledger_range_update_guard")
