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
  the key's own failed pinned claims (a frozen copy of it in
  ``sql/streamledger_claim/0012.sql``; a test finds the statement in the function's text at head).

Revision ID: 0012_pinned_redo_pieces
Revises: 0011_redo_uncovered_rest
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from streamledger.migrations.revisions import install_function

revision: str = "0012_pinned_redo_pieces"
down_revision: str | None = "0011_redo_uncovered_rest"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_ACTIVE = "status IN ('claimed', 'committed')"
_ACTIVE_UNPINNED = "status IN ('claimed', 'committed') AND NOT pinned"


def _install(pieces: bool) -> None:
    op.drop_index("uq_streamledger_range_run", table_name="streamledger_range")
    where = _ACTIVE_UNPINNED if pieces else _ACTIVE
    op.create_index("uq_streamledger_range_run", "streamledger_range",
                    ["source_id", "dag_id", "run_id", "task_id", "map_index"], unique=True,
                    postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    if op.get_context().dialect.name == "postgresql":
        # same signature: replaced in place
        install_function(op, "streamledger_claim", "0012" if pieces else "0011")


def upgrade() -> None:
    _install(pieces=True)


def downgrade() -> None:
    # Refused by the database while a pinned run holds two live ranges of one source.
    _install(pieces=False)
