"""Idle claims are answered, not stored: an idle batch no longer adds a range per source.

Before, a claim that found nothing new (rule 3 giving ``[tail, tail)``) stored an empty committed
range, so a pipeline over 1,000 partitions run every minute added 1.44 million rows a day that said
nothing; they were kept only so a retry of the run (rule 1) found its answer again.

* ``streamledger_idle_run``: one row per run key (dag, run, task, map index) of a pipeline whose
  claim answered "nothing new" on a source with a history. Rule 1 of the claim answers such a run,
  on a source where its key holds no range of any status, with nothing again (at the tail), so a
  retry never reads what came after its first attempt.
* The empty answer on a source with a history is not inserted (its id is 0: no row). The first
  range of a source is still stored even when empty (it fixes where the history begins), and
  pinned claims are unchanged.
* A claim may name offsets the caller probed and found to hold no user record (the tracking chunks
  StoreOffsets write): a range inside them is inserted *committed with 0 records* by the claim
  itself, so the first idle batch after a data batch records them in the claims' one statement
  instead of claiming and then committing each. 0002's guard (both dialects) accepts a non-empty
  range inserted committed when it holds no record (0 records, no first/last seen).
* ``streamledger_claim`` gains ``p_free_start``/``p_free_end`` and ``streamledger_claim_many`` their
  arrays (PostgreSQL; the signatures change, so the old functions are dropped).

Revision ID: 0014_idle_claims_unrecorded
Revises: 0013_pg_claim_many
Create Date: 2026-11-27
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0014_idle_claims_unrecorded"
down_revision: str | None = "0013_pg_claim_many"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "streamledger_idle_run"

_CLAIM_18 = (
    "streamledger_claim(varchar, varchar, varchar, varchar, bigint, varchar, varchar, varchar, "
    "integer, integer, bigint, timestamp, bigint, timestamp, bigint, bigint, timestamp, timestamp)"
)
_CLAIM_21 = _CLAIM_18[:-1] + ", bigint, bigint, boolean)"
_MANY_18 = (
    "streamledger_claim_many(varchar, varchar[], varchar[], varchar[], bigint[], varchar, varchar, varchar, "
    "integer, integer, bigint[], timestamp, bigint, timestamp, bigint[], bigint[], timestamp[], timestamp[])"
)
_MANY_20 = _MANY_18[:-1] + ", bigint[], bigint[])"

# -- the claim function: 0012's, three edits ------------------------------------------------------
_OLD_PARAMS = "p_interval_end timestamp)\nRETURNS"
_NEW_PARAMS = ("p_interval_end timestamp, p_free_start bigint, p_free_end bigint, p_idle boolean)"
               "\nRETURNS")
_OLD_DECLARE = "  e bigint;\nBEGIN"
_NEW_DECLARE = "  e bigint;\n  free boolean;\nBEGIN"
# Rule 1 for a run that found nothing before: nothing again, at the tail (no range of its key here).
# ``p_idle``: whether the run was recorded idle before this claim (claim_many asks once, before its
# first claim records it); NULL: looked up here.
_OLD_RULE_1_END = """    RETURN NEXT held;
    RETURN;
  END IF;

  IF p_abandon_before IS NOT NULL THEN"""
_NEW_RULE_1_END = """    RETURN NEXT held;
    RETURN;
  END IF;

  IF p_span_start IS NULL AND COALESCE(p_idle, EXISTS (
       SELECT 1 FROM streamledger_idle_run u JOIN streamledger_source src ON src.pipeline_id = u.pipeline_id
        WHERE src.id = sid AND u.dag_id = p_dag_id AND u.run_id = p_run_id AND u.task_id = p_task_id
          AND u.map_index = p_map_index))
     AND NOT EXISTS (
       SELECT 1 FROM streamledger_range r
        WHERE r.source_id = sid AND r.dag_id = p_dag_id AND r.run_id = p_run_id AND r.task_id = p_task_id
          AND r.map_index = p_map_index) THEN
    SELECT r.end_offset INTO tail FROM streamledger_range r
     WHERE r.source_id = sid AND r.status <> 'failed'
     ORDER BY r.start_offset DESC, r.end_offset DESC LIMIT 1;
  END IF;

  IF tail IS NOT NULL THEN
    s := tail;
    e := tail;
  ELSE
  IF p_abandon_before IS NOT NULL THEN"""
_OLD_INSERT = """  END IF;

  INSERT INTO streamledger_range (source_id, start_offset, end_offset, status, dag_id, run_id, task_id,
      map_index, try_number, records, first_seen, last_seen, output, offset_stored, offset_verified,
      error, claimed_at, committed_at, updated_at, heartbeat_at, pinned, interval_start, interval_end)
    VALUES (sid, s, e, CASE WHEN s = e THEN 'committed' ELSE 'claimed' END, p_dag_id, p_run_id,
      p_task_id, p_map_index, p_try_number, CASE WHEN s = e THEN 0 END, NULL, NULL, NULL, false, false,
      NULL, p_now, CASE WHEN s = e THEN p_now END, p_now, p_now, p_span_start IS NOT NULL,
      p_interval_start, p_interval_end)
    RETURNING * INTO made;"""
_NEW_INSERT = """  END IF;
  END IF;

  IF s = e AND p_span_start IS NULL AND tail IS NOT NULL THEN
    -- nothing new on a source with a history: answered, not stored; the run is recorded once
    INSERT INTO streamledger_idle_run (pipeline_id, dag_id, run_id, task_id, map_index, claimed_at)
      SELECT src.pipeline_id, p_dag_id, p_run_id, p_task_id, p_map_index, p_now
        FROM streamledger_source src WHERE src.id = sid
      ON CONFLICT DO NOTHING;
    made.id := 0;
    made.source_id := sid;
    made.start_offset := s;
    made.end_offset := e;
    made.status := 'committed';
    made.dag_id := p_dag_id;
    made.run_id := p_run_id;
    made.task_id := p_task_id;
    made.map_index := p_map_index;
    made.try_number := p_try_number;
    made.records := 0;
    made.offset_stored := false;
    made.offset_verified := false;
    made.claimed_at := p_now;
    made.committed_at := p_now;
    made.updated_at := p_now;
    made.heartbeat_at := p_now;
    made.pinned := false;
    RETURN NEXT made;
    RETURN;
  END IF;
  -- offsets the caller probed to hold no user record: committed with the claim, 0 records
  free := s = e OR (p_span_start IS NULL AND p_free_start IS NOT NULL AND p_free_start <= s
                    AND e <= p_free_end);

  INSERT INTO streamledger_range (source_id, start_offset, end_offset, status, dag_id, run_id, task_id,
      map_index, try_number, records, first_seen, last_seen, output, offset_stored, offset_verified,
      error, claimed_at, committed_at, updated_at, heartbeat_at, pinned, interval_start, interval_end)
    VALUES (sid, s, e, CASE WHEN free THEN 'committed' ELSE 'claimed' END, p_dag_id, p_run_id,
      p_task_id, p_map_index, p_try_number, CASE WHEN free THEN 0 END, NULL, NULL, NULL, false, false,
      NULL, p_now, CASE WHEN free THEN p_now END, p_now, p_now, p_span_start IS NOT NULL,
      p_interval_start, p_interval_end)
    RETURNING * INTO made;"""

_MANY = """
CREATE FUNCTION streamledger_claim_many(
  p_pipeline varchar, p_brokers varchar[], p_streams varchar[], p_super_streams varchar[],
  p_end_limits bigint[], p_dag_id varchar, p_run_id varchar, p_task_id varchar, p_map_index integer,
  p_try_number integer, p_initials bigint[], p_now timestamp, p_max_span bigint,
  p_abandon_before timestamp, p_span_starts bigint[], p_span_ends bigint[], p_interval_starts timestamp[],
  p_interval_ends timestamp[], p_free_starts bigint[], p_free_ends bigint[])
