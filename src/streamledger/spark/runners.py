"""Job runners: who turns a batch's ranges into files, and the one cache that keeps them.

A runner is called once per batch, ``runner(url=, ranges={stream: (start, end)}, output=STAGING,
fmt=, splits=) -> Manifest`` (the contract of ``streamledger.batch.JobRunner``), and may define
``cancel()`` (callable from another thread) and ``filesystem(location)``. Three live here:

* :class:`LocalSparkRunner`: an in-process SparkSession (``local[N]``), the default;
* :class:`SparkConnectRunner`: a Spark Connect server (``sc://host:port``), the warm data plane;
* :class:`SubmitRunner`: the job as its own ``spark-submit`` process. What submits it is the
  scheduler's (the Airflow operator's ``SparkSubmitRunner`` drives the apache-spark provider's hook),
  so this layer imports no scheduler.

:func:`runner_for` is the one cached lookup the Airflow operator and the Dagster resource share: a
SparkSession costs seconds to start and a Connect session holds a gRPC channel, so both outlive a
task or a run in the same process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from streamledger.errors import BatchError
from streamledger.fs import ArrowFS, OutputFS, filesystem_for, first_line, join, redact, scheme
from streamledger.manifest import MANIFEST, Manifest, ManifestError
from streamledger.spark.fs import for_session
from streamledger.transform import Transform

_R = TypeVar("_R")


class LocalSparkRunner:
    """Runs :func:`streamledger.spark.job.job_manifest` on an in-process SparkSession (``local[N]``).

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
        self, *, url: str, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str, splits: int,
        transform: Transform | None = None,
    ) -> Manifest:
        from streamledger.spark.job import job_manifest

        with self.tagged():
            return job_manifest(self.session(), url=url, ranges=dict(ranges), output=output, fmt=fmt,
                                splits=splits, transform=transform)

    def transform_schema(self, transform: Transform, url: str, reserved: Sequence[str] = ()) -> Any:
        """What ``transform`` writes (a Spark schema), analysed on this runner's session; one-line
        ``TransformError`` when it cannot run (asked before anything is claimed)."""
        return _transform_schema(self.session(), transform, url, reserved)

    def filesystem(self, location: str) -> OutputFS:
        """The session's Hadoop file system for a URI (starts the session if needed), so outputs
        reach whatever Spark is configured for, with its credentials."""
        return for_session(self.session(), location)

    def job_tasks(self) -> tuple[int, int] | None:
        """Tasks finished and in all of the session's active stages, for the batch's progress
        (:mod:`streamledger.progress`); None before the session or any stage exists."""
        if self._spark is None:
            return None
        tracker = self._spark.sparkContext.statusTracker()
        infos = [i for i in (tracker.getStageInfo(s) for s in tracker.getActiveStageIds()) if i is not None]
        if not infos:
            return None
        return sum(i.numCompletedTasks for i in infos), sum(i.numTasks for i in infos)

    def cancel(self) -> list[str]:
        """Cancel the Spark jobs of the calls in progress; returns the tags cancelled.

        Sticky: a write is several Spark jobs (adaptive execution submits a shuffle's map stage as
        its own job), and ``cancelJobsWithTag`` reaches only the jobs active at that moment, so a
        cancel landing between two of them would let the next one run to its end. The tags are
        cancelled again every 0.2 s until their calls have returned."""
        with self._lock:
            tags = list(self._tags)
        if not tags or self._spark is None:
            return tags
        context = self._spark.sparkContext

        def cancel_until_returned() -> None:
            while True:
                with self._lock:
                    live = [t for t in tags if t in self._tags]
                if not live:
                    return
                for tag in live:
                    context.cancelJobsWithTag(tag)
                time.sleep(0.2)

        for tag in tags:
            context.cancelJobsWithTag(tag)
        threading.Thread(target=cancel_until_returned, name="streamledger-cancel", daemon=True).start()
        return tags


class SparkConnectRunner:
    """Runs :func:`streamledger.spark.job.job_manifest` on a Spark Connect server (``sc://host:port``).

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
            # Unregistered (a registration is a round trip running Python on the server): the Arrow
            # writer reads with the source's reader directly, the JVM writer registers them itself.
            self._spark = connect_session(self.url, session_id=JOB_SESSION_ID, keep_session=True,
                                          register=False)
        return self._spark

    def __call__(
        self, *, url: str, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str, splits: int,
        transform: Transform | None = None,
    ) -> Manifest:
        from streamledger.spark.job import job_manifest

        if not scheme(output):  # a relative path is this process's, not the server's (its own cwd)
            output = str(Path(output).absolute())
        spark = self.session()
        tag = f"streamledger-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._tag = tag
        spark.addTag(tag)
        try:
            return job_manifest(spark, url=url, ranges=dict(ranges), output=output, fmt=fmt, splits=splits,
                                transform=transform)
        finally:
            spark.removeTag(tag)
            with self._lock:
                self._tag = None

    def transform_schema(self, transform: Transform, url: str, reserved: Sequence[str] = ()) -> Any:
        """:meth:`LocalSparkRunner.transform_schema` on the server's session."""
        return _transform_schema(self.session(), transform, url, reserved)

    def filesystem(self, location: str) -> OutputFS:
        """``pyarrow.fs`` from the URI: a Connect client has no JVM to reach Hadoop through, so the
        calling process needs its own access to the store (a local server: the same disk)."""
        return ArrowFS()

    def cancel(self) -> None:
        """Interrupt the operations of the batch this runner is running (no-op when idle).

        Sticky, as :meth:`LocalSparkRunner.cancel`: a batch is several operations (planning reads,
        the write, the summaries), and ``interruptTag`` reaches only those running at that moment,
        so a cancel landing before the first or between two would let the next one run to its end.
        The tag is interrupted again every 0.2 s until the batch's call has returned."""
        with self._lock:
            tag, spark = self._tag, self._spark
        if tag is None or spark is None:
            return
        spark.interruptTag(tag)

        def interrupt_until_returned() -> None:
            while True:
                time.sleep(0.2)
                with self._lock:
                    if self._tag != tag:
                        return
                try:
                    spark.interruptTag(tag)
                except Exception:  # the session is gone: nothing of the batch runs on it any more
                    return

        threading.Thread(target=interrupt_until_returned, name="streamledger-cancel", daemon=True).start()

    def close(self) -> None:
        """Close this client; the shared server-side session and the server keep running."""
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


