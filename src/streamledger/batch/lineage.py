"""What a batch tells the orchestrators: one :class:`RangeRecord` per range it reported, made from a
:class:`~streamledger.batch.config.BatchResult` by :func:`lineage_of`, the one place that shapes the
Airflow Asset events' ``extra``, the OpenLineage datasets and Dagster's materialization metadata.

Why records and not ``{stream: ...}`` maps: one batch may hold several ranges of one stream (a pinned
retry reads every piece of its failed span that nothing else covers), and a map keyed by stream kept
only the last piece. The per-stream maps remain for readers of the older keys, lossless: a stream
with one piece maps to its value, a stream with several to the list of them, in offset order.

Nothing here holds a secret: ``broker`` is the ledger's credential-free identity and output roots
with credentials are refused before a batch runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from streamledger.batch.config import BatchResult

__all__ = ["BatchLineage", "RangeRecord", "lineage_of"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RangeRecord:
    """One range of a batch: ``[start, end)`` of ``stream`` in its ``epoch`` (the stream's incarnation
    in the ledger; 0 until ``ledger new-epoch``), the ledger's ``range_id``, the published ``output``
    (None for a range without user records or not committed), and the broker offset stored after it."""

    stream: str
    epoch: int
    start: int
    end: int
    status: str
    records: int
    range_id: int | None
    output: str | None
    first_offset: int | None
    last_offset: int | None
    offset_stored: int | None
    rows: int | None = None
    """With a transform: the rows it wrote for the range (None: raw records, ``records`` rows)."""
    dead_letter: int | None = None
    """With ``on_bad_record="dead_letter"``: the range's records that did not decode, set aside."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _one_or_all(values: Sequence[_T]) -> _T | list[_T]:
    return values[0] if len(values) == 1 else list(values)


@dataclass(frozen=True, slots=True)
class BatchLineage:
    """A batch as the orchestrators report it; ``pieces`` in (stream, epoch, start) order."""

    pipeline: str
    broker: str
    super_stream: str | None
    records: int
    empty: bool
    ranges: dict[str, list[int]]
    pieces: tuple[RangeRecord, ...]
    table: dict[str, Any] | None = None

    def outputs(self) -> dict[str, str | list[str]]:
        """``{stream: published directory}``; a list of them for a stream with several pieces."""
        found: dict[str, list[str]] = {}
        for p in self.pieces:
            if p.output:
                found.setdefault(p.stream, []).append(p.output)
        return {s: _one_or_all(dirs) for s, dirs in found.items()}

    def range_ids(self) -> dict[str, int | list[int]]:
        """``{stream: ledger range id}``; a list of them for a stream with several pieces."""
        found: dict[str, list[int]] = {}
        for p in self.pieces:
            if p.range_id is not None:
                found.setdefault(p.stream, []).append(p.range_id)
        return {s: _one_or_all(ids) for s, ids in found.items()}

    @property
    def rows(self) -> int | None:
        """Rows a transform wrote over the batch's ranges (None: no transform ran)."""
        counted = [p.rows for p in self.pieces if p.rows is not None]
        return sum(counted) if counted else None

    @property
    def dead_letter(self) -> int | None:
        """Records set aside over the batch's ranges (None: nothing is set aside)."""
        counted = [p.dead_letter for p in self.pieces if p.dead_letter is not None]
        return sum(counted) if counted else None

    def stored_offsets(self) -> dict[str, int]:
        """``{stream: broker offset stored}`` for the streams whose offset this batch moved: the last
        one it stored (the newest epoch's highest; a stored offset only moves up)."""
        latest: dict[str, tuple[int, int]] = {}
        for p in self.pieces:
            if p.offset_stored is not None:
                latest[p.stream] = max(latest.get(p.stream, (p.epoch, p.offset_stored)),
                                       (p.epoch, p.offset_stored))
        return {s: offset for s, (_epoch, offset) in latest.items()}

    def ends(self) -> dict[str, int]:
        """``{stream: where this batch's reading of it ended}``: the newest epoch's highest end."""
        latest: dict[str, tuple[int, int]] = {}
        for p in self.pieces:
            latest[p.stream] = max(latest.get(p.stream, (p.epoch, p.end)), (p.epoch, p.end))
        return {s: end for s, (_epoch, end) in latest.items()}

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (an Asset event's ``extra``): the per-stream maps and every piece."""
        return {
            "pipeline": self.pipeline,
            "broker": self.broker,
            "super_stream": self.super_stream,
            "empty": self.empty,
            "records": self.records,
            **({} if self.rows is None else {"rows": self.rows, "dead_letter": self.dead_letter}),
            "ranges": self.ranges,
            "outputs": self.outputs(),
            "ledger_range_ids": self.range_ids(),
            "stored_offsets": self.stored_offsets(),
            "pieces": [p.to_dict() for p in self.pieces],
            **({} if self.table is None else {"table": self.table}),
        }


def lineage_of(result: BatchResult) -> BatchLineage:
    """Every range of ``result`` as a :class:`RangeRecord` (empty ones too: the batch looked at them)."""
    pieces = sorted(
        (RangeRecord(stream=p.stream, epoch=p.epoch, start=p.start, end=p.end, status=str(p.status),
                     records=p.records, range_id=p.range_id, output=p.output, first_offset=p.first_offset,
                     last_offset=p.last_offset, offset_stored=p.offset_stored, rows=p.rows,
                     dead_letter=p.dead_letter)
         for p in result.partitions),
        key=lambda r: (r.stream, r.epoch, r.start, r.end, r.range_id or 0),
    )
    return BatchLineage(pipeline=result.pipeline, broker=result.broker, super_stream=result.super_stream,
                        records=result.records, empty=result.empty, ranges=result.ranges(),
                        pieces=tuple(pieces), table=None if result.table is None else dict(result.table))
