"""Create the ledger tables: pipelines, their sources and the offset ranges.

Revision ID: 0001_ledger_tables
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_ledger_tables"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_ACTIVE = "status IN ('claimed', 'committed')"
_NONEMPTY_LIVE = "status <> 'failed' AND end_offset > start_offset"


def upgrade() -> None:
    op.create_table(
        "streamledger_pipeline",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_streamledger_pipeline"),
        sa.UniqueConstraint("name", name="uq_streamledger_pipeline_name"),
    )
    op.create_table(
        "streamledger_source",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("pipeline_id", _ID, nullable=False),
        sa.Column("broker", sa.String(1024), nullable=False),
        sa.Column("stream", sa.String(256), nullable=False),
        sa.Column("super_stream", sa.String(256), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_streamledger_source"),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["streamledger_pipeline.id"],
            name="fk_streamledger_source_pipeline_id_streamledger_pipeline",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint(
            "pipeline_id", "broker", "stream", name="uq_streamledger_source_pipeline_id_broker_stream"
        ),
    )
    op.create_table(
        "streamledger_range",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("source_id", _ID, nullable=False),
        sa.Column("start_offset", sa.BigInteger(), nullable=False),
        sa.Column("end_offset", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("task_id", sa.String(250), nullable=False),
        sa.Column("map_index", sa.Integer(), nullable=False),
        sa.Column("try_number", sa.Integer(), nullable=False),
        sa.Column("records", sa.BigInteger(), nullable=True),
        sa.Column("first_seen", sa.BigInteger(), nullable=True),
        sa.Column("last_seen", sa.BigInteger(), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("offset_stored", sa.Boolean(), nullable=False),
        sa.Column("offset_verified", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("claimed_at", sa.DateTime(), nullable=False),
        sa.Column("committed_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_streamledger_range"),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["streamledger_source.id"],
            name="fk_streamledger_range_source_id_streamledger_source",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("start_offset >= 0", name="ck_streamledger_range_start_nonnegative"),
        sa.CheckConstraint("end_offset >= start_offset", name="ck_streamledger_range_end_after_start"),
        sa.CheckConstraint(
            "status IN ('claimed', 'committed', 'failed', 'lost')", name="ck_streamledger_range_status_known"
        ),
        sa.CheckConstraint(
            "records IS NULL OR records >= 0", name="ck_streamledger_range_records_nonnegative"
        ),
    )
    op.create_index("ix_streamledger_range_source_start", "streamledger_range", ["source_id", "start_offset"])
    op.create_index(
        "ix_streamledger_range_failed",
        "streamledger_range",
        ["source_id", "start_offset"],
        postgresql_where=sa.text("status = 'failed'"),
        sqlite_where=sa.text("status = 'failed'"),
    )
    op.create_index(
        "ix_streamledger_range_claimed",
        "streamledger_range",
        ["claimed_at"],
        postgresql_where=sa.text("status = 'claimed'"),
        sqlite_where=sa.text("status = 'claimed'"),
    )
    op.create_index(
        "uq_streamledger_range_run",
        "streamledger_range",
        ["source_id", "dag_id", "run_id", "task_id", "map_index"],
        unique=True,
        postgresql_where=sa.text(_ACTIVE),
        sqlite_where=sa.text(_ACTIVE),
    )
    # The audit's gap/overlap window reads only this index on PostgreSQL (index-only scan).
    op.create_index(
        "uq_streamledger_range_live_start",
        "streamledger_range",
        ["source_id", "start_offset"],
        unique=True,
        postgresql_include=["end_offset", "id", "status"],
        postgresql_where=sa.text(_NONEMPTY_LIVE),
        sqlite_where=sa.text(_NONEMPTY_LIVE),
    )
    op.create_index(
        "uq_streamledger_range_live_end",
        "streamledger_range",
        ["source_id", "end_offset"],
        unique=True,
        postgresql_where=sa.text(_NONEMPTY_LIVE),
        sqlite_where=sa.text(_NONEMPTY_LIVE),
    )


def downgrade() -> None:
    op.drop_table("streamledger_range")
    op.drop_table("streamledger_source")
    op.drop_table("streamledger_pipeline")
