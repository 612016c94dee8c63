"""One bounded batch of a pipeline: plan -> claim -> read -> verify -> commit -> store offset.

This module is framework-neutral (no Airflow imports): the Airflow operator is a thin adapter over
:func:`run_batch`, and another scheduler can call it the same way.

Delivery semantics
==================

A *pipeline* is a consumer reference (the name used for the broker's StoreOffset). For every
partition (a stream, or each partition of a super stream) one batch processes exactly one half-open
offset range ``[start, end)``, and the ledger is the source of truth for which ranges are done.

1. **plan** (read-only). ``start`` is the ledger's last end for the pipeline and partition; without
   ledger history, the broker's stored offset for the pipeline + 1; without that, the configured
   initial position (``first``, ``tail``, a data-interval timestamp or an offset). ``end`` is the
   committed tail (so a read never waits for data), optionally capped at ``start + max_records``
   offsets or, for backfills, at the first offset stamped at or after the data interval's end
   (chunk timestamps are broker time at publish; resolution is chunk-granular). A start below the
   first retained offset (retention ran first) fails the batch, or with ``on_data_loss="record"`` the
   span is recorded as ``lost`` in the ledger (the audit shows it) and reading starts at the first
   retained offset.
2. **claim**: the ledger records ``[start, end)`` as ``claimed`` under the run identity (dag, run,
   task, map index). Claiming again for the same identity returns the same range, which is what
   makes retries and cleared tasks deterministic. Empty ranges are never claimed: nothing happens.
3. **read**: the Spark job reads exactly the records of the range and *overwrites* the range's
   output directory, whose path is a pure function of (output root, pipeline, stream, start, end).
4. **verify**: the job's manifest must name the same stream and range, and its first/last offsets
   must lie inside the range; on a re-read of a committed range the record count must equal the
   committed count (otherwise the broker no longer holds the same records and the batch fails).
5. **commit**: the ledger moves the range to ``committed`` with the record count, the first and
   last offsets seen and the output path (a re-read of a committed range leaves it as it is).
6. **store offset**: the broker's stored offset for the pipeline becomes ``end - 1`` (the last
   offset the range covers, so ``stored + 1`` is the ledger's next start), read back until visible,
   and the ledger notes it as stored and verified. Only the newest range of a partition stores an
   offset, so re-running an old interval never moves the broker backwards.

What a crash at each step leads to (a retry or a cleared task runs the same identity again):

* before or during **claim**: nothing or a ``claimed`` row exists; the retry claims/gets the same
  range.
* during or after **read**, before **commit** (the range is ``claimed``, output may be partial or
  complete): the retry re-reads the same range into the same directory, overwriting it, then
  commits. A failure that Python sees (an exception) marks the range ``failed`` first; the ledger
  hands a failed range back as-is.
* after **commit**, before **store offset**: the ledger is ahead of the broker (the audit reports the
  drift). The retry re-reads and overwrites the same output (same records, checked against the
  committed count), then stores the offset.
* after **store offset**: the retry repeats the read and the (idempotent) store.

Hence the output is exactly-once *per range*: every offset of the partition belongs to exactly one
committed range (ledger invariant), and each range's records live in exactly one directory that any
number of attempts overwrite with identical content. The broker's stored offset is at-least as old
as the ledger (never ahead), so a consumer resuming from it re-reads at worst the last range.

Test hook
=========

``STREAMLEDGER_CRASH_AT=<step>`` (``after_claim``, ``after_write``, ``after_commit``,
``after_store``) makes the batch stop dead at that step so tests can prove the claims above.
``STREAMLEDGER_CRASH_MODE=exit`` (default) ends the process with ``os._exit(137)``, exactly like a
kill; ``raise`` raises :class:`InjectedCrash`, a ``BaseException`` that skips all clean-up.
``STREAMLEDGER_CRASH_TRIES`` (comma list, default ``1``) limits the crash to those try numbers so
the retry goes through. Never set these outside tests.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

from streamledger.errors import StreamledgerError

if TYPE_CHECKING:
    from streamledger.ledger import Ledger, OffsetRange

log = logging.getLogger(__name__)

CRASH_STEPS = ("after_claim", "after_write", "after_commit", "after_store")
CrashStep = Literal["after_claim", "after_write", "after_commit", "after_store"]


class BatchError(StreamledgerError):
    """The batch cannot run as configured, or its result disagrees with its plan."""


class InjectedCrash(BaseException):
    """Raised by the test hook in ``raise`` mode; a BaseException so no clean-up code runs."""


# ---------------------------------------------------------------------------------------------
# Injected collaborators (structural types, satisfied by StreamClient and run_job)
# ---------------------------------------------------------------------------------------------


class Broker(Protocol):
    """The broker calls a batch needs (a subset of ``StreamClient``)."""

    def partitions(self, super_stream: str) -> list[str]: ...
    def first_offset(self, name: str) -> int: ...
    def committed_tail(self, name: str) -> int: ...
    def query_offset(self, stream: str, reference: str) -> int | None: ...
    def resolve_offset(self, name: str, spec: Any) -> int: ...
    def store_offset_verified(
        self, stream: str, reference: str, offset: int, *, timeout: float = ...
    ) -> None: ...


JobRunner = Callable[..., Mapping[str, Any]]
"""``runner(url=..., ranges={stream: (start, end)}, output=dir, fmt=..., splits=n) -> manifest``."""


# ---------------------------------------------------------------------------------------------
# Configuration and results
# ---------------------------------------------------------------------------------------------

InitialPosition = Literal["first", "tail", "interval_start"] | int


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """What to read and where to write it; pure data so it can be templated and logged.

    ``url`` is the broker URL (it may hold a password: never log it; use :func:`broker_identity`).
    """

    pipeline: str
    url: str
    output_root: str
    stream: str | None = None
    super_stream: str | None = None
    initial_position: InitialPosition = "first"
    max_records: int | None = None
    interval_start: datetime | None = None
    interval_end: datetime | None = None
    fmt: str = "parquet"
    splits: int = 1
    store_offset: bool = True
    store_timeout: float = 10.0
    on_data_loss: Literal["fail", "record"] = "fail"

    def __post_init__(self) -> None:
        if not self.pipeline or len(self.pipeline) > 256:
            raise BatchError(f"pipeline reference must be 1..256 characters, got {len(self.pipeline)}")
        if (self.stream is None) == (self.super_stream is None):
            raise BatchError(f"pipeline {self.pipeline!r}: give exactly one of stream or super_stream")
        if self.max_records is not None and self.max_records < 1:
            raise BatchError(f"pipeline {self.pipeline!r}: max_records must be >= 1, got {self.max_records}")
        if self.splits < 1:
            raise BatchError(f"pipeline {self.pipeline!r}: splits must be >= 1, got {self.splits}")
        if self.on_data_loss not in ("fail", "record"):
            raise BatchError(f"pipeline {self.pipeline!r}: on_data_loss must be 'fail' or 'record'")
        if isinstance(self.initial_position, int):
            if self.initial_position < 0:
                raise BatchError(f"pipeline {self.pipeline!r}: initial offset must be >= 0")
        elif self.initial_position not in ("first", "tail", "interval_start"):
            raise BatchError(
                f"pipeline {self.pipeline!r}: initial_position {self.initial_position!r} is not "
                "'first', 'tail', 'interval_start' or an offset"
            )
        if self.initial_position == "interval_start" and self.interval_start is None:
            raise BatchError(
                f"pipeline {self.pipeline!r}: initial_position 'interval_start' needs an interval"
            )
        if (self.interval_start is None) != (self.interval_end is None):
            raise BatchError(f"pipeline {self.pipeline!r}: give both interval ends or neither")
        if self.interval_start and self.interval_end and self.interval_end < self.interval_start:
            raise BatchError(f"pipeline {self.pipeline!r}: data interval ends before it starts")


@dataclass(frozen=True, slots=True)
class RunId:
    """Who runs the batch (mirrors the ledger's RunIdentity, kept here to stay framework-neutral)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    try_number: int = 1


@dataclass(slots=True)
class PartitionResult:
    """The outcome for one partition; ``to_dict`` is the XCom / Asset-event form."""

    stream: str
    start: int
    end: int
    start_from: str
    range_id: int | None = None
    records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    output: str | None = None
    status: str = "planned"
    offset_stored: int | None = None
    lost: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class BatchResult:
    """Summary of one batch across partitions."""

    pipeline: str
    broker: str
    super_stream: str | None
    partitions: list[PartitionResult] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return all(p.start == p.end for p in self.partitions)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    def ranges(self) -> dict[str, list[int]]:
        return {p.stream: [p.start, p.end] for p in self.partitions}

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "broker": self.broker,
            "super_stream": self.super_stream,
            "empty": self.empty,
            "records": self.records,
            "ranges": self.ranges(),
            "partitions": [p.to_dict() for p in self.partitions],
        }


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def broker_identity(url: str) -> str:
    """A credential-free name for the broker (``rabbitmq://host:port/vhost``) for the ledger."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = parts.port or (5551 if parts.scheme.endswith("+tls") else 5552)
    vhost = parts.path.lstrip("/") or "%2F"
    return f"rabbitmq://{host}:{port}/{vhost}"


def output_dir(root: str, pipeline: str, stream: str, start: int, end: int) -> str:
    """The range's output directory: a pure function of its inputs, so every attempt overwrites it."""
    safe_pipeline = pipeline.replace("/", "_")
    return str(Path(root) / safe_pipeline / stream / f"{start:012d}-{end:012d}")


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def crash_point(step: CrashStep, try_number: int) -> None:
    """The test hook described in the module docstring."""
    wanted = os.environ.get("STREAMLEDGER_CRASH_AT")
    if wanted != step:
        return
    tries = {int(t) for t in os.environ.get("STREAMLEDGER_CRASH_TRIES", "1").split(",") if t.strip()}
    if try_number not in tries:
        return
    log.warning("STREAMLEDGER_CRASH_AT=%s: simulating a crash on try %d", step, try_number)
    if os.environ.get("STREAMLEDGER_CRASH_MODE", "exit") == "raise":
        raise InjectedCrash(step)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(137)


