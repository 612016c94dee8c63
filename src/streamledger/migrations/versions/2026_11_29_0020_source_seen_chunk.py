"""A chunk of the stream a batch saw when it first claimed from a source (``seen_chunk_*``).

The re-created-stream check compares the broker's chunk with a fingerprint the ledger holds; until
0020 the only fingerprints were taken at commit. A history whose first claim was never committed
(the batch died after claiming) had none, so a stream deleted and re-created meanwhile was read as
the old one: the next batch redid the claim on the new stream, the old records nobody read vanished
and the audit said CLEAN (model soak seed 209). The first claim of a source without a fingerprint
now records the header of a user chunk the stream held (first offset, timestamp, CRC) in the claims'
transaction; a committed range's fingerprint, newer, is preferred once there is one.

Revision ID: 0020_source_seen_chunk
Revises: 0019_overlap_past_empty_ranges
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_source_seen_chunk"
down_revision: str | None = "0019_overlap_past_empty_ranges"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("seen_chunk_offset", "seen_chunk_timestamp", "seen_chunk_crc")


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both dialects: no table rebuild, so 0002's triggers stay.
    for name in _COLUMNS:
        op.add_column("streamledger_source", sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # SQLite >= 3.35 drops columns in place (a batch rebuild would lose 0002's triggers).
    for name in reversed(_COLUMNS):
        op.execute(f"ALTER TABLE streamledger_source DROP COLUMN {name}")
