"""Job runners, as the batch sees them: the runners themselves live in the Spark layer
(:mod:`streamledger.spark.runners`, one module for local, Connect and spark-submit, with the one
cached lookup); their names stay importable from here. ``summarize`` is the batch's log line."""

from __future__ import annotations

from streamledger.batch.config import BatchResult
from streamledger.spark.runners import (
    LocalSparkRunner,
    SparkConnectRunner,
    read_manifest,
    runner_for,
)

__all__ = [
    "LocalSparkRunner", "SparkConnectRunner", "read_manifest", "runner_for", "summarize",
]


def summarize(result: BatchResult) -> str:
    """One line per partition for task logs."""
    lines = [f"pipeline {result.pipeline} on {result.broker}: {result.records} records"]
    for p in result.partitions:
        lines.append(
            f"  {p.stream} [{p.start}, {p.end}) {p.status} records={p.records} "
            f"offsets={p.first_offset}..{p.last_offset} stored={p.offset_stored} output={p.output}"
        )
    return "\n".join(lines)