# ---------------------------------------------------------------------------------------------
# The batch
# ---------------------------------------------------------------------------------------------


class BatchRun:
    """One batch; each phase is a method so callers and tests can see where they are."""

    def __init__(
        self,
        config: BatchConfig,
        *,
        run: RunId,
        ledger: Ledger,
        broker: Broker,
        runner: JobRunner,
        holder_alive: Callable[[RunId], bool] | None = None,
    ) -> None:
        self.config = config
        self.holder_alive = holder_alive
        self.run = run
        self.ledger = ledger
        self.broker = broker
        self.runner = runner
        self.result = BatchResult(
            pipeline=config.pipeline, broker=broker_identity(config.url), super_stream=config.super_stream
        )
        self._ranges: dict[str, OffsetRange] = {}
        self._committed_before: dict[str, bool] = {}
        self._known: dict[str, OffsetRange] = {}

    # -- plan ---------------------------------------------------------------------------------

    def streams(self) -> list[str]:
        cfg = self.config
        if cfg.super_stream is not None:
            names = self.broker.partitions(cfg.super_stream)
            if not names:
                raise BatchError(f"super stream {cfg.super_stream!r} has no partitions")
            return list(names)
        assert cfg.stream is not None
        return [cfg.stream]

    def _source(self, stream: str) -> Any:
        from streamledger.ledger import SourceRef

        return SourceRef(broker=self.result.broker, stream=stream, super_stream=self.config.super_stream)

    def _identity(self) -> Any:
        from streamledger.ledger import RunIdentity

        r = self.run
        return RunIdentity(r.dag_id, r.run_id, r.task_id, map_index=r.map_index, try_number=r.try_number)

    def _resolve_time(self, stream: str, moment: datetime) -> int:
        from streamledger.protocol.rabbitmq import OffsetSpec

        return int(self.broker.resolve_offset(stream, OffsetSpec.timestamp(_millis(moment))))

    def _source_ranges(self, stream: str) -> list[OffsetRange]:
        """The stream's ranges, live ones (committed, then claimed) before failed history rows."""
        rank = {"committed": 0, "claimed": 1, "failed": 2}
        found = [
            r for r in self.ledger.ranges(self.config.pipeline, stream=stream)
            if r.source.broker == self.result.broker and str(r.status) in rank
        ]
        return sorted(found, key=lambda r: rank[str(r.status)])

    def _held_by_this_run(self, stream: str) -> OffsetRange | None:
        """The range this run identity already holds for the stream (a retry or a cleared task)."""
        r = self.run
        for candidate in self._source_ranges(stream):
            held = candidate.run
            if (
                (held.dag_id, held.run_id, held.task_id, held.map_index)
                == (r.dag_id, r.run_id, r.task_id, r.map_index)
                and str(candidate.status) in ("claimed", "committed", "failed")
            ):
                return candidate
        return None

    def _range_ending_at(self, stream: str, end: int) -> OffsetRange | None:
        """The range of an earlier run of the same data interval (keyed by its end offset)."""
        for candidate in self._source_ranges(stream):
            if candidate.end == end and str(candidate.status) in ("claimed", "committed", "failed"):
                return candidate
        return None

    def _reuse(self, stream: str, rng: OffsetRange, how: str) -> PartitionResult:
        self._known[stream] = rng
        return PartitionResult(stream, rng.start, rng.end, f"{how}:{rng.status}", range_id=rng.id)

    def plan_partition(self, stream: str) -> PartitionResult:
        """Compute ``[start, end)`` for one partition without writing anything.

        Re-runs find their range again: by run identity (Airflow retries and cleared tasks keep the
        run id) or, for interval-bounded batches, by the interval's end offset (``airflow dags
        test`` and re-triggered runs get a new run id for the same data interval).
        """
        cfg = self.config
        mine = self._held_by_this_run(stream)
        if mine is not None:
            return self._reuse(stream, mine, "run")
        tail = self.broker.committed_tail(stream)
        cap = tail
        if cfg.interval_start is not None and cfg.interval_end is not None:
            first = min(tail, self._resolve_time(stream, cfg.interval_start))
            last = min(tail, self._resolve_time(stream, cfg.interval_end))
            if last <= first:
                return PartitionResult(stream, last, last, "interval:empty")
            earlier = self._range_ending_at(stream, last)
            if earlier is not None:
                return self._reuse(stream, earlier, "interval")
            cap = last
        last_end = self.ledger.last_end(cfg.pipeline, self._source(stream))
        if last_end is not None:
            start, origin = last_end, "ledger"
        else:
            stored = self.broker.query_offset(stream, cfg.pipeline)
            if stored is not None:
                start, origin = stored + 1, "broker"
            elif isinstance(cfg.initial_position, int):
                start, origin = cfg.initial_position, "initial"
            elif cfg.initial_position == "first":
                start, origin = self.broker.first_offset(stream), "first"
            elif cfg.initial_position == "tail":
                start, origin = tail, "tail"
            else:
                assert cfg.interval_start is not None
                start, origin = min(tail, self._resolve_time(stream, cfg.interval_start)), "interval_start"
        if start > tail:
            raise BatchError(
                f"stream {stream!r}: pipeline {cfg.pipeline!r} would start at {start} ({origin}) "
                f"but the committed tail is {tail}"
            )
        lost: tuple[int, int] | None = None
        first = self.broker.first_offset(stream)
        if start < first:
            if cfg.on_data_loss == "fail":
                raise BatchError(
                    f"stream {stream!r}: pipeline {cfg.pipeline!r} must resume at offset {start} ({origin}) "
                    f"but retention removed everything below {first}; set on_data_loss='record' to record "
                    f"[{start}, {first}) as lost and go on"
                )
            lost, start = (start, first), first
        end = cap
        if cfg.max_records is not None:
            end = min(end, start + cfg.max_records)
        # An interval that ends before our position holds nothing new for us: empty, not an error.
        return PartitionResult(stream, start, max(end, start), origin, lost=lost)

    def plan(self) -> list[PartitionResult]:
        self.result.partitions = [self.plan_partition(s) for s in self.streams()]
        return self.result.partitions

    # -- claim --------------------------------------------------------------------------------

    def claim(self) -> None:
        cfg = self.config
        for part in self.result.partitions:
            if part.lost is not None:
                lost_start, lost_end = part.lost
                self.ledger.record_lost(
                    cfg.pipeline, self._source(part.stream), lost_start, lost_end, self._identity(),
                    f"retention removed offsets below {lost_end} before pipeline {cfg.pipeline} read them",
                )
                log.warning("stream %s: recorded [%d, %d) as lost (retention)", part.stream, lost_start,
                            lost_end)
            if part.start == part.end and part.range_id is None:
                part.status = "empty"
                continue
            known = self._known.get(part.stream)
            if known is not None and str(known.status) == "committed":
                rng = known  # a re-run of a committed range: re-read it, never re-claim it
            else:
                if known is not None and str(known.status) == "claimed":
                    self._take_over(part, known)
                initial = part.start if part.start_from != "ledger" else None
                rng = self.ledger.claim(
                    cfg.pipeline, self._source(part.stream), part.end, self._identity(), initial_start=initial
                )
            if (rng.start, rng.end) != (part.start, part.end):
                if str(rng.status) == "claimed" and rng.run.run_id == self.run.run_id:
                    self.ledger.fail(rng.id, "claimed a range other than planned")
                raise BatchError(
                    f"stream {part.stream!r}: the ledger handed out [{rng.start}, {rng.end}) for pipeline "
                    f"{cfg.pipeline!r} but the plan was [{part.start}, {part.end}): a failed range must be "
                    "redone first (re-run the run that failed it) or another writer is active"
                )
            self._ranges[part.stream] = rng
            self._committed_before[part.stream] = str(rng.status) == "committed"
            part.range_id = rng.id
            part.status = str(rng.status)
        crash_point("after_claim", self.run.try_number)

    def _take_over(self, part: PartitionResult, held: OffsetRange) -> None:
        """Release a claim left by an earlier run of the same task and data interval.

        That happens when the earlier run was killed and then deleted or re-triggered (``airflow dags
        test`` re-creates the run under a new id). Taking over is safe only if the holder is not
        running any more, which the caller's ``holder_alive`` answers (the Airflow operator asks
        Airflow); without that answer the batch refuses rather than risk two writers.
        """
        h = held.run
        mine = self.run
        if (h.dag_id, h.run_id, h.task_id, h.map_index) == (mine.dag_id, mine.run_id, mine.task_id,
                                                            mine.map_index):
            return  # our own claim: the ledger hands it back
        holder = RunId(h.dag_id, h.run_id, h.task_id, h.map_index, h.try_number)
        same_task = (h.dag_id, h.task_id, h.map_index) == (mine.dag_id, mine.task_id, mine.map_index)
        if not same_task or self.holder_alive is None or self.holder_alive(holder):
            raise BatchError(
                f"stream {part.stream!r}: range [{held.start}, {held.end}) of pipeline "
                f"{self.config.pipeline!r} is claimed by {h} which may still be running; fail or "
                "release that claim first"
            )
        log.warning("taking over range [%d, %d) of %s from %s (no longer running)",
                    held.start, held.end, part.stream, h)
        self.ledger.fail(held.id, f"taken over by {mine.dag_id}/{mine.run_id}: the holder is gone")

    def _active(self) -> list[PartitionResult]:
        return [p for p in self.result.partitions if p.stream in self._ranges]

    # -- read + verify ------------------------------------------------------------------------

    def read(self) -> None:
        cfg = self.config
        for part in self._active():
            out = output_dir(cfg.output_root, cfg.pipeline, part.stream, part.start, part.end)
            began = time.monotonic()
            manifest = self.runner(
                url=cfg.url, ranges={part.stream: (part.start, part.end)}, output=out, fmt=cfg.fmt,
                splits=cfg.splits,
            )
            self.verify(part, manifest)
            part.output = out
            log.info(
                "read %s [%d, %d): %d records -> %s in %.1f s",
                part.stream, part.start, part.end, part.records, out, time.monotonic() - began,
            )
        crash_point("after_write", self.run.try_number)

    def verify(self, part: PartitionResult, manifest: Mapping[str, Any]) -> None:
        """Check the job's manifest against the plan (and the ledger, for a committed range)."""
        where = f"stream {part.stream!r} range [{part.start}, {part.end})"
        streams = manifest.get("streams") or {}
        if set(streams) != {part.stream}:
            raise BatchError(f"{where}: the job's manifest covers {sorted(streams)} instead")
        entry = streams[part.stream]
        if (int(entry["start"]), int(entry["end"])) != (part.start, part.end):
            raise BatchError(f"{where}: the job read [{entry['start']}, {entry['end']}) instead")
        records = int(entry["records"])
        first, last = entry.get("first_offset"), entry.get("last_offset")
        if records < 0 or records > part.end - part.start:
            raise BatchError(f"{where}: impossible record count {records}")
        if records == 0:
            if first is not None or last is not None:
                raise BatchError(f"{where}: no records but first/last offsets {first}/{last}")
        else:
            if first is None or last is None or not (part.start <= first <= last < part.end):
                raise BatchError(f"{where}: first/last offsets {first}/{last} lie outside the range")
        if self._committed_before.get(part.stream):
            rng = self._ranges[part.stream]
            if rng.records != records:
                raise BatchError(
                    f"{where}: re-read found {records} records but the ledger committed {rng.records}; "
                    "the broker no longer holds the same data (retention?)"
                )
        part.records = records
        part.first_offset = None if first is None else int(first)
        part.last_offset = None if last is None else int(last)

    # -- commit + store offset ----------------------------------------------------------------

    def commit(self) -> None:
        for part in self._active():
            if self._committed_before[part.stream]:
                part.status = "committed"
                continue
            rng = self.ledger.commit(
                self._ranges[part.stream].id,
                records=part.records,
                first_seen=part.first_offset,
                last_seen=part.last_offset,
                output=part.output,
            )
            self._ranges[part.stream] = rng
            part.status = str(rng.status)
        crash_point("after_commit", self.run.try_number)

    def store_offsets(self) -> None:
        cfg = self.config
        if not cfg.store_offset:
            return
        for part in self._active():
            last_end = self.ledger.last_end(cfg.pipeline, self._source(part.stream))
            if last_end != part.end:
                log.info(
                    "stream %s: [%d, %d) is not the newest range (ledger end %s); broker offset left alone",
                    part.stream, part.start, part.end, last_end,
                )
                continue
            offset = part.end - 1
            self.broker.store_offset_verified(part.stream, cfg.pipeline, offset, timeout=cfg.store_timeout)
            self.ledger.mark_offset_stored(self._ranges[part.stream].id, True)
            part.offset_stored = offset
        crash_point("after_store", self.run.try_number)

    def fail(self, reason: str) -> None:
        """Mark every claimed, uncommitted range failed (best effort; the original error wins)."""
        for part in self._active():
            rng = self._ranges[part.stream]
            if str(rng.status) == "claimed" and part.status != "committed":
                try:
                    self.ledger.fail(rng.id, reason[:500])
                    part.status = "failed"
                except Exception:  # pragma: no cover - reported, never masks the original error
                    log.exception("could not mark range %s failed", rng.id)

    # -- all of it ----------------------------------------------------------------------------

    def execute(self) -> BatchResult:
        self.plan()
        for part in self.result.partitions:
            log.info(
                "plan %s [%d, %d) from %s (%d offsets)",
                part.stream, part.start, part.end, part.start_from, part.end - part.start,
            )
        try:
            self.claim()
            self.read()
            self.commit()
        except Exception as exc:
            self.fail(f"{type(exc).__name__}: {exc}")
            raise
        self.store_offsets()
        return self.result


