"""The ledger's tables, as a typed SQLAlchemy 2 ORM with its own ``MetaData``.

The metadata is private to the ledger so the ledger can share a database (Airflow's metadata DB, for
one) without ever touching, or being touched by, the other tenant's tables; the Alembic environment
filters on exactly these table names. The migrations in ``streamledger/migrations`` are the source of
truth for the deployed schema (they also add the triggers and the PostgreSQL exclusion constraint that
plain metadata cannot express); these classes must describe the same columns and indexes.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

PIPELINE_TABLE = "streamledger_pipeline"
SOURCE_TABLE = "streamledger_source"
RANGE_TABLE = "streamledger_range"
IDLE_RUN_TABLE = "streamledger_idle_run"
ONE_BROKER_TABLE = "streamledger_one_broker"
LEDGER_TABLES = frozenset({PIPELINE_TABLE, SOURCE_TABLE, RANGE_TABLE, IDLE_RUN_TABLE, ONE_BROKER_TABLE})

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit identity.
_ID = BigInteger().with_variant(Integer(), "sqlite")

_ACTIVE = "status IN ('claimed', 'committed') AND NOT pinned"  # 0012: pinned runs redo pieces
_UNPUBLISHED = "status = 'committed' AND records > 0 AND published_at IS NULL"
_NONEMPTY_LIVE = "status <> 'failed' AND end_offset > start_offset"


class LedgerBase(DeclarativeBase):
    """Declarative base bound to the ledger's own metadata (never Airflow's)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Pipeline(LedgerBase):
    """A consumer: its name is the broker's offset-tracking reference."""

    __tablename__ = PIPELINE_TABLE

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(256), nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(), nullable=False)


