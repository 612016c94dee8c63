"""What the ledger's rooms share besides SQL: argument checks, clipped text, statement-sized chunks and
the snapshot that turns a range row into an :class:`OffsetRange`.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from streamledger.ledger.errors import LedgerError
from streamledger.ledger.models import Source
from streamledger.ledger.types import OffsetRange, RangeStatus, RunIdentity, SourceRef, pipeline_name_problem
from streamledger.sources import MAX_OFFSET

MAX_TEXT = 4000


def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def check_pipeline(pipeline: str) -> None:
    problem = pipeline_name_problem(pipeline)
    if problem is not None:
        raise LedgerError(problem)


def check_offset(name: str, value: object, stream: str | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_OFFSET:
        where = f" for stream {stream!r}" if stream else ""
        raise LedgerError(f"{name}{where} must be an integer offset in 0..2**63-1, got {value!r}")
    return value


def snapshot(row: Any, pipeline: str, source: Source | SourceRef) -> OffsetRange:
    """``row``: a ``Range`` or a Core row / namespace with the same attribute names."""
    ref = (
        source
        if isinstance(source, SourceRef)
        else SourceRef(broker=source.broker, stream=source.stream, super_stream=source.super_stream)
    )
    return OffsetRange(
        id=row.id,
        pipeline=pipeline,
        source=ref,
        start=row.start_offset,
        end=row.end_offset,
        status=RangeStatus(row.status),
        run=RunIdentity(
            dag_id=row.dag_id,
            run_id=row.run_id,
            task_id=row.task_id,
            map_index=row.map_index,
            try_number=row.try_number,
        ),
        records=row.records,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        output=row.output,
        offset_stored=row.offset_stored,
        offset_verified=row.offset_verified,
        error=row.error,
        claimed_at=utc(row.claimed_at),
        committed_at=utc(row.committed_at) if row.committed_at is not None else None,
        heartbeat_at=utc(row.heartbeat_at) if getattr(row, "heartbeat_at", None) is not None else None,
        staging=getattr(row, "staging", None),
        published_at=utc(row.published_at) if getattr(row, "published_at", None) is not None else None,
        publisher=getattr(row, "publisher", None),
        publish_beat=utc(row.publish_beat) if getattr(row, "publish_beat", None) is not None else None,
        sink_table=getattr(row, "sink_table", None),
        sink_commit=getattr(row, "sink_commit", None),
        interval=(utc(row.interval_start), utc(row.interval_end))
        if getattr(row, "interval_start", None) is not None and getattr(row, "interval_end", None) is not None
        else None,
        rows_out=getattr(row, "rows_out", None),
        dead_letter=getattr(row, "dead_letter", None),
        transform=getattr(row, "transform", None),
    )


def chunks(items: list[Any], size: int = 500) -> Iterator[list[Any]]:
    """``items`` in slices small enough for one statement's bound parameters on every dialect."""
    for i in range(0, len(items), size):
        yield items[i:i + size]
