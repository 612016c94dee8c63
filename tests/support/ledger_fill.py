"""Fill a SQLite ledger with many ranges fast, for the UI tests and bench/ui.py.

Claiming and committing through :class:`~streamledger.ledger.Ledger` costs two durable transactions
per range (seconds for thousands); here the rows of a realistic history are bulk-inserted in one
transaction instead. The insert guard trigger (a committed row may only be inserted empty) is
dropped for the load and re-created from its own stored SQL, so the schema is the migrated one
afterwards; every other constraint and index stays on during the load.

The history: per partition, consecutive committed ranges of ``span`` offsets by the backfill DAG's
runs, plus what a UI must show: a planted ``gap`` (offsets no range covers), a ``failed`` range
never retried, a ``lost`` span and, at the tail, a ``stuck`` claim not heard from for two hours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from streamledger.ledger import Ledger
from streamledger.ledger.models import Pipeline, Range, Source

DAG_ID = "streamledger_backfill"
TASK_ID = "batch"
BROKER = "rabbitmq-stream://127.0.0.1:5552/%2F"


@dataclass(frozen=True)
class Planted:
    """Where the planted findings of one source are (offsets, half-open)."""

    stream: str
    gap: tuple[int, int]
    failed: tuple[int, int]
    lost: tuple[int, int]
    stuck: tuple[int, int]


@dataclass
class Filled:
    pipeline: str
    ranges: int
    planted: list[Planted] = field(default_factory=list)


def run_id(index: int) -> str:
    when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=5 * index)
    return f"scheduled__{when.isoformat()}"


def fill(url: str, *, pipeline: str = "events-backfill", partitions: int = 3, per_partition: int = 1000,
         span: int = 100) -> Filled:
    """Create the ledger at ``url`` (SQLite) and load ``partitions * per_partition`` ranges."""
    if not url.startswith("sqlite:///"):
        raise ValueError("fill() bulk-loads SQLite ledgers only")
    with Ledger(url, create=True) as ledger:
        now = datetime.now(UTC).replace(tzinfo=None)
        out = Filled(pipeline=pipeline, ranges=0)
        rows: list[dict[str, object]] = []
        with ledger.engine.begin() as conn:
            (guard,) = conn.execute(text(
                "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = :name"
            ), {"name": "streamledger_range_insert_guard"}).one()
            pid = conn.execute(
                Pipeline.__table__.insert().values(name=pipeline, created_at=now)).inserted_primary_key
            assert pid is not None
            for p in range(partitions):
                stream = f"events-{p}"
                sid = conn.execute(Source.__table__.insert().values(
                    pipeline_id=pid[0], broker=BROKER, stream=stream, super_stream="events", created_at=now,
                    epoch=0,
                )).inserted_primary_key
                assert sid is not None
                # the planted spots, spread over the history (indexes of ranges)
                gap_i, failed_i, lost_i = per_partition // 3, (2 * per_partition) // 3, per_partition // 2
                stuck_i = per_partition - 1
                for i in range(per_partition):
                    start, end = i * span, (i + 1) * span
                    status, records, first, last, err = "committed", span // 2, start, end - 1, None
                    claimed = now - timedelta(minutes=5 * (per_partition - i))
                    if i == gap_i:
                        continue  # offsets [start, end) belong to no range
                    if i == failed_i:
                        status, records, first, last, err = "failed", None, None, None, "Spark job failed"
                    elif i == lost_i:
                        status, records, first, last = "lost", 0, None, None
                    elif i == stuck_i:
                        status, records, first, last = "claimed", None, None, None
                        claimed = now - timedelta(hours=2)
                    rows.append({
                        "source_id": sid[0], "start_offset": start, "end_offset": end, "status": status,
                        "dag_id": DAG_ID, "run_id": run_id(i), "task_id": TASK_ID, "map_index": p,
                        "try_number": 1, "records": records, "first_seen": first, "last_seen": last,
                        # the runs stored the broker offset up to the failed hole (the watermark; in
                        # claim order a gap does not stop it, the audit reports it)
                        "output": None, "offset_stored": status == "committed" and i < failed_i,
                        "offset_verified": status == "committed" and i < failed_i, "error": err,
                        "claimed_at": claimed,
                        "committed_at": claimed + timedelta(seconds=30) if status == "committed" else None,
                        "updated_at": claimed, "heartbeat_at": claimed if status == "claimed" else None,
                        "published_at": claimed + timedelta(seconds=31) if status == "committed" else None,
                        "pinned": False,
                    })
                out.planted.append(Planted(
                    stream, gap=(gap_i * span, (gap_i + 1) * span),
                    failed=(failed_i * span, (failed_i + 1) * span),
                    lost=(lost_i * span, (lost_i + 1) * span), stuck=(stuck_i * span, (stuck_i + 1) * span),
                ))
            conn.execute(text("DROP TRIGGER streamledger_range_insert_guard"))
            conn.execute(Range.__table__.insert(), rows)
            conn.execute(text(guard))
        out.ranges = len(rows)
        return out