class SubmitRunner:
    """Runs the job as its own ``spark-submit`` process; a subclass says how it is submitted.

    The broker URL reaches the job in a file (``job.url_file``: mode 0600 in a private directory,
    removed after the submit), and only the file's path is on the command line (``--url-file``), so
    no process list or logged command shows a password. The job writes its manifest into
    ``output``, which is read back as the call's result: the JSON crosses the process boundary and is
    parsed here, once, into the :class:`~streamledger.manifest.Manifest` the batch takes.
    """

    def __call__(self, *, url: str, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str,
                 splits: int, transform: Transform | None = None) -> Manifest:
        import streamledger.spark.job as job

        with job.url_file(url) as path:
            self.submit(str(Path(job.__file__)), path,
                        job_arguments(path, ranges=ranges, output=output, fmt=fmt, splits=splits,
                                      transform=transform))
        try:
            return Manifest.from_dict(read_manifest(output))
        except ManifestError as exc:
            raise BatchError(f"the Spark job's manifest at {output}/{MANIFEST} is unusable: {exc}") from exc

    def submit(self, application: str, url_file: Path, args: list[str]) -> None:
        """Run ``application args`` with spark-submit until it ends (the subclass's part)."""
        raise NotImplementedError


def job_arguments(url_file: Path, *, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str,
                  splits: int, transform: Transform | None = None) -> list[str]:
    """The job's command line for one batch: the URL file's path, never the URL."""
    args = ["--url-file", str(url_file), "--ranges", json.dumps({s: list(r) for s, r in ranges.items()}),
            "--output", output, "--format", fmt, "--splits", str(splits)]
    if transform is not None and transform.active:
        args += ["--transform", json.dumps(transform.to_dict(), sort_keys=True)]
    return args


def _transform_schema(spark: Any, transform: Transform, url: str, reserved: Sequence[str]) -> Any:
    from streamledger.sources import log_kind
    from streamledger.spark.transform import output_schema

    return output_schema(spark, transform, log_kind(url).files_ddl(), reserved)


def job_environment() -> dict[str, str]:
    """The environment a submitted job needs from this process (no secret in it)."""
    return {
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
    }


def read_manifest(output: str, fs: OutputFS | None = None) -> dict[str, Any]:
    """Load ``DIR/_manifest.json`` written by the job (used after a spark-submit run); a URI is read
    through ``fs`` (default: local for plain paths and ``file://``, else ``pyarrow.fs``)."""
    path = join(output, MANIFEST)
    try:
        raw = (fs or filesystem_for(output)).read_bytes(path)
    except OSError as exc:  # a store that does not answer: this try fails, a retry reads it again
        raise BatchError(f"cannot read the Spark job's manifest {redact(path)} ({first_line(exc)})") from None
    if raw is None:
        raise BatchError(f"the Spark job wrote no manifest at {output}/{MANIFEST}")
    data: dict[str, Any] = json.loads(raw)
    return data


_RUNNERS: dict[str, Any] = {}
_RUNNERS_LOCK = threading.Lock()


def _cached(key: Mapping[str, Any], build: Callable[[], _R]) -> _R:
    name = json.dumps(key, sort_keys=True)
    with _RUNNERS_LOCK:
        if name not in _RUNNERS:
            _RUNNERS[name] = build()
        runner: _R = _RUNNERS[name]
    return runner


def local_runner(master: str, conf: Mapping[str, str] | None = None) -> LocalSparkRunner:
    """The process's in-process runner for (master, conf)."""
    settings = dict(conf or {})
    return _cached({"master": master, "conf": settings}, lambda: LocalSparkRunner(master, settings))


def connect_runner(url: str) -> SparkConnectRunner:
    """The process's Connect runner for a server URL (the server's own conf applies; none is sent)."""
    return _cached({"remote": url}, lambda: SparkConnectRunner(url))


def runner_for(*, master: str = "local[2]", conf: Mapping[str, str] | None = None,
               remote: str | None = None) -> LocalSparkRunner | SparkConnectRunner:
    """The one lookup the Airflow operator and the Dagster resource share: ``remote`` (``sc://``)
    selects the Connect runner of that server, else the local runner of (master, conf)."""
    return connect_runner(remote) if remote else local_runner(master, conf)
