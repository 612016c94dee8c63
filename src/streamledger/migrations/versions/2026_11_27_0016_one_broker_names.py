"""Two names of one broker are remembered, not found again each time from a chunk that may be gone.

* ``streamledger_one_broker``: one row per source of a pair of broker identities that a batch's
  claim-time refusal, a streaming query's, or the audit found to be one broker for a pipeline's
  stream (the broker reached under one holds the chunks the other's history committed). Keyed as a
  source is (pipeline, broker identity, stream), so the name that was refused before it had a
  history keeps its record too; both directions are written. Every later batch refuses on the
  record and the audit reports it, after retention rolled the fingerprinted chunk out.
  ``streamledger ledger rename-broker OLD NEW`` moves the records with the name, and drops a pair
  the rename made one name.
* ``verdict``: ``same`` (found one broker) or ``distinct`` (the operator's word, ``streamledger
  ledger distinct-brokers``, that the two names are two brokers: mirrors fed the same records in the
  same millisecond hold chunks of one print, which no chunk can tell apart). A ``distinct`` row is
  never turned back into ``same`` by a later finding; it refuses nothing.

Self-contained: a new table only, no change to another revision's objects (written as 0015 beside
0015_idle_run_try, chained after it when the branches met).

Revision ID: 0016_one_broker_names
Revises: 0015_idle_run_try
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_one_broker_names"
down_revision: str | None = "0015_idle_run_try"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "streamledger_one_broker"


def upgrade() -> None:
    op.create_table(
        _TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("pipeline_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("stream", sa.String(256), nullable=False),
        sa.Column("broker", sa.String(1024), nullable=False),
        sa.Column("other", sa.String(1024), nullable=False),
        sa.Column("found_at", sa.DateTime(), nullable=False),
        sa.Column("why", sa.Text(), nullable=False),
        sa.Column("verdict", sa.String(8), nullable=False, server_default="same"),
        sa.ForeignKeyConstraint(["pipeline_id"], ["streamledger_pipeline.id"], ondelete="CASCADE",
                                name="fk_streamledger_one_broker_pipeline_id_streamledger_pipeline"),
        sa.PrimaryKeyConstraint("id", name="pk_streamledger_one_broker"),
        sa.UniqueConstraint("pipeline_id", "stream", "broker", "other",
                            name="uq_streamledger_one_broker_pair"),
        sa.CheckConstraint("broker <> other", name="ck_streamledger_one_broker_two_names"),
        sa.CheckConstraint("verdict IN ('same', 'distinct')", name="ck_streamledger_one_broker_verdict"),
    )


def downgrade() -> None:
    op.drop_table(_TABLE)
