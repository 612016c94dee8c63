"""The ledger knows which committed outputs are published, who is publishing them, and which
incarnation of a stream a source's history belongs to.

* ``published_at``: set once a committed range's output is in its final place. The broker's stored
  offset never passes a committed range that is not published yet (the watermark stops there), and
  any later run of the pipeline finishes such a publish from the staging copy the ledger recorded.
* ``publisher`` / ``publish_beat``: the publish lease. The commit hands it to the committing attempt;
  a publish is done only by the lease holder (renewed while it copies), so a zombie attempt and its
  retry never copy into one directory at once. A lease not renewed for the claim timeout is taken
  over by the next run of the pipeline.
* ``epoch`` on sources: a stream that was deleted and re-created is another stream with offsets from
  0 again. ``streamledger ledger new-epoch`` retires the source's history (kept, under a broker
  identity suffixed ``#epoch<N>``) and starts epoch N+1 at offset 0.

Committed ranges that exist before this migration are taken as published (they were published by
the code of their time, or their retry finished it); the audit's output check verifies that.

Revision ID: 0005_publish_lease_epoch
Revises: 0004_heartbeat_staging
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_publish_lease_epoch"
down_revision: str | None = "0004_heartbeat_staging"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both dialects: no table rebuild, so 0002's triggers stay.
    op.add_column("streamledger_range", sa.Column("published_at", sa.DateTime(), nullable=True))
    op.add_column("streamledger_range", sa.Column("publisher", sa.Text(), nullable=True))
    op.add_column("streamledger_range", sa.Column("publish_beat", sa.DateTime(), nullable=True))
    op.add_column(
        "streamledger_source", sa.Column("epoch", sa.Integer(), nullable=False, server_default="0")
    )
    op.execute(
        "UPDATE streamledger_range SET published_at = committed_at "
        "WHERE status = 'committed' AND records > 0"
    )
    # The audit and every run look for committed ranges whose output is not published yet.
    op.create_index(
        "ix_streamledger_range_unpublished",
        "streamledger_range",
        ["source_id", "start_offset"],
        postgresql_where=sa.text("status = 'committed' AND records > 0 AND published_at IS NULL"),
        sqlite_where=sa.text("status = 'committed' AND records > 0 AND published_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_streamledger_range_unpublished", table_name="streamledger_range")
    # SQLite >= 3.35 drops columns in place (a batch rebuild would lose 0002's triggers).
    op.execute("ALTER TABLE streamledger_source DROP COLUMN epoch")
    op.execute("ALTER TABLE streamledger_range DROP COLUMN publish_beat")
    op.execute("ALTER TABLE streamledger_range DROP COLUMN publisher")
    op.execute("ALTER TABLE streamledger_range DROP COLUMN published_at")