def run_batch(
    config: BatchConfig,
    *,
    run: RunId,
    ledger: Ledger,
    broker: Broker,
    runner: JobRunner,
    holder_alive: Callable[[RunId], bool] | None = None,
) -> BatchResult:
    """Run one batch end to end (see the module docstring for what each step guarantees)."""
    return BatchRun(
        config, run=run, ledger=ledger, broker=broker, runner=runner, holder_alive=holder_alive
    ).execute()


# ---------------------------------------------------------------------------------------------
# The default runner: in-process local Spark
# ---------------------------------------------------------------------------------------------


class LocalSparkRunner:
    """Runs :func:`streamledger.spark.job.run_job` on an in-process SparkSession (``local[N]``).

    The session is created on first use and reused, because its start-up costs seconds. One batch
    range is small next to Spark's default of 200 shuffle partitions (the job's manifest aggregate
    shuffles), so the default here is 2 unless ``conf`` says otherwise.
    """

    def __init__(self, master: str = "local[2]", conf: Mapping[str, str] | None = None) -> None:
        self.master = master
        self.conf = {
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.showConsoleProgress": "false",  # progress bars only garble task logs
            **dict(conf or {}),
        }
        self._spark: Any = None

    def session(self) -> Any:
        if self._spark is None:
            from streamledger.spark.session import build_session

            self._spark = build_session(master=self.master, app_name="streamledger-batch", conf=self.conf)
        return self._spark

    def __call__(
        self, *, url: str, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str, splits: int
    ) -> Mapping[str, Any]:
        from streamledger.spark.job import run_job

        return run_job(self.session(), url=url, ranges=dict(ranges), output=output, fmt=fmt, splits=splits)


