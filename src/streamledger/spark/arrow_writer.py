"""The Arrow writer: Spark tasks read their slices and write Parquet with pyarrow, straight to the store.

Why ``mapInArrow`` over the planned slices, not the data source's own read tasks: the job has planned
its ranges on the driver already (:func:`streamledger.spark.job.plan_job`), so it hands Spark one row
per task (``spark.range(n, numPartitions=n)``: exactly one task each) and a function that reads that
task's slices with the source's own reader and writes them. The data source stays a plain,
side-effect-free DataFrame source (a read that wrote files would surprise every other reader of it),
the write needs no JVM encoder and no Hadoop connector (``pyarrow.fs`` reaches local disks, S3, GCS,
Azure and HDFS from the wheel), and Spark still schedules, parallelises and retries the tasks, on
local Spark, a cluster or a Connect server alike.

What crosses back to the driver is one :class:`FileSummary` row per file. ``collect`` returns the
rows of the attempts Spark accepted (one per task), so the summaries name exactly the files that
count. Every attempt writes under names of its own (:func:`file_name`), so a retried or speculative
attempt never overwrites or doubles another's file; the job deletes the files no summary names and
lists the kept ones in its manifest, and the batch's verify refuses a directory holding any other.

Memory: a task buffers at most ``row_group_bytes`` of Arrow data before it writes a row group, and
reads in batches of at most an eighth of that of record bodies (:attr:`WriterOptions.read_batch_bytes`),
so what it holds is about a row group whatever its range or record size: row groups are streamed,
never one table per slice. (Cut by rows only, a read batch was 65,536 records whatever their size:
6.5 MB of 100-byte records, larger than a 4 MiB row group, and a range of fewer records than that
was held whole.)
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamledger.errors import StreamledgerError
from streamledger.fs import StoreAccess, arrow_filesystem

FILE_SUMMARY_SCHEMA = pa.schema([
    ("stream", pa.string()), ("file", pa.string()), ("records", pa.int64()), ("first_offset", pa.int64()),
    ("last_offset", pa.int64()), ("bytes", pa.int64()), ("attempt", pa.int64()),
])
COMPRESSIONS = ("snappy", "zstd", "gzip", "lz4", "none")
ROW_GROUP_BYTES = 64 << 20
FILE_BYTES = 512 << 20


class WriterError(StreamledgerError):
    """The Arrow writer was given bad options, or a task's batches cannot be written as they are."""


