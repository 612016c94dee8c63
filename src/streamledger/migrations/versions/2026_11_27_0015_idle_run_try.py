"""An idle run keeps its try: ``streamledger_idle_run.try_number``.

Since 0014 an attempt answered "nothing new" leaves no range, only its run key in
``streamledger_idle_run``. The last try of a run was read from its ranges alone, so the retry of an
idle attempt was numbered try 1 again: its staging name and publish-lease token carried the first
attempt's try, and a lease that attempt left was not taken over as superseded.

* ``streamledger_idle_run`` gains ``try_number``: the highest try answered idle under the key
  (rows of 0014 get 1, the least any attempt had). ``Ledger.last_try`` reads it with the ranges'.
* PostgreSQL ``streamledger_claim`` (``sql/streamledger_claim/0015.sql``: 0014's rule with one
  change; same signature, so replaced in place)
  records the try with the idle row and raises it when a later try is answered idle again; the row
  is written only when the try grows, so a repeated idle answer writes nothing.

Revision ID: 0015_idle_run_try
Revises: 0014_idle_claims_unrecorded
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from streamledger.migrations.revisions import install_function

revision: str = "0015_idle_run_try"
down_revision: str | None = "0014_idle_claims_unrecorded"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "streamledger_idle_run"


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both dialects (no table rebuild).
    op.add_column(_TABLE, sa.Column("try_number", sa.Integer(), nullable=False, server_default="1"))
    if op.get_context().dialect.name == "postgresql":
        install_function(op, "streamledger_claim", "0015")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        install_function(op, "streamledger_claim", "0014")
    # SQLite >= 3.35 drops columns in place.
    op.execute(f"ALTER TABLE {_TABLE} DROP COLUMN try_number")
