"""SQLite's insert guard finds an overlap behind an empty range.

0002's guard (SQLite has no exclusion constraint) refuses a range that overlaps a live one by
looking at the live range that starts last before the new one. An empty range (an empty interval's
pinned claim, a history's origin) starting inside a claimed range was that range's stand-in: its end
lay before the new start, so a pinned claim overlapping the claimed range was accepted, where
PostgreSQL's exclusion constraint refuses it (found by the SQLite-vs-PostgreSQL claim rule test).
The guard now looks at the last non-empty live range before the new one; non-empty live ranges never
overlap, so that one ends last among them.

Revision ID: 0019_overlap_past_empty_ranges
Revises: 0018_transform_rows
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from streamledger.migrations.revisions import install_trigger

revision: str = "0019_overlap_past_empty_ranges"
down_revision: str | None = "0018_transform_rows"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":  # PostgreSQL: the exclusion constraint holds
        install_trigger(op, "streamledger_range_insert_guard", "0019")


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        install_trigger(op, "streamledger_range_insert_guard", "0014")
