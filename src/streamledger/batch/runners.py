"""Job runners: who turns a batch's ranges into files. The default is in-process local Spark."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from streamledger.batch.config import BatchError, BatchResult
from streamledger.batch.outputs import read_manifest as _read_manifest
from streamledger.fs import ArrowFS, OutputFS, filesystem_for, for_session


class LocalSparkRunner:
    """Runs :func:`streamledger.spark.job.run_job` on an in-process SparkSession (``local[N]``).

    The session is created on first use and reused, because its start-up costs seconds. One batch
    is small next to Spark's default of 200 shuffle partitions (the job's manifest aggregate
    shuffles), so the default here is 2 unless ``conf`` says otherwise.

    ``cancel()`` stops the jobs of the calls in progress (a killed task, a batch that lost its
    claim), from any thread: every call's jobs carry a fresh SparkContext *job tag*. Measured on
    Spark 4.3 (local, a slow DataFrame write): job tags fail the write within seconds, while a job
    group with ``interruptOnCancel`` and the session-level ``interruptTag`` did not cancel it.
    """

    def __init__(self, master: str = "local[2]", conf: Mapping[str, str] | None = None) -> None:
        self.master = master
        self.conf = {
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.showConsoleProgress": "false",  # progress bars only garble task logs
            **dict(conf or {}),
        }
        self._spark: Any = None
        self._tags: set[str] = set()
        self._lock = threading.Lock()

    def session(self) -> Any:
        if self._spark is None:
            from streamledger.spark.session import build_session

            self._spark = build_session(master=self.master, app_name="streamledger-batch", conf=self.conf)
        return self._spark

    @contextmanager
    def tagged(self) -> Iterator[str]:
        """Run the body's Spark jobs (started in this thread) under a tag that :meth:`cancel` cancels."""
        context = self.session().sparkContext
        tag = f"streamledger-{uuid.uuid4().hex}"
        context.addJobTag(tag)
        with self._lock:
            self._tags.add(tag)
        try:
            yield tag
        finally:
            with self._lock:
                self._tags.discard(tag)
            context.removeJobTag(tag)

    def __call__(
        self, *, url: str, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str, splits: int
    ) -> Mapping[str, Any]:
        from streamledger.spark.job import run_job

        with self.tagged():
            return run_job(self.session(), url=url, ranges=dict(ranges), output=output, fmt=fmt,
                           splits=splits)

    def filesystem(self, location: str) -> OutputFS:
        """The session's Hadoop file system for a URI (starts the session if needed), so outputs
        reach whatever Spark is configured for, with its credentials."""
        return for_session(self.session(), location)

    def cancel(self) -> list[str]:
        """Cancel the Spark jobs of the calls in progress; returns the tags cancelled."""
        with self._lock:
            tags = list(self._tags)
        if tags and self._spark is not None:
            for tag in tags:
                self._spark.sparkContext.cancelJobsWithTag(tag)
        return tags


class SparkConnectRunner:
    """Runs :func:`streamledger.spark.job.run_job` on a Spark Connect server (``sc://host:port``).

    The warm data plane: the server's JVM and Python workers are already up, so a batch pays only a
    gRPC session (opened on first use, reused). Output paths are the server's: a local server writes
    where this process can verify and publish; a remote one needs a shared file system. Every
    operation of a batch carries one tag, so ``cancel()`` interrupts exactly that batch
    (``interruptTag``) from any thread.
    """

    def __init__(self, url: str) -> None:
        if not url.startswith("sc://"):
            raise BatchError(f"Spark Connect URL must look like sc://host:port, got {url.split('@')[-1]!r}")
        self.url = url
        self._spark: Any = None
        self._tag: str | None = None
        self._lock = threading.Lock()

    def session(self) -> Any:
        if self._spark is None:
            from streamledger.spark.connect import JOB_SESSION_ID, connect_session

            # The server-side session job processes share: its Python workers are already warm, and
            # a fresh session per runner would boot three more daemons that outlive it.
            self._spark = connect_session(self.url, session_id=JOB_SESSION_ID, keep_session=True)
        return self._spark

    def __call__(
        self, *, url: str, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str, splits: int
    ) -> Mapping[str, Any]:
        from streamledger.spark.job import run_job

        spark = self.session()
        tag = f"streamledger-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._tag = tag
        spark.addTag(tag)
        try:
            return run_job(spark, url=url, ranges=dict(ranges), output=output, fmt=fmt, splits=splits)
        finally:
            spark.removeTag(tag)
            with self._lock:
                self._tag = None

    def filesystem(self, location: str) -> OutputFS:
        """``pyarrow.fs`` from the URI: a Connect client has no JVM to reach Hadoop through, so the
        calling process needs its own access to the store (a local server: the same disk)."""
        return ArrowFS()

    def cancel(self) -> None:
        """Interrupt the operations of the batch this runner is running (no-op when idle)."""
        with self._lock:
            tag = self._tag
        if tag is not None and self._spark is not None:
            self._spark.interruptTag(tag)

    def close(self) -> None:
        """Close this client; the shared server-side session and the server keep running."""
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


def read_manifest(output: str, fs: OutputFS | None = None) -> dict[str, Any]:
    """Load ``DIR/_manifest.json`` written by the job (used after a spark-submit run); a URI is read
    through ``fs`` (default: local for plain paths and ``file://``, else ``pyarrow.fs``)."""
    data = _read_manifest(output, fs or filesystem_for(output))
    if data is None:
        raise BatchError(f"the Spark job wrote no manifest at {output}/_manifest.json")
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
