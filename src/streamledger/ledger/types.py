"""Value types the ledger hands out and accepts.

They are frozen dataclasses, not ORM objects, so callers (Airflow operators, the batch runner, the
CLI) can keep, compare, pickle and serialise them after the ledger's transaction is gone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

MAX_PIPELINE_LENGTH = 256
"""The broker limits a consumer reference (the pipeline name, used for StoreOffset) to 256 characters."""


class RangeStatus(enum.StrEnum):
    """Where a range is in its life: ``claimed -> committed | failed``; ``lost`` is recorded directly."""

    CLAIMED = "claimed"
    COMMITTED = "committed"
    FAILED = "failed"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class SourceRef:
    """One readable stream: a broker URL (without credentials), the stream and its super stream, if any."""

    broker: str
    stream: str
    super_stream: str | None = None

    def __post_init__(self) -> None:
        if not self.broker:
            raise ValueError("SourceRef.broker must not be empty")
        if not self.stream:
            raise ValueError("SourceRef.stream must not be empty")


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """Who processes a range: the Airflow task instance (or any scheduler's equivalent).

    ``(dag_id, run_id, task_id, map_index)`` is the idempotency key: claiming again with the same key
    returns the same range. ``try_number`` is recorded (the latest attempt) but is not part of the key,
    so a retry of a crashed attempt gets its range back instead of claiming a new one.
    """

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    try_number: int = 1

    def __str__(self) -> str:
        mapped = f"[{self.map_index}]" if self.map_index >= 0 else ""
        return f"{self.dag_id}/{self.run_id}/{self.task_id}{mapped} try {self.try_number}"


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """A snapshot of one ledger row: the half-open offset span ``[start, end)`` of one source."""

    id: int
    pipeline: str
    source: SourceRef
    start: int
    end: int
    status: RangeStatus
    run: RunIdentity
    records: int | None
    first_seen: int | None
    last_seen: int | None
    output: str | None
    offset_stored: bool
    offset_verified: bool
    error: str | None
    claimed_at: datetime
    committed_at: datetime | None

    @property
    def empty(self) -> bool:
        """True when the span holds no offsets (``start == end``): nothing to read."""
        return self.start == self.end

    def describe(self) -> str:
        """A short human label: ``pipeline stream [start, end) status``."""
        return f"{self.pipeline} {self.source.stream} [{self.start}, {self.end}) {self.status.value}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (timestamps in ISO 8601, UTC)."""
        return {
            "id": self.id,
            "pipeline": self.pipeline,
            "broker": self.source.broker,
            "stream": self.source.stream,
            "super_stream": self.source.super_stream,
            "start": self.start,
            "end": self.end,
            "status": self.status.value,
            "dag_id": self.run.dag_id,
            "run_id": self.run.run_id,
            "task_id": self.run.task_id,
            "map_index": self.run.map_index,
            "try_number": self.run.try_number,
            "records": self.records,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "output": self.output,
            "offset_stored": self.offset_stored,
            "offset_verified": self.offset_verified,
            "error": self.error,
            "claimed_at": self.claimed_at.isoformat(),
            "committed_at": self.committed_at.isoformat() if self.committed_at else None,
        }
