"""Idle claims are answered, not stored: an idle batch no longer adds a range per source.

Before, a claim that found nothing new (rule 3 giving ``[tail, tail)``) stored an empty committed
range, so a pipeline over 1,000 partitions run every minute added 1.44 million rows a day that said
nothing; they were kept only so a retry of the run (rule 1) found its answer again.

* ``streamledger_idle_run``: one row per run key (dag, run, task, map index) of a pipeline whose
  claim answered "nothing new" on a source with a history. Rule 1 of the claim answers such a run,
  on a source where its key holds no range of any status, with nothing again (at the tail), so a
  retry never reads what came after its first attempt.
* The empty answer on a source with a history is not inserted (its id is 0: no row). The first
  range of a source is still stored even when empty (it fixes where the history begins), and
  pinned claims are unchanged.
* A claim may name offsets the caller probed and found to hold no user record (the tracking chunks
  StoreOffsets write): a range inside them is inserted *committed with 0 records* by the claim
  itself, so the first idle batch after a data batch records them in the claims' one statement
  instead of claiming and then committing each. 0002's guard (both dialects) accepts a non-empty
  range inserted committed when it holds no record (0 records, no first/last seen).
* ``streamledger_claim`` gains ``p_free_start``/``p_free_end`` and ``streamledger_claim_many`` their
  arrays (PostgreSQL; the signatures change, so the old functions are dropped).

Revision ID: 0014_idle_claims_unrecorded
Revises: 0013_pg_claim_many
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from streamledger.migrations.revisions import install_function, install_trigger

revision: str = "0014_idle_claims_unrecorded"
down_revision: str | None = "0013_pg_claim_many"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "streamledger_idle_run"

_CLAIM_18 = (
    "streamledger_claim(varchar, varchar, varchar, varchar, bigint, varchar, varchar, varchar, "
    "integer, integer, bigint, timestamp, bigint, timestamp, bigint, bigint, timestamp, timestamp)"
)
_CLAIM_21 = _CLAIM_18[:-1] + ", bigint, bigint, boolean)"
_MANY_18 = (
    "streamledger_claim_many(varchar, varchar[], varchar[], varchar[], bigint[], varchar, varchar, varchar, "
    "integer, integer, bigint[], timestamp, bigint, timestamp, bigint[], bigint[], timestamp[], timestamp[])"
)
_MANY_20 = _MANY_18[:-1] + ", bigint[], bigint[])"


def upgrade() -> None:
    op.create_table(
        _TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("pipeline_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("task_id", sa.String(250), nullable=False),
        sa.Column("map_index", sa.Integer(), nullable=False),
        sa.Column("claimed_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["pipeline_id"], ["streamledger_pipeline.id"], ondelete="CASCADE",
                                name="fk_streamledger_idle_run_pipeline_id_streamledger_pipeline"),
        sa.PrimaryKeyConstraint("id", name="pk_streamledger_idle_run"),
        sa.UniqueConstraint("pipeline_id", "dag_id", "run_id", "task_id", "map_index",
                            name="uq_streamledger_idle_run_key"),
    )
    if op.get_context().dialect.name == "postgresql":
        install_function(op, "streamledger_range_guard", "0014")
        op.execute(f"DROP FUNCTION IF EXISTS {_MANY_18}")
        op.execute(f"DROP FUNCTION IF EXISTS {_CLAIM_18}")
        install_function(op, "streamledger_claim", "0014")
        install_function(op, "streamledger_claim_many", "0014")
    else:
        install_trigger(op, "streamledger_range_insert_guard", "0014")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        # refuses no existing row: the guard is an insert check
        install_function(op, "streamledger_range_guard", "0011")
        op.execute(f"DROP FUNCTION IF EXISTS {_MANY_20}")
        op.execute(f"DROP FUNCTION IF EXISTS {_CLAIM_21}")
        install_function(op, "streamledger_claim", "0012")
        install_function(op, "streamledger_claim_many", "0013")
    else:
        install_trigger(op, "streamledger_range_insert_guard", "0011")
    op.drop_table(_TABLE)