def read_manifest(output: str) -> dict[str, Any]:
    """Load ``DIR/_manifest.json`` written by the job (used after a spark-submit run)."""
    import json

    path = Path(output) / "_manifest.json"
    if not path.is_file():
        raise BatchError(f"the Spark job wrote no manifest at {path}")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def summarize(result: BatchResult) -> str:
    """One line per partition for task logs."""
    lines = [f"pipeline {result.pipeline} on {result.broker}: {result.records} records"]
    for p in result.partitions:
        lines.append(
            f"  {p.stream} [{p.start}, {p.end}) {p.status} records={p.records} "
            f"offsets={p.first_offset}..{p.last_offset} stored={p.offset_stored} output={p.output}"
        )
    return "\n".join(lines)


__all__: Sequence[str] = (
    "CRASH_STEPS", "BatchConfig", "BatchError", "BatchResult", "BatchRun", "Broker", "InjectedCrash",
    "JobRunner", "LocalSparkRunner", "PartitionResult", "RunId", "broker_identity", "crash_point",
    "output_dir", "read_manifest", "run_batch", "summarize",
)


def backlog(ledger: Ledger, broker: Broker, *, pipeline: str, url: str, streams: Sequence[str],
            super_stream: str | None = None) -> dict[str, int]:
    """Unprocessed offsets per stream: committed tail minus where the pipeline would start.

    This counts offsets, an upper bound on records (tracking chunks take offsets too). The start is
    found as in planning: ledger end, else broker stored offset + 1, else the first retained offset.
    """
    from streamledger.ledger import SourceRef

    ident = broker_identity(url)
    out: dict[str, int] = {}
    for stream in streams:
        tail = broker.committed_tail(stream)
        start = ledger.last_end(pipeline, SourceRef(broker=ident, stream=stream, super_stream=super_stream))
        if start is None:
            stored = broker.query_offset(stream, pipeline)
            start = stored + 1 if stored is not None else broker.first_offset(stream)
        out[stream] = max(0, tail - start)
    return out
