"""What a batch is asked to do (``BatchConfig``), who runs it (``RunId``) and what it did
(``BatchResult``): pure data, so it can be templated, logged, pickled and returned as XCom."""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Protocol

from streamledger.batch.rules import sink_problem, source_problem
from streamledger.batch.spec import InitialPosition as InitialPosition
from streamledger.batch.spec import PipelineSpec
from streamledger.errors import BatchError as BatchError  # the sinks import it from here
from streamledger.ledger.types import RunIdentity
from streamledger.manifest import Manifest


class IntervalNotReady(BatchError):
    """A pinned interval's end cannot be resolved yet: the broker's committed tail has not passed
    the interval end (and the idle-stream grace has not run out). Nothing was read or committed;
    try again at ``ready_by`` at the latest (the Airflow operator defers until then)."""

    def __init__(self, message: str, ready_by: datetime) -> None:
        super().__init__(message)
        self.ready_by = ready_by


class StreamReplaced(BatchError):
    """The broker no longer holds the stream a source's ledger history was read from (deleted and
    re-created): nothing was claimed or stored; ``streamledger ledger new-epoch`` starts a new
    history once the user confirms it is a new stream."""


class InjectedCrash(BaseException):
    """For tests' step hooks: a BaseException, so none of the batch's clean-up code runs (a kill)."""


class Broker(Protocol):
    """The log calls a batch needs: a RabbitMQ ``StreamClient`` or a mewbase ``MewbaseLog`` (any
    offset-addressed log; ``streamledger.sources.connect_log(url)`` gives the one a URL names).

    Optional, looked up with ``getattr``: ``read_range`` (to see that a range holds no user
    record without starting a job) and ``cluster_name`` (the broker's stable identity).
    """

    def partitions(self, super_stream: str) -> list[str]: ...
    def first_offset(self, name: str) -> int: ...
    def committed_tail(self, name: str) -> int: ...
    def query_offset(self, stream: str, reference: str) -> int | None: ...
    def resolve_offset(self, name: str, spec: Any) -> int: ...
    def store_offset_verified(
        self, stream: str, reference: str, offset: int, *, timeout: float = ...
    ) -> None: ...


JobRunner = Callable[..., Manifest | Mapping[str, Any]]
"""``runner(url=..., ranges={stream: (start, end), ...}, output=staging_dir, fmt=..., splits=n)``
-> :class:`~streamledger.manifest.Manifest`. ``ranges`` holds every partition of the batch (one job
per batch); the manifest's ``streams[s].path`` is where stream ``s``'s records were written
(default: ``output`` itself when there is one stream). The runners here return a ``Manifest``; a
runner written against the first contract may still return the manifest's JSON data, which the
batch parses once, where it takes the result."""

StepHook = Callable[[str, Any], None]
"""``hook(step, batch_run)`` after each step: ``claimed``, ``read``, ``committed``, ``published``,
``stored``; with a table sink also ``table_committed`` (inside the publish: after the table
commit, before the ledger records it). Tests inject crashes here; production code passes none.
Finer marks for timing (``bench/partitions.py``): ``planned`` (sources checked, before any
claim), ``probed`` (ranges without user records committed), ``job`` (the job returned, before
verifying it)."""

