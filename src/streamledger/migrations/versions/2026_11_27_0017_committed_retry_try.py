"""A retry handed back its committed range keeps its try: ``streamledger_idle_run.try_number``.

Rule 1 of the claim hands a run key back the range it holds. A claimed one records the new try on
the range; a committed one recorded nothing, so ``Ledger.last_try`` stayed at the committing try
and ``batch run --run-id`` numbered the third, fourth... attempt try 2 again: a publish lease a
killed try 2 left was not taken over as superseded but refused until ``claim_timeout``.

* The committed range keeps the try that committed it (coverage, lost ranges and the audit name
  that attempt). The later try is recorded with the run in ``streamledger_idle_run`` (0014/0015),
  raised only when it grows, the one place ``last_try`` reads a run's tries beside its ranges: no
  new table or column, and rule 1 stays one rule (a source the key never claimed answers the retry
  "nothing new" at its tail: a retry redoes its run's work and takes no new work).
* PostgreSQL ``streamledger_claim`` (``sql/streamledger_claim/0017.sql``: 0015's rule with one
  change; same signature, so replaced in place)
  does it in its rule 1 branch. SQLite does it in ``Claims._claim_sqlite``. No schema change.

Revision ID: 0017_committed_retry_try
Revises: 0016_one_broker_names
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from streamledger.migrations.revisions import install_function

revision: str = "0017_committed_retry_try"
down_revision: str | None = "0016_one_broker_names"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        install_function(op, "streamledger_claim", "0017")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        install_function(op, "streamledger_claim", "0015")
