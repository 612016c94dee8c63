"""A fingerprint of a committed chunk, to tell a re-created stream from the one the ledger read
(issue 30, defect 3).

* ``chunk_offset``, ``chunk_timestamp``, ``chunk_crc`` (range): the first offset, timestamp and
  CRC of the chunk holding a committed range's last record, as its header gives them. The batch
  records one when the source has none the broker still retains, and checks the newest one with a
  one-chunk read before it claims (and the audit, when given the broker): a different chunk at
  that offset is another stream, whatever its length or stored offsets say.
* a partial index on the fingerprinted ranges of a source (few: one per source, more only after
  retention removed the fingerprinted chunk), so the check reads one index entry.

Revision ID: 0009_chunk_fingerprint
Revises: 0008_pinned_interval_claims
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_chunk_fingerprint"
down_revision: str | None = "0008_pinned_interval_claims"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("chunk_offset", "chunk_timestamp", "chunk_crc")


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both dialects: no table rebuild, so 0002's triggers stay.
    for name in _COLUMNS:
        op.add_column("streamledger_range", sa.Column(name, sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_streamledger_range_chunk", "streamledger_range", ["source_id", "chunk_offset"],
        postgresql_where=sa.text("chunk_offset IS NOT NULL"),
        sqlite_where=sa.text("chunk_offset IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_streamledger_range_chunk", table_name="streamledger_range")
    # SQLite >= 3.35 drops columns in place (a batch rebuild would lose 0002's triggers).
    for name in reversed(_COLUMNS):
        op.execute(f"ALTER TABLE streamledger_range DROP COLUMN {name}")
