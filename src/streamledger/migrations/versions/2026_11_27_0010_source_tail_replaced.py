"""What a source's batches saw of its stream, so a re-created stream is never read as the old one
and its unread records are lost, not silently gone (the model checker's findings).

* ``seen_tail`` (source): the greatest committed tail of the stream a batch saw when it claimed.
  ``new-epoch`` records ``[end of the history, seen_tail)`` of the retired history as ``lost``,
  naming the re-created stream: those records were on the old stream and nobody can read them now.
* ``replaced`` (source): why a batch found the broker holding another stream. Every later batch
  refuses on it until ``new-epoch``, even after retention rolled the fingerprinted chunk out.

Revision ID: 0010_source_tail_replaced
Revises: 0009_chunk_fingerprint
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_source_tail_replaced"
down_revision: str | None = "0009_chunk_fingerprint"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both dialects: no table rebuild, so 0002's triggers stay.
    op.add_column("streamledger_source", sa.Column("seen_tail", sa.BigInteger(), nullable=True))
    op.add_column("streamledger_source", sa.Column("replaced", sa.Text(), nullable=True))


def downgrade() -> None:
    # SQLite >= 3.35 drops columns in place (a batch rebuild would lose 0002's triggers).
    op.execute("ALTER TABLE streamledger_source DROP COLUMN replaced")
    op.execute("ALTER TABLE streamledger_source DROP COLUMN seen_tail")
