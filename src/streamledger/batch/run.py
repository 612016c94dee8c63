"""The batch state machine: claim -> read -> verify -> commit -> publish -> store offset.

Each step is a method, so callers and tests can see where a batch is; ``on_step`` lets tests
stop a batch dead after any step (production passes none). See the package docstring for what a
crash at each step leads to.

:class:`BatchRun` holds one batch's state and runs the steps in order (:meth:`BatchRun.execute`);
the steps themselves live in :mod:`streamledger.batch.steps`, one module per step of the crash table
in docs/ledger.md ("The batch's steps and where it can crash").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamledger.batch.config import BatchConfig, BatchResult, Broker, JobRunner, RunId, StepHook
from streamledger.batch.position import PipelineSource, measure
from streamledger.batch.steps.claim import Claiming
from streamledger.batch.steps.commit import Committing
from streamledger.batch.steps.publish import Publishing
from streamledger.batch.steps.read import Heartbeat, Reading
from streamledger.batch.steps.reread import Rereading
from streamledger.batch.steps.store import Storing
from streamledger.batch.steps.survey import Surveying
from streamledger.batch.steps.verify import Verifying
from streamledger.progress import ReadProgress

if TYPE_CHECKING:
    from streamledger.ledger import Ledger

__all__ = ["BatchRun", "Heartbeat", "backlog", "run_batch"]

log = logging.getLogger("streamledger.batch")


class BatchRun(Claiming, Surveying, Publishing, Rereading, Reading, Verifying, Committing, Storing):
    """One batch over every partition of a stream or super stream: its state, and the steps (each a
    module of :mod:`streamledger.batch.steps`) in the order :meth:`execute` runs them."""

    # -- all of it -------------------------------------------------------------------------------

    def execute(self) -> BatchResult:
        self.claim()
        try:
            self.skip_ranges_without_records()
            self.read()
            self.commit()
        except Exception as exc:
            self.fail(f"{type(exc).__name__}: {exc}")
            raise
        try:
            self.publish()
        except Exception:
            self.release_publish_leases()
            raise
        self.store_offsets()
        self.describe_table()
        return self.result

    def pieces_left(self) -> bool:
        """Whether this pinned run's failed claims still hold offsets no live range covers on any
        partition (its next claim takes the next piece: :func:`run_batch` goes on)."""
        cfg = self.config
        if not cfg.bound_by_interval:
            return False
        return any(self.ledger.own_redo_left(cfg.pipeline, [p.source for p in self.parts], self.run))

    def describe_table(self) -> None:
        """With a table sink, the table as readers find it after this batch, told by the sink the batch
        published with (front doors report it from the result; none builds a sink of its own)."""
        if self.sink.name == "directory":
            return
        self.result.table = self.sink.describe()
        props = getattr(self.sink, "props", None)  # the Iceberg catalog in use (the default resolved)
        self.result.catalog = dict(props) if props else None


def run_batch(
    config: BatchConfig,
    *,
    run: RunId,
    ledger: Ledger,
    broker: Broker,
    runner: JobRunner,
    holder_alive: Callable[[RunId], bool] | None = None,
    on_step: StepHook | None = None,
    progress: ReadProgress | None = None,
) -> BatchResult:
    """Run one batch end to end (see the package docstring for what each step guarantees).
    ``progress`` reports the job's progress (default: log lines, :mod:`streamledger.progress`).

    A pinned run whose failed claim a narrower range split into separate pieces gets one piece per
    claim (the ledger's rule 1 for pinned runs): the batch goes on, round after round, until the
    ledger has no piece left for it, and reports every range it read."""
    def one() -> BatchRun:
        return BatchRun(config, run=run, ledger=ledger, broker=broker, runner=runner,
                        holder_alive=holder_alive, on_step=on_step, progress=progress)

    batch = one()
    result = batch.execute()
    for _ in range(_MAX_PIECES):
        if not batch.pieces_left():
            break
        batch = one()
        more = batch.execute()
        seen = {p.range_id for p in result.partitions}
        result.partitions.extend(p for p in more.partitions if p.range_id not in seen)
        result.table, result.catalog = more.table, more.catalog
    return result


_MAX_PIECES = 1_000
"""Rounds one pinned batch takes at most: each commits a piece, and a failed span splits into at most
one piece more than the ranges claimed inside it."""


def backlog(ledger: Ledger, broker: Broker, *, pipeline: str, url: str, streams: list[str] | Any,
            super_stream: str | None = None, broker_name: str | None = None) -> dict[str, int]:
    """Unprocessed offsets per stream: committed tail minus where the pipeline would go on (the
    position room's start), an upper bound on records (tracking chunks take offsets too)."""
    names = list(streams)
    source = PipelineSource(pipeline, url, stream=None if super_stream else names[0],
                            super_stream=super_stream, broker_name=broker_name)
    found = measure(broker, ledger, source, streams=names, last_user=False)
    return {p.stream: max(0, p.tail - p.start) for p in found}
