"""Claims carry a heartbeat and committed ranges their staging location; the claim caps its span
and gives up abandoned claims in the same transaction.

* ``heartbeat_at``: a running batch refreshes it; a claim whose heartbeat (or, before the first
  beat, whose ``claimed_at``) is older than the caller's ``abandon_after`` is abandoned: the next
  claim of the source fails it and redoes its span. Age of the claim alone says nothing (a long
  Spark job is not a dead one).
* ``staging``: where the verified output of a committed range waited before it was published (a
  rename), so a retry after a crash between commit and publish can finish the publish.
* ``streamledger_claim`` (PostgreSQL) gains ``p_max_span`` (cap of a new tail range, in offsets)
  and ``p_abandon_before`` (claims not heard from since then are failed first). SQLite runs the same
  rule in Python (``Ledger.claim``); both are held to one test suite.

Revision ID: 0004_heartbeat_staging
Revises: 0003_pg_claim_function
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from streamledger.migrations.revisions import install_function

revision: str = "0004_heartbeat_staging"
down_revision: str | None = "0003_pg_claim_function"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_OLD_SIGNATURE = (
    "streamledger_claim(varchar, varchar, varchar, varchar, bigint, varchar, varchar, varchar, "
    "integer, integer, bigint, timestamp)"
)
_NEW_SIGNATURE = (
    "streamledger_claim(varchar, varchar, varchar, varchar, bigint, varchar, varchar, varchar, "
    "integer, integer, bigint, timestamp, bigint, timestamp)"
)


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both dialects: no table rebuild, so 0002's triggers stay.
    op.add_column("streamledger_range", sa.Column("heartbeat_at", sa.DateTime(), nullable=True))
    op.add_column("streamledger_range", sa.Column("staging", sa.Text(), nullable=True))
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {_OLD_SIGNATURE}")
        install_function(op, "streamledger_claim", "0004")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {_NEW_SIGNATURE}")
        install_function(op, "streamledger_claim", "0003")
    # SQLite >= 3.35 drops columns in place (a batch rebuild would lose 0002's triggers).
    op.execute("ALTER TABLE streamledger_range DROP COLUMN staging")
    op.execute("ALTER TABLE streamledger_range DROP COLUMN heartbeat_at")
