"""Pinned claims: a range may be claimed with an exact span (a data interval's offsets), wherever
no live range covers it, and carries its interval.

* ``pinned`` (range): the claim asked for exactly this span (``Ledger.claim(span=...)``,
  ``BatchConfig(bound_by_interval=True)``). The contiguity guard of 0002 lets a pinned range start
  anywhere; overlaps stay refused (the exclusion constraint, SQLite's overlap trigger). Offsets
  between pinned ranges that no range covers are gaps: the watermark stops at them.
* ``interval_start`` / ``interval_end`` (range): the data interval a pinned range was resolved from.
* ``streamledger_claim`` (PostgreSQL) gains ``p_span_start``, ``p_span_end``, ``p_interval_start``,
  ``p_interval_end``: the pinned branch of the one claim rule (the run's own range; else the live
  range with exactly this span, an idempotent rerun; else the span itself, after an empty committed
  *origin* marker at ``p_initial`` on a source's first claim).

Revision ID: 0008_pinned_interval_claims
Revises: 0006_table_commit
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from streamledger.migrations.revisions import install_function, install_trigger

revision: str = "0008_pinned_interval_claims"
down_revision: str | None = "0006_table_commit"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_OLD_SIGNATURE = (
    "streamledger_claim(varchar, varchar, varchar, varchar, bigint, varchar, varchar, varchar, "
    "integer, integer, bigint, timestamp, bigint, timestamp)"
)
_NEW_SIGNATURE = (
    "streamledger_claim(varchar, varchar, varchar, varchar, bigint, varchar, varchar, varchar, "
    "integer, integer, bigint, timestamp, bigint, timestamp, bigint, bigint, timestamp, timestamp)"
)


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both dialects: no table rebuild, so 0002's triggers stay.
    op.add_column("streamledger_range",
                  sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("streamledger_range", sa.Column("interval_start", sa.DateTime(), nullable=True))
    op.add_column("streamledger_range", sa.Column("interval_end", sa.DateTime(), nullable=True))
    # Only sources with pinned ranges can have gaps: the watermark looks for them only there.
    op.create_index("ix_streamledger_range_pinned", "streamledger_range", ["source_id"],
                    postgresql_where=sa.text("pinned"), sqlite_where=sa.text("pinned"))
    if op.get_context().dialect.name == "postgresql":
        install_function(op, "streamledger_range_guard", "0008")
        op.execute(f"DROP FUNCTION IF EXISTS {_OLD_SIGNATURE}")
        install_function(op, "streamledger_claim", "0008")
    else:
        install_trigger(op, "streamledger_range_insert_guard", "0008")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {_NEW_SIGNATURE}")
        install_function(op, "streamledger_claim", "0004")
        install_function(op, "streamledger_range_guard", "0002")
    else:
        install_trigger(op, "streamledger_range_insert_guard", "0002")
    op.drop_index("ix_streamledger_range_pinned", table_name="streamledger_range")
    # SQLite >= 3.35 drops columns in place (a batch rebuild would lose 0002's triggers).
    op.execute("ALTER TABLE streamledger_range DROP COLUMN interval_end")
    op.execute("ALTER TABLE streamledger_range DROP COLUMN interval_start")
    op.execute("ALTER TABLE streamledger_range DROP COLUMN pinned")