class Source(LedgerBase):
    """One stream (or super-stream partition) a pipeline reads; its row is the claim lock."""

    __tablename__ = SOURCE_TABLE
    __table_args__ = (UniqueConstraint("pipeline_id", "broker", "stream"),)

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    pipeline_id: Mapped[int] = mapped_column(
        ForeignKey(f"{PIPELINE_TABLE}.id", ondelete="CASCADE"), nullable=False
    )
    broker: Mapped[str] = mapped_column(String(1024), nullable=False)
    stream: Mapped[str] = mapped_column(String(256), nullable=False)
    super_stream: Mapped[str | None] = mapped_column(String(256), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(), nullable=False)
    # 0005: which incarnation of the stream this history belongs to (a re-created stream is another).
    epoch: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    # 0010: the greatest committed tail a batch saw on this incarnation of the stream; a new epoch
    # records what lies between the history's end and it as lost (audit rule 10).
    seen_tail: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # 0010: why a batch found the broker holding another stream (it refused it); every later batch
    # refuses too until ``new-epoch``, even once the signs are gone (retention rolled the fingerprint).
    replaced: Mapped[str | None] = mapped_column(Text, nullable=True)
    # 0020: the header of a user chunk the stream held when a batch first claimed from this source
    # without a committed fingerprint: a first claim that dies before its commit leaves evidence of
    # which stream it claimed, so a stream re-created meanwhile is told apart.
    seen_chunk_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    seen_chunk_timestamp: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    seen_chunk_crc: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Range(LedgerBase):
    """One half-open offset span ``[start_offset, end_offset)`` of a source and who processed it."""

    __tablename__ = RANGE_TABLE
    __table_args__ = (
        CheckConstraint("start_offset >= 0", name="start_nonnegative"),
        CheckConstraint("end_offset >= start_offset", name="end_after_start"),
        CheckConstraint("status IN ('claimed', 'committed', 'failed', 'lost')", name="status_known"),
        CheckConstraint("records IS NULL OR records >= 0", name="records_nonnegative"),
        Index("ix_streamledger_range_source_start", "source_id", "start_offset"),
        # Claims look for holes left by failed ranges; audits and release_stale for old claims.
        Index(
            "ix_streamledger_range_failed",
            "source_id",
            "start_offset",
            postgresql_where=text("status = 'failed'"),
            sqlite_where=text("status = 'failed'"),
        ),
        Index(
            "ix_streamledger_range_claimed",
            "claimed_at",
            postgresql_where=text("status = 'claimed'"),
            sqlite_where=text("status = 'claimed'"),
        ),
        # 0005: every run and the audit look for committed outputs not published yet.
        Index(
            "ix_streamledger_range_unpublished",
            "source_id",
            "start_offset",
            postgresql_where=text(_UNPUBLISHED),
            sqlite_where=text(_UNPUBLISHED),
        ),
        # 0008: only sources with pinned ranges can have gaps; the watermark asks this first.
        Index("ix_streamledger_range_pinned", "source_id", postgresql_where=text("pinned"),
              sqlite_where=text("pinned")),
        # 0009: the few fingerprinted ranges of a source; the re-created-stream check reads the newest.
        Index("ix_streamledger_range_chunk", "source_id", "chunk_offset",
              postgresql_where=text("chunk_offset IS NOT NULL"),
              sqlite_where=text("chunk_offset IS NOT NULL")),
        # Reruns are idempotent: one live (claimed/committed) range per run identity and source; a
        # pinned run may hold one per piece of its failed span (0012), rule 1 answering its claim.
        Index(
            "uq_streamledger_range_run",
            "source_id",
            "dag_id",
            "run_id",
            "task_id",
            "map_index",
            unique=True,
            postgresql_where=text(_ACTIVE),
            sqlite_where=text(_ACTIVE),
        ),
        # No two live non-empty ranges of a source share a start or an end.
        Index(
            "uq_streamledger_range_live_start",
            "source_id",
            "start_offset",
            unique=True,
            postgresql_include=["end_offset", "id", "status"],  # audit window + HTML read only this
            postgresql_where=text(_NONEMPTY_LIVE),
            sqlite_where=text(_NONEMPTY_LIVE),
        ),
        Index(
            "uq_streamledger_range_live_end",
            "source_id",
            "end_offset",
            unique=True,
            postgresql_where=text(_NONEMPTY_LIVE),
            sqlite_where=text(_NONEMPTY_LIVE),
        ),
    )

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    source_id: Mapped[int] = mapped_column(
        ForeignKey(f"{SOURCE_TABLE}.id", ondelete="CASCADE"), nullable=False
    )
    start_offset: Mapped[int] = mapped_column(BigInteger, nullable=False)
    end_offset: Mapped[int] = mapped_column(BigInteger, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    dag_id: Mapped[str] = mapped_column(String(250), nullable=False)
    run_id: Mapped[str] = mapped_column(String(250), nullable=False)
    task_id: Mapped[str] = mapped_column(String(250), nullable=False)
    map_index: Mapped[int] = mapped_column(Integer, nullable=False)
    try_number: Mapped[int] = mapped_column(Integer, nullable=False)
    records: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    first_seen: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_seen: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    output: Mapped[str | None] = mapped_column(Text, nullable=True)
    offset_stored: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    offset_verified: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    claimed_at: Mapped[datetime] = mapped_column(DateTime(), nullable=False)
    committed_at: Mapped[datetime | None] = mapped_column(DateTime(), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(), nullable=False)
    # 0004: a running batch beats on its claims; a claim not heard from is abandoned, not old.
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(), nullable=True)
    # 0004: where a committed range's verified output waited before its publish (a rename).
    staging: Mapped[str | None] = mapped_column(Text, nullable=True)
    # 0005: the output is in its final place; until then the broker offset cannot pass this range.
    published_at: Mapped[datetime | None] = mapped_column(DateTime(), nullable=True)
    # 0005: the publish lease: which attempt publishes it, last renewed when.
    publisher: Mapped[str | None] = mapped_column(Text, nullable=True)
    publish_beat: Mapped[datetime | None] = mapped_column(DateTime(), nullable=True)
    # 0006: the table commit holding the range (table sinks): "iceberg:<ns>.<name>" / "delta:<uri>",
    # and the Iceberg snapshot id or Delta version.
    sink_table: Mapped[str | None] = mapped_column(Text, nullable=True)
    sink_commit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # 0008: a pinned range (``Ledger.claim(span=...)``) may start anywhere no live range covers;
    # its data interval (``bound_by_interval``) is recorded with it.
    pinned: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default=false())
    interval_start: Mapped[datetime | None] = mapped_column(DateTime(), nullable=True)
    interval_end: Mapped[datetime | None] = mapped_column(DateTime(), nullable=True)
    # 0009: the header of the chunk holding the last record (first offset, timestamp, CRC), taken
    # at commit when the source had no fingerprint still retained: a different chunk there is
    # another stream (deleted and re-created), whatever the stored offsets say.
    chunk_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    chunk_timestamp: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    chunk_crc: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # 0018: what a transform made of the range: the rows it wrote, the records it set aside (dead
    # letter), and the fingerprint of the transform (NULL for a raw range).
    rows_out: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    dead_letter: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    transform: Mapped[str | None] = mapped_column(String(64), nullable=True)


