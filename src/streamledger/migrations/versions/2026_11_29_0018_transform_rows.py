"""What a transform made of each range: the rows it wrote, the records it set aside, which transform.

* ``rows_out``: the rows the pipeline's transform wrote for the range (NULL: no transform; the
  output rows are then the records). The audit compares it with what the output holds.
* ``dead_letter``: the records of the range that did not decode (``on_bad_record="dead_letter"``),
  kept in the range's ``_dead_letter`` directory (NULL: no decoding).
* ``transform``: the fingerprint of the transform that produced the range's rows
  (``Transform.fingerprint``: SQL text, function path and source hash, decoding), so ``status`` and
  the audit say which transform produced which range, and a changed transform is visible.

Nullable columns only: no function, trigger or constraint of an earlier revision changes, and a
range committed before this revision reads as a raw range.

Revision ID: 0018_transform_rows
Revises: 0017_committed_retry_try
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_transform_rows"
down_revision: str | None = "0017_committed_retry_try"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "streamledger_range"


def upgrade() -> None:
    op.add_column(_TABLE, sa.Column("rows_out", sa.BigInteger(), nullable=True))
    op.add_column(_TABLE, sa.Column("dead_letter", sa.BigInteger(), nullable=True))
    op.add_column(_TABLE, sa.Column("transform", sa.String(64), nullable=True))


def downgrade() -> None:
    # SQLite >= 3.35 drops columns in place (a batch rebuild would lose 0002's triggers).
    for column in ("transform", "dead_letter", "rows_out"):
        op.execute(f"ALTER TABLE {_TABLE} DROP COLUMN {column}")
