"""PostgreSQL: the whole claim as one server-side function (one round trip instead of five).

``streamledger_claim(...)`` locks the source row, then decides and inserts exactly as
``Ledger.claim`` does in Python (held by the run -> that range; a failed hole -> its span; else
``[tail, max(tail, end_limit))``, empty ones stored committed). In READ COMMITTED every statement of
a PL/pgSQL function takes a fresh snapshot, so the reads after the lock see every earlier claim.
It returns no row when the first range of a source lacks ``p_initial``. SQLite keeps the Python
path; both are held to the same tests.

Revision ID: 0003_pg_claim_function
Revises: 0002_range_invariants
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from streamledger.migrations.revisions import install_function

revision: str = "0003_pg_claim_function"
down_revision: str | None = "0002_range_invariants"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_SIGNATURE = (
    "streamledger_claim(varchar, varchar, varchar, varchar, bigint, varchar, varchar, varchar, "
    "integer, integer, bigint, timestamp)"
)


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        install_function(op, "streamledger_claim", "0003")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {_SIGNATURE}")