class IdleRun(LedgerBase):
    """0014: a run whose claim found nothing to read on a source with a history, recorded once per
    run (not a range per source): its retry finds nothing there again, whatever came since."""

    __tablename__ = IDLE_RUN_TABLE
    __table_args__ = (UniqueConstraint("pipeline_id", "dag_id", "run_id", "task_id", "map_index",
                                       name="uq_streamledger_idle_run_key"),)

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    pipeline_id: Mapped[int] = mapped_column(
        ForeignKey(f"{PIPELINE_TABLE}.id", ondelete="CASCADE"), nullable=False
    )
    dag_id: Mapped[str] = mapped_column(String(250), nullable=False)
    run_id: Mapped[str] = mapped_column(String(250), nullable=False)
    task_id: Mapped[str] = mapped_column(String(250), nullable=False)
    map_index: Mapped[int] = mapped_column(Integer, nullable=False)
    claimed_at: Mapped[datetime] = mapped_column(DateTime(), nullable=False)
    # 0015: the highest try answered "nothing new" under the key (a range keeps its own try), so the
    # run's retry is numbered past it (``Ledger.last_try``).
    try_number: Mapped[int] = mapped_column(Integer, nullable=False, default=1, server_default="1")


class OneBroker(LedgerBase):
    """0016: a source of a pipeline's stream (keyed as a source is: pipeline, broker identity,
    stream) found to be the broker reached under ``other`` too; one row per direction. Remembered
    so a refusal and the audit's finding outlive the chunk they were found by."""

    __tablename__ = ONE_BROKER_TABLE
    __table_args__ = (
        UniqueConstraint("pipeline_id", "stream", "broker", "other", name="uq_streamledger_one_broker_pair"),
        CheckConstraint("broker <> other", name="two_names"),
        CheckConstraint("verdict IN ('same', 'distinct')", name="verdict"),
    )

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    pipeline_id: Mapped[int] = mapped_column(
        ForeignKey(f"{PIPELINE_TABLE}.id", ondelete="CASCADE"), nullable=False
    )
    stream: Mapped[str] = mapped_column(String(256), nullable=False)
    broker: Mapped[str] = mapped_column(String(1024), nullable=False)
    other: Mapped[str] = mapped_column(String(1024), nullable=False)
    found_at: Mapped[datetime] = mapped_column(DateTime(), nullable=False)
    why: Mapped[str] = mapped_column(Text, nullable=False)
    # 'same': found one broker; 'distinct': the operator's verdict that the names are two brokers
    verdict: Mapped[str] = mapped_column(String(8), nullable=False, default="same", server_default="same")
