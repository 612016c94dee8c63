"""PostgreSQL: the claims of a batch's sources in one round trip.

``streamledger_claim_many(...)`` takes one array element per source (broker, stream, super stream,
end limit, initial start, pinned span and interval) and the arguments a batch shares, and returns
what ``streamledger_claim`` (0008, rule 2 from 0011) gives each source, in order: it calls that
function once per element, so the claim rule is still written once. A source whose first claim
lacks an initial start returns no row, as before. ``Ledger.claim_many`` creates and locks the
sources first (existing ones in id order, then the new ones by name), so the function finds every
source locked already. SQLite keeps the Python path.

Revision ID: 0013_pg_claim_many
Revises: 0012_pinned_redo_pieces
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from streamledger.migrations.revisions import install_function

revision: str = "0013_pg_claim_many"
down_revision: str | None = "0012_pinned_redo_pieces"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_SIGNATURE = (
    "streamledger_claim_many(varchar, varchar[], varchar[], varchar[], bigint[], varchar, varchar, varchar, "
    "integer, integer, bigint[], timestamp, bigint, timestamp, bigint[], bigint[], timestamp[], timestamp[])"
)


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        install_function(op, "streamledger_claim_many", "0013")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {_SIGNATURE}")
