"""Which table commit holds a committed range (table sinks, issue 21).

* ``sink_table``: the table a range was published into, ``iceberg:<namespace>.<name>`` or
  ``delta:<table URI>`` (None: the directory sink, or not published yet).
* ``sink_commit``: that table's commit holding the range: the Iceberg snapshot id or the Delta
  version. Recorded in the same statement that marks the range published, so the ledger names every
  table commit it made; the audit finds the commit by it even after the table's snapshot summaries
  were expired (then it falls back to counting rows per range).

Revision ID: 0006_table_commit
Revises: 0005_publish_lease_epoch
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_table_commit"
down_revision: str | None = "0005_publish_lease_epoch"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both dialects: no table rebuild, so 0002's triggers stay.
    op.add_column("streamledger_range", sa.Column("sink_table", sa.Text(), nullable=True))
    op.add_column("streamledger_range", sa.Column("sink_commit", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # SQLite >= 3.35 drops columns in place (a batch rebuild would lose 0002's triggers).
    op.execute("ALTER TABLE streamledger_range DROP COLUMN sink_commit")
    op.execute("ALTER TABLE streamledger_range DROP COLUMN sink_table")