RETURNS SETOF streamledger_range LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  was_idle boolean;
BEGIN
  -- asked once, before the first source's claim may record the run idle: the batch's other sources
  -- are not answered "nothing again" because one of them had nothing new just now
  was_idle := EXISTS (SELECT 1 FROM streamledger_idle_run u
                        JOIN streamledger_pipeline p ON p.id = u.pipeline_id
                       WHERE p.name = p_pipeline AND u.dag_id = p_dag_id AND u.run_id = p_run_id
                         AND u.task_id = p_task_id AND u.map_index = p_map_index);
  FOR i IN 1 .. COALESCE(array_length(p_streams, 1), 0) LOOP
    RETURN QUERY SELECT * FROM streamledger_claim(p_pipeline, p_brokers[i], p_streams[i], p_super_streams[i],
      p_end_limits[i], p_dag_id, p_run_id, p_task_id, p_map_index, p_try_number, p_initials[i], p_now,
      p_max_span, p_abandon_before, p_span_starts[i], p_span_ends[i], p_interval_starts[i],
      p_interval_ends[i], p_free_starts[i], p_free_ends[i], was_idle);
  END LOOP;
END;
$$
"""

# -- 0002's guard (as 0011 left it): a non-empty range may be inserted committed when record-free --
_OLD_PG_GUARD = """  IF NEW.status = 'committed' AND NEW.end_offset > NEW.start_offset THEN
    RAISE EXCEPTION 'streamledger: only empty ranges may be inserted as committed'"""
_NEW_PG_GUARD = """  IF NEW.status = 'committed' AND NEW.end_offset > NEW.start_offset
     AND (NEW.records IS DISTINCT FROM 0 OR NEW.first_seen IS NOT NULL OR NEW.last_seen IS NOT NULL) THEN
    RAISE EXCEPTION 'streamledger: only record-free ranges may be inserted as committed'"""
_OLD_LITE_GUARD = """  SELECT RAISE(ABORT, 'streamledger: only empty ranges may be inserted as committed')
    WHERE NEW.status = 'committed' AND NEW.end_offset > NEW.start_offset;"""
_NEW_LITE_GUARD = """  SELECT RAISE(ABORT,
                'streamledger: only record-free ranges may be inserted as committed')
    WHERE NEW.status = 'committed' AND NEW.end_offset > NEW.start_offset
      AND (NEW.records IS NOT 0 OR NEW.first_seen IS NOT NULL OR NEW.last_seen IS NOT NULL);"""


def _previous(name: str) -> ModuleType:
    """An earlier revision's module (their names start with a digit, so load them by path)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"_streamledger_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _swap(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def texts(idle: bool) -> tuple[str, str, str]:
    """The claim function (PostgreSQL) and the insert guards (PostgreSQL, SQLite) of this revision
    (``idle``) or of 0013."""
    function = str(_previous("2026_11_27_0012_pinned_redo_pieces.py").function(pieces=True))
    _f, pg, lite = _previous("2026_11_27_0011_redo_uncovered_rest.py")._texts(redo=True)
    if idle:
        function = function.replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION", 1)
        for old, new in ((_OLD_PARAMS, _NEW_PARAMS), (_OLD_DECLARE, _NEW_DECLARE),
                         (_OLD_RULE_1_END, _NEW_RULE_1_END), (_OLD_INSERT, _NEW_INSERT)):
            function = _swap(function, old, new)
        pg, lite = _swap(pg, _OLD_PG_GUARD, _NEW_PG_GUARD), _swap(lite, _OLD_LITE_GUARD, _NEW_LITE_GUARD)
    return function, pg, lite


