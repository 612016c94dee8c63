"""A pinned run whose failed claim a narrower range split in two gets back every piece, one claim
after the other, not only the lowest.

Rule 1 of the claim answered a run's key with its committed range, and a key held one live range
per source (``uq_streamledger_range_run``): once a pinned retry committed the lower piece of what
its failed claim held and nothing covers, the upper piece was never claimed again (a gap for ever).

* ``uq_streamledger_range_run`` covers unpinned ranges only: a pinned run may hold one committed
  range per piece (a pinned claim is still refused on overlap, and rule 1 still answers a claimed
  range first, so a run never holds two claims in flight).
* ``streamledger_claim`` (PostgreSQL): rule 1 answers a pinned claim with a committed range of the
  key only while the key's failed pinned claims hold no offset left to redo; otherwise the claim
  goes on to the span the caller worked out (the next piece, ``Claims._own_retry_spans``). The
  test is the redo statement of ``streamledger.ledger.statements.redo_points_sql`` restricted to
  the key's own failed pinned claims (the text below is a frozen copy of it; a test compares).

Revision ID: 0012_pinned_redo_pieces
Revises: 0011_redo_uncovered_rest
Create Date: 2026-11-27
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0012_pinned_redo_pieces"
down_revision: str | None = "0011_redo_uncovered_rest"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# redo_points_sql("= sid", OWN_FAILED with its parameters spelled p_...) as of this revision.
OWN_REDO_POINTS = """
SELECT c.source_id, c.failed_id, c.redo_at, c.failed_end FROM (
  SELECT f.source_id, f.id AS failed_id, f.start_offset AS redo_at, f.end_offset AS failed_end
  FROM streamledger_range f
  WHERE f.source_id = sid AND f.status = 'failed' AND f.end_offset > f.start_offset
    AND f.pinned AND f.dag_id = p_dag_id AND f.run_id = p_run_id AND f.task_id = p_task_id
    AND f.map_index = p_map_index
  UNION ALL
  SELECT f.source_id, f.id, l.end_offset, f.end_offset
  FROM streamledger_range f JOIN streamledger_range l
    ON l.source_id = f.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
   AND l.end_offset > f.start_offset AND l.end_offset < f.end_offset
  WHERE f.source_id = sid AND f.status = 'failed' AND f.end_offset > f.start_offset
    AND f.pinned AND f.dag_id = p_dag_id AND f.run_id = p_run_id AND f.task_id = p_task_id
    AND f.map_index = p_map_index
) c
WHERE COALESCE((SELECT l.end_offset FROM streamledger_range l
                WHERE l.source_id = c.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
                  AND l.start_offset <= c.redo_at
                ORDER BY l.start_offset DESC LIMIT 1), -1) <= c.redo_at"""

_KEY = "   WHERE r.source_id = sid AND r.dag_id = p_dag_id AND r.run_id = p_run_id AND r.task_id = p_task_id"
_OLD_HELD = _KEY + """
     AND r.map_index = p_map_index AND r.status IN ('claimed', 'committed');"""
_NEW_HELD = _KEY + f"""
     AND r.map_index = p_map_index AND r.status IN ('claimed', 'committed')
     AND (p_span_start IS NULL OR r.status = 'claimed'
          OR NOT EXISTS ({OWN_REDO_POINTS}
     ))
   ORDER BY r.status = 'claimed' DESC, r.id LIMIT 1;"""

_ACTIVE = "status IN ('claimed', 'committed')"
_ACTIVE_UNPINNED = "status IN ('claimed', 'committed') AND NOT pinned"


def _previous(name: str) -> ModuleType:
    """An earlier revision's module (their names start with a digit, so load them by path)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"_streamledger_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def function(pieces: bool) -> str:
    """The claim function of this revision (``pieces``) or of 0011."""
    text = str(_previous("2026_11_27_0011_redo_uncovered_rest.py")._texts(redo=True)[0])
    if pieces:
        assert text.count(_OLD_HELD) == 1
        text = text.replace(_OLD_HELD, _NEW_HELD)
    return text


def _install(pieces: bool) -> None:
    op.drop_index("uq_streamledger_range_run", table_name="streamledger_range")
    where = _ACTIVE_UNPINNED if pieces else _ACTIVE
    op.create_index("uq_streamledger_range_run", "streamledger_range",
                    ["source_id", "dag_id", "run_id", "task_id", "map_index"], unique=True,
                    postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    if op.get_context().dialect.name == "postgresql":
        op.execute(function(pieces))  # same signature: replaced in place


def upgrade() -> None:
    _install(pieces=True)


def downgrade() -> None:
    # Refused by the database while a pinned run holds two live ranges of one source.
    _install(pieces=False)