@dataclass(frozen=True, slots=True, kw_only=True)
class BatchConfig(PipelineSpec):
    """A :class:`~streamledger.batch.spec.PipelineSpec` bound to one run: what to read and where to
    write it (the spec's fields, validated by the spec), plus what only a run knows.

    ``url`` is the broker URL (it may hold a password: never log it). ``max_records`` is the old,
    misleading name of ``max_offsets`` (deprecated: it counts offsets, not records).
    ``catalog``: the Iceberg sink's pyiceberg catalog properties (default: a SQL catalog in the
    ledger's own database, warehouse ``<output_root>/_iceberg``); ``table`` is ``namespace.name``
    for Iceberg (default ``streamledger.<pipeline>``), the table's location for Delta (default
    ``<output_root>/<pipeline>``). ``interval_start`` / ``interval_end``: the run's data interval.
    ``bound_by_interval`` pins each partition's range to it: ``[first offset stamped at or after
    interval_start, first offset stamped at or after interval_end)``, the same whichever run goes
    first and however often it is rerun (``Ledger.claim(span=...)``); it is resolved once a chunk
    stamped at or after the interval end is committed (until then: ``IntervalNotReady``), or, on an
    idle stream, once ``interval_grace`` seconds have passed after the interval end (the end is then
    the committed tail). ``origin`` is where a pinned history begins (the moment
    ``initial_position="interval_start"`` resolves; the DAG's start date), so that it does not
    depend on which interval runs first; default: the run's own interval start.
    """

    url: str
    max_records: int | None = None
    interval_start: datetime | None = None
    interval_end: datetime | None = None
    catalog: Mapping[str, str] | None = None
    origin: datetime | None = None

    def __post_init__(self) -> None:
        name = f"pipeline {self.pipeline!r}"
        if self.max_records is not None:
            warnings.warn(
                "BatchConfig.max_records counts offsets, not records (tracking chunks take offsets); "
                "use max_offsets",
                DeprecationWarning,
                stacklevel=3,
            )
            if self.max_offsets is not None and self.max_offsets != self.max_records:
                raise BatchError(f"{name}: give max_offsets only (max_records is its old name)")
            object.__setattr__(self, "max_offsets", self.max_records)
        PipelineSpec.__post_init__(self)
        # What only a run knows: the URL's kind of log, the catalog's properties, the interval.
        problem = (source_problem(self.pipeline, self.stream, self.super_stream, self.url)
                   or self._run_problem())
        if problem is not None:
            raise BatchError(problem if problem.startswith("pipeline ") else f"{name}: {problem}")

    def _run_problem(self) -> str | None:
        if self.catalog is not None:
            problem = sink_problem(self.sink, self.table, self.catalog, self.fmt)
            if problem is not None:
                return problem
        if self.initial_position == "interval_start" and self.interval_start is None:
            return "initial_position 'interval_start' needs an interval"
        if (self.interval_start is None) != (self.interval_end is None):
            return "give both interval ends or neither"
        if self.interval_start and self.interval_end and self.interval_end < self.interval_start:
            return "data interval ends before it starts"
        if self.bound_by_interval and self.interval_start is None:
            return "bound_by_interval needs the data interval (interval_start/end)"
        return None

    @classmethod
    def for_run(cls, spec: PipelineSpec, *, url: str, interval_start: datetime | None = None,
                interval_end: datetime | None = None, catalog: Mapping[str, str] | None = None,
                origin: datetime | None = None) -> BatchConfig:
        """``spec`` bound to one run: its broker URL, data interval and catalog properties."""
        return cls(**spec.settings(), url=url, interval_start=interval_start, interval_end=interval_end,
                   catalog=catalog, origin=origin)

    @property
    def spec(self) -> PipelineSpec:
        """The pipeline as its definition states it (without what this run brought)."""
        return PipelineSpec(**self.settings())


RunId = RunIdentity
"""Who runs the batch: the ledger's :class:`~streamledger.ledger.types.RunIdentity` (one identity type).

``(dag_id, run_id, task_id, map_index)`` is the identity: a retry (another ``try_number``) gets
the same ranges back. ``map_index`` -1 means "not mapped"; 0 is the first mapped task.
"""


class StartFrom(enum.StrEnum):
    """Where a partition's range came from: ``held`` (this run's own range from an earlier attempt, a
    retry), ``new`` (claimed by this attempt: a failed or abandoned hole, else new data at the tail),
    ``reread`` (a committed range read again because both copies of its files were gone)."""

    HELD = "held"
    NEW = "new"
    REREAD = "reread"


