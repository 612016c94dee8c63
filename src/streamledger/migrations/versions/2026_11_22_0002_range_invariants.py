"""Enforce the range invariants in the database itself.

Per source, live (non-failed) ranges never overlap and each new one starts where the live ranges
end (or fills the exact hole a failed range left); a range's span is immutable and its status only
moves ``claimed -> committed | failed``. PostgreSQL gets a btree_gist exclusion constraint plus a
PL/pgSQL trigger; SQLite gets equivalent BEFORE triggers (it has no exclusion constraints).

Revision ID: 0002_range_invariants
Revises: 0001_ledger_tables
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from streamledger.migrations.revisions import install_function, install_trigger

revision: str = "0002_range_invariants"
down_revision: str | None = "0001_ledger_tables"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        op.execute(
            "ALTER TABLE streamledger_range ADD CONSTRAINT ex_streamledger_range_no_overlap "
            "EXCLUDE USING gist (source_id WITH =, int8range(start_offset, end_offset) WITH &&) "
            "WHERE (status <> 'failed')"
        )
        install_function(op, "streamledger_range_guard", "0002")
        op.execute(
            "CREATE TRIGGER streamledger_range_guard BEFORE INSERT OR UPDATE ON streamledger_range "
            "FOR EACH ROW EXECUTE FUNCTION streamledger_range_guard()"
        )
    else:
        install_trigger(op, "streamledger_range_insert_guard", "0002")
        install_trigger(op, "streamledger_range_update_guard", "0002")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS streamledger_range_guard ON streamledger_range")
        op.execute("DROP FUNCTION IF EXISTS streamledger_range_guard()")
        op.execute(
            "ALTER TABLE streamledger_range DROP CONSTRAINT IF EXISTS ex_streamledger_range_no_overlap"
        )
    else:
        op.execute("DROP TRIGGER IF EXISTS streamledger_range_insert_guard")
        op.execute("DROP TRIGGER IF EXISTS streamledger_range_update_guard")