def upgrade() -> None:
    op.create_table(
        _TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("pipeline_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("task_id", sa.String(250), nullable=False),
        sa.Column("map_index", sa.Integer(), nullable=False),
        sa.Column("claimed_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["pipeline_id"], ["streamledger_pipeline.id"], ondelete="CASCADE",
                                name="fk_streamledger_idle_run_pipeline_id_streamledger_pipeline"),
        sa.PrimaryKeyConstraint("id", name="pk_streamledger_idle_run"),
        sa.UniqueConstraint("pipeline_id", "dag_id", "run_id", "task_id", "map_index",
                            name="uq_streamledger_idle_run_key"),
    )
    function, pg, lite = texts(idle=True)
    if op.get_context().dialect.name == "postgresql":
        op.execute(pg)
        op.execute(f"DROP FUNCTION IF EXISTS {_MANY_18}")
        op.execute(f"DROP FUNCTION IF EXISTS {_CLAIM_18}")
        op.execute(function)
        op.execute(_MANY)
    else:
        op.execute("DROP TRIGGER IF EXISTS streamledger_range_insert_guard")
        op.execute(lite)


def downgrade() -> None:
    function, pg, lite = texts(idle=False)
    if op.get_context().dialect.name == "postgresql":
        op.execute(pg)  # refuses no existing row: the guard is an insert check
        op.execute(f"DROP FUNCTION IF EXISTS {_MANY_20}")
        op.execute(f"DROP FUNCTION IF EXISTS {_CLAIM_21}")
        op.execute(function.replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION", 1))
        op.execute(str(_previous("2026_11_27_0013_pg_claim_many.py")._FUNCTION))
    else:
        op.execute("DROP TRIGGER IF EXISTS streamledger_range_insert_guard")
        op.execute(lite)
    op.drop_table(_TABLE)