@dataclass(frozen=True, slots=True)
class WriterOptions:
    """How the tasks cut their output. Defaults: row groups of ~64 MiB of Arrow data (a task's memory
    bound; Spark's own Parquet block is 128 MiB), files of ~512 MiB, snappy (as Spark writes)."""

    row_group_bytes: int = ROW_GROUP_BYTES
    file_bytes: int = FILE_BYTES
    compression: str = "snappy"

    @property
    def read_batch_bytes(self) -> int:
        """The record bodies a task reads at a time: an eighth of a row group (8 MiB by default, more
        than 65,536 records of 100 B, the read's own cap), so the batches in hand while a row group
        fills stay a fraction of it. A batch holds one broker chunk at least."""
        return max(1, self.row_group_bytes // 8)

    def __post_init__(self) -> None:
        for name in ("row_group_bytes", "file_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise WriterError(f"writer option {name} must be a positive number of bytes, got {value!r}")
        if self.compression not in COMPRESSIONS:
            raise WriterError(f"writer option compression must be one of {', '.join(COMPRESSIONS)}, "
                              f"got {self.compression!r}")


@dataclass(frozen=True, slots=True)
class FileSummary:
    """One file a task attempt wrote: its log, name (relative to the job's output directory), record
    count, first and last offset, size in bytes and Spark's task attempt id."""

    stream: str
    file: str
    records: int
    first_offset: int
    last_offset: int
    bytes: int
    attempt: int

    @classmethod
    def from_row(cls, row: Any) -> FileSummary:
        return cls(str(row["stream"]), str(row["file"]), int(row["records"]), int(row["first_offset"]),
                   int(row["last_offset"]), int(row["bytes"]), int(row["attempt"]))


UNIQUE_COLUMNS = ("offset", "body")
"""Columns whose values (nearly) never repeat: a dictionary for them is built and then dropped once
it outgrows its page (Parquet's fallback), and min/max of ``body`` is bytes nobody filters on. Left
out of the dictionary (and ``body`` out of the statistics), the encoding of a 500k-record row group
took 0.45 s instead of 0.73 s (measured, snappy, files as before for every reader)."""


def encodings(schema: pa.Schema) -> dict[str, list[str]]:
    """``use_dictionary`` and ``write_statistics`` for pyarrow's writer: every leaf column of
    ``schema`` (a map's as ``name.key_value.key``/``.value``) but :data:`UNIQUE_COLUMNS`."""
    leaves: list[str] = []
    for f in schema:
        if pa.types.is_map(f.type):
            leaves += [f"{f.name}.key_value.key", f"{f.name}.key_value.value"]
        else:
            leaves.append(f.name)
    return {"use_dictionary": [c for c in leaves if c not in UNIQUE_COLUMNS],
            "write_statistics": [c for c in leaves if c != "body"]}


def file_name(task: int, number: int, attempt: int, tag: str) -> str:
    """A data file's name: the task, the file's number within the task's output, Spark's task
    attempt id and a random tag of the attempt (unique even where attempt ids repeat, as across the
    applications of a retried job)."""
    return f"part-{task:05d}-{number:03d}-{attempt}-{tag}.parquet"


class _FileWriter:
    """One log's records of one task, written as one or more files of row groups."""

    def __init__(self, fs: Any, root: str, rel_dir: str, stream: str, options: WriterOptions,
                 name: Any) -> None:
        self.fs, self.root, self.rel_dir, self.stream = fs, root, rel_dir, stream
        self.options, self.name = options, name
        self.pending: list[pa.RecordBatch] = []
        self.pending_bytes = 0
        self.sink: Any = None
        self.writer: Any = None
        self.rel = ""
        self.records, self.first, self.last = 0, -1, -1
        self.done: list[tuple[str, int, int, int, int]] = []  # (rel, records, first, last, bytes)

    def write(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch`` (cut to row-group size when bigger), writing row groups as they fill."""
        limit = self.options.row_group_bytes
        if batch.nbytes <= limit or batch.num_rows < 2:
            self._add(batch)
            return
        rows = max(1, batch.num_rows * limit // batch.nbytes)
        for at in range(0, batch.num_rows, rows):
            self._add(batch.slice(at, rows))

    def _add(self, batch: pa.RecordBatch) -> None:
        bounds = pc.min_max(batch.column("offset"))
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        self.first = lo if self.records == 0 else min(self.first, lo)
        self.last = hi if self.records == 0 else max(self.last, hi)
        self.records += batch.num_rows
        self.pending.append(batch)
        self.pending_bytes += batch.nbytes
        if self.pending_bytes >= self.options.row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        if not self.pending:
            return
        if self.writer is None:
            self.rel = f"{self.rel_dir}/{self.name()}" if self.rel_dir else self.name()
            if self.fs.type_name == "local":  # object stores have no directories to create
                self.fs.create_dir(f"{self.root}/{self.rel_dir}".rstrip("/"), recursive=True)
            self.sink = self.fs.open_output_stream(f"{self.root}/{self.rel}")
            schema = self.pending[0].schema
            self.writer = pq.ParquetWriter(self.sink, schema, compression=self.options.compression,
                                           **encodings(schema))
        table = pa.Table.from_batches(self.pending)
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.pending.clear()
        self.pending_bytes = 0
        if self.sink.tell() >= self.options.file_bytes:
            self._close_file()

    def _close_file(self) -> None:
        self.writer.close()
        size = int(self.sink.tell())
        self.sink.close()  # an object store's upload completes here: the object appears whole or not
        self.done.append((self.rel, self.records, self.first, self.last, size))
        self.writer = self.sink = None
        self.records, self.first, self.last = 0, -1, -1

    def close(self) -> list[tuple[str, int, int, int, int]]:
        self._flush()
        if self.writer is not None:
            self._close_file()
        return self.done


def write_task(partition: Any, reader: Any, *, fs: Any, root: str, dirs: Mapping[str, str],
               options: WriterOptions, task: int, attempt: int) -> list[FileSummary]:
    """Read one task's slices with ``reader`` (a :class:`~streamledger.spark.datasource.SliceReader`)
    and write them under ``root``: each log into ``dirs[log]`` (relative; ``""`` is ``root``)."""
    tag = uuid.uuid4().hex[:12]
    count = iter(range(1_000_000))

    def name() -> str:
        return file_name(task, next(count), attempt, tag)

    out: list[FileSummary] = []
    current: _FileWriter | None = None
    reader = reader.bounded(options.read_batch_bytes)

    def close(w: _FileWriter) -> None:
        out.extend(FileSummary(w.stream, rel, n, lo, hi, size, attempt) for rel, n, lo, hi, size in w.close())

    for batch in reader.read(partition):
        if not batch.num_rows:
            continue
        logs = batch.column("stream")
        stream = logs[0].as_py()
        if batch.num_rows > 1 and not pc.all(pc.equal(logs, stream)).as_py():
            raise WriterError(f"a batch of stream {stream!r} also holds records of other logs")
        if stream not in dirs:
            raise WriterError(f"task {task} read records of unplanned stream {stream!r}")
        if current is None or current.stream != stream:
            if current is not None:
                close(current)
            current = _FileWriter(fs, root, dirs[stream], stream, options, name)
        current.write(batch)
    if current is not None:
        close(current)
    return out


def summaries_batch(summaries: Sequence[FileSummary]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([
        {"stream": s.stream, "file": s.file, "records": s.records, "first_offset": s.first_offset,
         "last_offset": s.last_offset, "bytes": s.bytes, "attempt": s.attempt} for s in summaries
    ], schema=FILE_SUMMARY_SCHEMA)


STATS_ENV = "STREAMLEDGER_TASK_STATS"
PROFILE_ENV = "STREAMLEDGER_TASK_PROFILE"


@contextlib.contextmanager
def task_stats(task: int, attempt: int) -> Iterator[list[FileSummary]]:
    """A diagnostic, off (no cost) unless ``$STREAMLEDGER_TASK_STATS`` names a directory in the
    environment of the Spark workers (i.e. of whatever started the JVM: a Connect server, a local
    session's driver). Each task then appends a line to ``tasks.jsonl`` there: wall and CPU seconds,
    records, the worker's resident memory when the task began and its peak during the task (the
    kernel's high-water mark, reset at the task's start through ``/proc/self/clear_refs`` so an
    earlier task of a reused worker does not count). With ``$STREAMLEDGER_TASK_PROFILE`` set too, a
    cProfile of the task goes next to it (``task-<task>-<attempt>.prof``). The caller adds the
    task's summaries to the list it is given."""
    where = os.environ.get(STATS_ENV)
    written: list[FileSummary] = []
    if not where:
        yield written
        return
    import json
    import time

    rss = _memory()["VmRSS"]
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
        reset = True
    except OSError:
        reset = False
    profile = None
    if os.environ.get(PROFILE_ENV):
        import cProfile

        profile = cProfile.Profile()
    began, cpu = time.time(), time.process_time()
    if profile is not None:
        profile.enable()
    try:
        yield written
    finally:
        if profile is not None:
            profile.disable()
        line = {"task": task, "attempt": attempt, "pid": os.getpid(), "began": began,
                "wall": time.time() - began, "cpu": time.process_time() - cpu,
                "records": sum(f.records for f in written), "rss_kib": rss,
                "peak_kib": _memory()["VmHWM"], "peak_reset": reset}
        os.makedirs(where, exist_ok=True)
        if profile is not None:
            profile.dump_stats(os.path.join(where, f"task-{task}-{attempt}.prof"))
        with open(os.path.join(where, "tasks.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")


def _memory() -> dict[str, int]:
    """VmRSS and VmHWM of this process in KiB (0 where /proc is not there)."""
    out = {"VmRSS": 0, "VmHWM": 0}
    try:
        with open("/proc/self/status") as f:
            for text in f:
                key, _, value = text.partition(":")
                if key in out:
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


class _Tasks:
    """The function ``mapInArrow`` runs: the ids of its rows name the tasks to read and write.
    A class at module level, so the closure pickled to the workers is its fields (the reader holds
    options only, its URL among them, as the data source's own pickled reader does)."""

    def __init__(self, tasks: Sequence[Any], reader: Any, out_dir: str, dirs: Mapping[str, str],
                 options: WriterOptions, access: StoreAccess | None) -> None:
        self.tasks, self.reader, self.out_dir = list(tasks), reader, out_dir
        self.dirs, self.options, self.access = dict(dirs), options, access

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = int(context.taskAttemptId()) if context is not None else 0
        fs, root = arrow_filesystem(self.out_dir, access=self.access)
        for batch in batches:
            for task in batch.column(0).to_pylist():
                with task_stats(task, attempt) as written:
                    written += write_task(self.tasks[task], self.reader, fs=fs, root=root, dirs=self.dirs,
                                          options=self.options, task=task, attempt=attempt)
                if written:
                    yield summaries_batch(written)


def warm_task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A task that only imports what a batch's tasks import (the reader, the client, this writer), so a
    reused Python worker has them already: :func:`streamledger.spark.connect.warm_up`."""
    import pyarrow.parquet  # noqa: F401  (imported by write_task when it writes)

    import streamledger.protocol.rabbitmq.client
    import streamledger.spark.datasource  # noqa: F401

    yield from batches


def write_files(spark: Any, *, tasks: Sequence[Any], reader: Any, out_dir: str, dirs: Mapping[str, str],
                options: WriterOptions) -> list[FileSummary]:
    """One Spark job: a task per entry of ``tasks`` (the reader's partitions), each writing its
    files; the summaries of the accepted attempts. No task, no job."""
    if not tasks:
        return []
    from pyspark.sql.types import LongType, StructField, StructType

    n = len(tasks)
    work = _Tasks(tasks, reader, out_dir, dirs, options, StoreAccess.from_environment(out_dir))
    # Both schemas given, so a Connect client asks the server nothing before the one action:
    # mapInArrow asks for its input's columns unless ``to`` names them (an analysis round trip).
    # ``toArrow``, not ``collect``: the summaries arrive as the Arrow table they are, without a Row
    # per file or the conf lookup a Connect ``collect`` makes first (a round trip).
    ids = spark.range(0, n, 1, n).to(StructType([StructField("id", LongType(), False)]))
    table = ids.mapInArrow(work, summary_struct()).toArrow()
    return [FileSummary.from_row(row) for row in table.to_pylist()]


def summary_struct() -> Any:
    """:data:`FILE_SUMMARY_SCHEMA` as Spark's ``StructType`` (converted here: a DDL string would be
    parsed by a Connect server, one more round trip)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(FILE_SUMMARY_SCHEMA)
