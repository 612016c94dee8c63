"""One bounded batch of a pipeline, exactly once: claim -> read -> verify -> commit -> publish ->
store offset.

Framework-neutral (no Airflow or Dagster import): the Airflow operator and the Dagster assets are
thin adapters over :func:`run_batch`. Modules: ``config`` (what to do), ``plan`` (pure names and
numbers), ``run`` (the state machine), ``outputs`` (staging and publish), ``microbatch`` (the same
bookkeeping for a streaming query's micro-batches). The batch names its runner by a protocol
(``JobRunner``) and never imports Spark; this package face offers the Spark layer's runners
(:mod:`streamledger.spark.runners`) by name, resolved only when asked for, so importing the batch
does not import the Spark layer.

Delivery semantics
==================

A *pipeline* is a consumer reference (at most 255 bytes of UTF-8: the broker's StoreOffset name).
For every partition (a stream, or each partition of a super stream) a batch processes one
half-open offset range ``[start, end)``; the ledger is the source of truth for which are done.

1. **claim**: the ledger's one claim rule answers, in one transaction, which range this run
   processes next: the range its identity ``(dag, run, task, map index)`` already holds (a retry),
   else the oldest failed or abandoned hole (a claim whose heartbeat stopped for
   ``claim_timeout``, or whose holder the scheduler reports gone), else ``[tail, limit)`` where
   ``limit`` is the committed tail or the first offset stamped at or after the data interval's end,
   capped at ``max_offsets``. The batch never re-derives this rule. A start below retention fails
   the claim, or with ``on_data_loss="record"`` the span is recorded ``lost`` and the rest claimed.
2. **read**: claimed ranges holding no user record (only tracking chunks) are committed with 0
   records without a job. The rest go to the runner in **one job per batch** (every partition,
   read in parallel) writing into a fresh **staging** directory. The ledger claims are renewed by
   a heartbeat while it runs.
3. **verify**: the job's manifest must name each range exactly, with first/last offsets inside it.
4. **commit**: each range moves to ``committed`` with its record count, first/last offsets, final
   output path and staging path. Only the claim's holder can commit (fencing).
5. **publish** (under the range's publish lease, which the commit hands the committer): each
   committed range's staging directory is renamed to
   ``<root>/<pipeline>/<broker>/<stream>/<start>-<end>/`` (``<broker>`` is the ledger's broker
   identity; where a rename is not atomic, on object stores, its files are copied, the manifest
   last, and staging is deleted; see ``outputs``). Each name is one component
   (:func:`streamledger.paths.encode_component`: ordinary names unchanged, anything else escaped
   reversibly), so no name leaves the root and distinct pipelines, brokers or streams never share
   a directory; a range committed under an older layout keeps the ``output`` the ledger recorded.
   Names holding NUL, control characters or no UTF-8 are refused before anything is claimed. A published
   directory is never deleted or rewritten: retries of a committed range do not read the stream
   again (they finish the publish from the staging copy the ledger recorded; only if both copies
   were deleted by hand is the range re-read, and published only if the broker still holds exactly
   the committed records). Every run also publishes committed ranges an earlier run left
   unpublished (it died after its commit and was never retried, or its publish failed), so the
   store step never passes one.
6. **store offset = low watermark**: the broker's stored offset becomes the last committed record
   of the source's contiguous done prefix (committed or lost ranges up to the first open claim,
   failed hole or unpublished output), and only when the broker is behind it. It never passes a
   range nobody committed; a range committed behind an open claim is covered once that claim
   commits. Idle stays idle: when no record was added nothing is stored (a StoreOffset writes a
   tracking chunk, which takes an offset), so a pipeline without new user data writes nothing to
   the stream and starts no job.

What a crash at each step leads to (a retry or a cleared task runs the same identity again):

* during **claim** or **read** (the range is ``claimed``): the retry gets the same range and reads
  it into a new staging directory; a killed attempt's staging directory is never published. If
  the task never comes back, its heartbeat stops and the next run redoes the span after
  ``claim_timeout`` (or at once when ``holder_alive`` says the holder is gone).
* after **commit**, before **publish**: the retry finds the committed range and renames its
  staging copy into place; no read.
* after **publish**, before **store offset**: the retry stores the watermark (the audit reports
  the broker behind the ledger meanwhile).
* a worker that stalls past ``claim_timeout`` loses its claim: its commit is refused, so it can
  neither commit nor publish what it read.
* after **commit**, never retried: the next run of the pipeline publishes the range (see 5).
* an ambiguous **commit** (the reply lost): the range is read back; the staging copy is deleted
  only when the ledger says nothing points at it.

Table sinks (``BatchConfig(sink="iceberg" | "delta")``, :mod:`streamledger.batch.sinks`): publish
places each range's files as above, then makes **one table commit per batch** for every placed range
(own and stranded), naming pipeline, attempt and ranges in the commit, and only then records the
ranges published with the commit's id (``OffsetRange.sink_commit``). So:

* after **commit**, before the table commit: the retry (or a later run) places the files and
  commits them to the table; nothing is read again.
* after the **table commit**, before the ledger records it (step ``table_committed``): the retry
  finds its ranges in the table's commits and records that commit; it does not commit again.
* the table commit is made on exactly the table state in which the batch looked for its ranges
  (no blind rebase): a concurrent commit makes it fail and the batch looks again, so a zombie and
  its retry never both add a range. No table commit names a range the ledger did not commit.

Before claiming, every partition is checked to still be the stream the ledger read: a committed
tail below the ledger's end, or a broker that lost the offset the ledger stored, means the stream
was deleted and re-created; the batch refuses (nothing claimed or stored) until
``streamledger ledger new-epoch`` starts a new history. ``streamledger.batch.proof.audit`` is the
audit plus the published outputs' check.

Tests stop a batch after any step through ``on_step`` (``run_batch(..., on_step=hook)``); nothing
in production reads a crash switch from the environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamledger.batch.config import (
    BatchConfig,
    BatchError,
    BatchResult,
    Broker,
    InitialPosition,
    InjectedCrash,
    IntervalNotReady,
    JobRunner,
    PartitionResult,
    RunId,
    StepHook,
    StreamReplaced,
    summarize,
)
from streamledger.batch.plan import broker_identity, offset_to_store, output_dir, staging_dir
from streamledger.batch.run import BatchRun, Heartbeat, backlog, run_batch
from streamledger.batch.spec import PipelineSpec, SpecError

if TYPE_CHECKING:
    from streamledger.spark.runners import LocalSparkRunner, SparkConnectRunner, read_manifest

_SPARK_NAMES = ("LocalSparkRunner", "SparkConnectRunner", "read_manifest")


def __getattr__(name: str) -> Any:
    """The Spark layer's runners by their public names here (``from streamledger.batch import
    LocalSparkRunner``), imported on first use."""
    if name in _SPARK_NAMES:
        from streamledger.spark import runners

        return getattr(runners, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


STEPS = ("claimed", "read", "committed", "published", "stored")

__all__ = [
    "STEPS",
    "BatchConfig",
    "BatchError",
    "BatchResult",
    "BatchRun",
    "Broker",
    "Heartbeat",
    "InitialPosition",
    "InjectedCrash",
    "IntervalNotReady",
    "JobRunner",
    "LocalSparkRunner",
    "PartitionResult",
    "PipelineSpec",
    "RunId",
    "SparkConnectRunner",
    "SpecError",
    "StepHook",
    "StreamReplaced",
    "backlog",
    "broker_identity",
    "offset_to_store",
    "output_dir",
    "read_manifest",
    "run_batch",
    "staging_dir",
    "summarize",
]