class PartitionStatus(enum.StrEnum):
    """Where a partition is in this batch: ``planned``, ``empty`` (nothing new), ``claimed``,
    ``committed`` (this run's range is done), ``failed``, ``lost`` (recorded lost), ``unknown`` (the
    commit's outcome is unknown: the staging copy is kept, the ledger may point at it)."""

    PLANNED = "planned"
    EMPTY = "empty"
    CLAIMED = "claimed"
    COMMITTED = "committed"
    FAILED = "failed"
    LOST = "lost"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class PartitionResult:
    """The outcome for one partition; ``to_dict`` is the XCom / Asset-event form.

    ``status`` is a :class:`PartitionStatus` (``committed`` with ``records`` 0 when the range held
    no user record); ``start_from`` a :class:`StartFrom`. ``to_dict`` gives both as their strings.
    ``epoch``: the stream's incarnation in the ledger the range belongs to (0 until ``new-epoch``).
    """

    stream: str
    start: int
    end: int
    start_from: StartFrom
    range_id: int | None = None
    records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    output: str | None = None
    status: PartitionStatus = PartitionStatus.PLANNED
    offset_stored: int | None = None
    lost: tuple[int, int] | None = None
    read: bool = False
    epoch: int = 0
    rows: int | None = None
    """With a transform: the rows it wrote for the range (None: raw records, as many as ``records``)."""
    dead_letter: int | None = None
    """With a decoding transform and ``on_bad_record="dead_letter"``: the records set aside."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["start_from"], out["status"] = str(self.start_from), str(self.status)
        return out


@dataclass(slots=True)
class BatchResult:
    """Summary of one batch across partitions, and the table a table sink published into."""

    pipeline: str
    broker: str
    super_stream: str | None
    partitions: list[PartitionResult] = field(default_factory=list)
    table: dict[str, Any] | None = None
    """A table sink's table after the batch (the sink's ``describe()``: no credentials); None for
    the directory sink."""
    catalog: Mapping[str, str] | None = field(default=None, repr=False)
    """The Iceberg catalog's properties the batch used (for lineage; never in ``to_dict``)."""

    @property
    def empty(self) -> bool:
        return all(p.start == p.end for p in self.partitions)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    def ranges(self) -> dict[str, list[int]]:
        """Per stream the bounds of every span the batch read, in offset order and flattened:
        ``[start, end]`` for the usual one piece, ``[s1, e1, s2, e2]`` when a pinned retry read
        several pieces of one stream (pieces that touch are one span). Never only the last piece:
        what XCom, Dagster's metadata and asset events report (each piece on its own:
        :func:`streamledger.batch.lineage.lineage_of`)."""
        spans: dict[str, list[list[int]]] = {}
        for p in sorted(self.partitions, key=lambda p: (p.stream, p.start, p.end)):
            mine = spans.setdefault(p.stream, [])
            if mine and mine[-1][1] == p.start:
                mine[-1][1] = p.end
            elif not mine or mine[-1] != [p.start, p.end]:
                mine.append([p.start, p.end])
        return {s: [bound for span in pieces for bound in span] for s, pieces in spans.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "broker": self.broker,
            "super_stream": self.super_stream,
            "empty": self.empty,
            "records": self.records,
            "ranges": self.ranges(),
            "partitions": [p.to_dict() for p in self.partitions],
            **({} if self.table is None else {"table": self.table}),
        }


def summarize(result: BatchResult) -> str:
    """One line per partition for task logs."""
    lines = [f"pipeline {result.pipeline} on {result.broker}: {result.records} records"]
    for p in result.partitions:
        lines.append(
            f"  {p.stream} [{p.start}, {p.end}) {p.status} records={p.records} "
            f"offsets={p.first_offset}..{p.last_offset} stored={p.offset_stored} output={p.output}"
        )
    return "\n".join(lines)
