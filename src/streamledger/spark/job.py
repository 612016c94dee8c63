"""Bounded read job: exact offset ranges of offset-addressed logs -> files + ``_manifest.json``.

The log is whatever the URL names (:mod:`streamledger.sources`): RabbitMQ streams through the
``rabbitmq_stream`` format, mewbase channels (positions as offsets) through ``mewbase``.

Run it locally (``python -m streamledger.spark.job ...``, master ``local[2]`` by default), through
``spark-submit path/to/job.py ...`` (the master then comes from spark-submit), or in-process with
:func:`run_job` (the caller owns the SparkSession, as the Airflow operator does).

Idempotence: the job owns its output directory. Every run overwrites it as a whole (Spark's
``mode("overwrite")``) and then writes the manifest atomically, so a rerun replaces the previous
attempt instead of appending a second copy. The batch hands it a fresh *staging* directory per
attempt and publishes the result itself, so a job never writes where a committed range lives.
All streams are read by one Spark job in parallel; with more than one, each stream's records land in
their own subdirectory (``manifest["streams"][s]["path"]``; one stream is written flat). The
manifest's counts and first/last offsets are metrics observed on the rows as they are written (see
``_observe_written``), not taken from the plan, so a verifier can compare them with the planned range.

Credentials: a submitted job gets its URL from a file (``--url-file``, written by :func:`url_file`
with mode 0600 in a private directory), never from its command line, which process lists, the
spark-submit log line and the cluster's application record all show.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # Run as a script (spark-submit), Python puts this file's directory first on sys.path, where
    # module names such as ``arrow`` or ``session`` could shadow installed packages. Drop it.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    import gc

    # Starting, the process builds the objects of ~1,000 modules (pyspark's Connect client brings
    # pandas, numpy, pyarrow and grpc) and none is garbage: the cyclic collector would walk them
    # again and again (~10 % of the imports' CPU, measured). On again once started (_started).
    gc.disable()

import argparse
import contextlib
import datetime as _dt
import gc
import json
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from streamledger import fs
from streamledger.errors import OneLineParser, StreamledgerError
from streamledger.manifest import MANIFEST, Manifest, StreamEntry, is_data_file
from streamledger.processes import exit_now
from streamledger.sources import connect_log, log_kind, require_feature, super_stream_partitions
from streamledger.spark.arrow_writer import FILE_BYTES, ROW_GROUP_BYTES, WriterOptions, write_files
from streamledger.spark.fs import for_session
from streamledger.spark.planning import (
    OffsetBound,
    PlannedRange,
    PlanningError,
    parse_bound,
    parse_ranges,
    plan_ranges,
)
from streamledger.spark.session import DEFAULT_MASTER, build_session, parallelism, register_source
from streamledger.spark.summaries import SUMMARY_OFFSET, decode
from streamledger.transform import Transform

FORMATS = ("parquet", "orc", "json")
WRITERS = ("arrow", "spark")
PART_COLUMN = "streamledger_part"  # no leading "_": pyarrow skips such paths
URL_FILE_NAME = "streamledger-url"


class JobError(StreamledgerError):
    """The job wrote output that does not match its plan (or could not run)."""


def _output_dir(output: str) -> str:
    """A plain path made absolute (as before URIs); a URI (``file://``, ``s3a://``...) as given."""
    if not output.strip():
        raise PlanningError("output must name a directory or a URI")
    return output.rstrip("/") if fs.scheme(output) else str(Path(output).absolute())


def plan_job(
    url: str, ranges: Mapping[str, Sequence[int]], *, fail_on_data_loss: bool = True
) -> list[PlannedRange]:
    """Check the requested ranges against the log (tail, retention) and clamp them if allowed."""
    bounds = {
        s: (OffsetBound.offset(int(a)), OffsetBound.offset(int(b)))
        for s, (a, b) in parse_ranges(dict(ranges)).items()
    }
    with connect_log(url) as client:
        return plan_ranges(client, bounds, fail_on_data_loss=fail_on_data_loss)


def _observe_written(
    df: Any, streams: Sequence[str], index: str | None = None
) -> tuple[Any, Callable[[], dict[str, tuple[int, int | None, int | None]]]]:
    """``df`` (read with option ``sliceSummaries``) without its summary rows, with metrics observed
    *during the write*, and a getter for them after it: ``{stream: (records, first offset, last
    offset)}`` (0, None, None for a stream without records).

    Why not read the files back: that was a second Spark job with a distinct count (~1.7 s of a warm
    Connect job). It stays exact: observed metrics of the write's (result) stage are merged once per
    partition, from the attempt the driver accepted (failed or speculative attempts are dropped), and a
    slice's read is deterministic, so they count exactly the rows of the committed attempts. Duplicate
    offsets cannot reach the writer: each task checks its offsets strictly increase inside its slice
    (``check_runs``) and the slices of a stream are disjoint, so records == distinct offsets.

    A fixed number of aggregates, whatever the number of streams (:mod:`streamledger.spark.summaries`):
    the tasks' summary rows collected, the record rows counted (their sum must match), and the record
    rows of unplanned streams counted (``index``: the column holding each row's position in
    ``streams``, NULL for a stream not planned; without it, rows are matched by name).
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    summary = f"offset = {SUMMARY_OFFSET}"
    if index is not None:
        unplanned = F.expr(f"count(CASE WHEN offset <> {SUMMARY_OFFSET} AND `{index}` IS NULL THEN 1 END)")
    else:
        unplanned = F.count(F.when((F.col("offset") != SUMMARY_OFFSET) & ~F.col("stream").isin(*streams), 1))
    metrics = [
        F.expr(f"collect_list(CASE WHEN {summary} THEN struct(stream, body) END) AS summaries"),
        F.expr(f"count(CASE WHEN offset <> {SUMMARY_OFFSET} THEN 1 END) AS records"),
        unplanned.alias("unplanned"),
    ]
    # A unique name: concurrent jobs in one session must never read each other's metrics.
    observation = Observation(f"streamledger_written_{uuid.uuid4().hex}")
    observed = df.observe(observation, *metrics).where(F.col("offset") != SUMMARY_OFFSET)

    def written() -> dict[str, tuple[int, int | None, int | None]]:
        got = observation.get
        if got["unplanned"]:
            raise JobError(f"output holds {got['unplanned']} records of unplanned streams")
        out: dict[str, tuple[int, int | None, int | None]] = dict.fromkeys(streams, (0, None, None))
        for row in got["summaries"]:
            stream, (n, lo, hi) = row["stream"], decode(row["body"])
            if stream not in out:
                raise JobError(f"output holds {n} records of unplanned stream {stream!r}")
            had, first, last = out[stream]
            out[stream] = (had + n, lo if first is None else min(first, lo),
                           hi if last is None else max(last, hi))
        summed = sum(n for n, _lo, _hi in out.values())
        if summed != got["records"]:
            raise JobError(f"the read tasks summarized {summed} records but Spark wrote {got['records']}")
        return out

    return observed, written


def run_job(spark: Any, **job: Any) -> dict[str, Any]:
    """:func:`job_manifest`'s manifest in its JSON form (what the job's command line prints)."""
    return job_manifest(spark, **job).to_dict()


def job_manifest(
    spark: Any,
    *,
    url: str,
    ranges: Mapping[str, Sequence[int]],
    output: str,
    fmt: str = "parquet",
    splits: int = 1,
    decode: str | None = None,
    fail_on_data_loss: bool = True,
    writer: str | None = None,
    writer_options: WriterOptions | None = None,
    transform: Transform | None = None,
) -> Manifest:
    """Read ``ranges`` (``{stream: (start, end)}``, half-open) into ``output`` and return the manifest.

    With ``fail_on_data_loss=False`` a start below retention is clamped and the skipped span is
    listed under ``lost`` for that stream; otherwise ``DataLossError`` is raised before anything is
    written. The Spark format follows the URL's scheme; ``decode`` None is that source's default
    (``amqp`` for RabbitMQ streams, ``bson`` for mewbase channels). ``writer``: ``arrow`` (the tasks
    write Parquet with pyarrow, :mod:`streamledger.spark.arrow_writer`; the default for Parquet) or
    ``spark`` (the JVM's writer; the only one for ORC and JSON).

    With an active ``transform`` the records land raw first (Parquet, verified as above, under
    ``output/_raw``), then :func:`_transform_ranges` runs it on each range's raw files and writes
    each range's rows in ``fmt`` into its own directory; the raw landing is removed.
    """
    if transform is not None and transform.active:
        return _transformed(spark, url=url, ranges=ranges, output=output, fmt=fmt, splits=splits,
                            decode=decode, fail_on_data_loss=fail_on_data_loss,
                            writer_options=writer_options, transform=transform)
    kind = log_kind(url)
    decode = decode or kind.default_decode
    if fmt not in FORMATS:
        raise PlanningError(f"format {fmt!r} is not supported; use one of {', '.join(FORMATS)}")
    if splits < 1:
        raise PlanningError(f"splits must be >= 1, got {splits}")
    if decode not in kind.decodes:
        raise PlanningError(
            f"decode must be {' or '.join(kind.decodes)} for a {kind.name} source, got {decode!r}"
        )
    writer = choose_writer(fmt, writer)
    out_dir = _output_dir(output)
    if writer == "arrow":
        fs.check_location(out_dir)  # the tasks write through pyarrow.fs: refuse what it cannot reach
        out_fs = fs.filesystem_for(out_dir)
    else:
        out_fs = for_session(spark, out_dir)
    planned = plan_job(url, ranges, fail_on_data_loss=fail_on_data_loss)
    read_ranges = {r.stream: [r.start, r.end] for r in planned}
    order = sorted(read_ranges)
    if writer == "arrow":
        stats, paths, files = _write_arrow(spark, kind=kind, url=url, planned=planned, decode=decode,
                                           splits=splits, out_dir=out_dir, out_fs=out_fs,
                                           options=writer_options or WriterOptions())
    else:
        stats, paths = _write_spark(spark, kind=kind, url=url, read_ranges=read_ranges, decode=decode,
                                    splits=splits, out_dir=out_dir, out_fs=out_fs, fmt=fmt)
        files = {}
    return _finish(planned, stats, paths, files, out_dir=out_dir, out_fs=out_fs, fmt=fmt, decode=decode,
                   splits=splits, order=order)


RAW_DIR = "_raw"


def _transformed(spark: Any, *, url: str, ranges: Mapping[str, Sequence[int]], output: str, fmt: str,
                 splits: int, decode: str | None, fail_on_data_loss: bool,
                 writer_options: WriterOptions | None, transform: Transform) -> Manifest:
    """The raw landing, then the transform per range (see :func:`job_manifest`)."""
    if fmt not in FORMATS:
        raise PlanningError(f"format {fmt!r} is not supported; use one of {', '.join(FORMATS)}")
    out_dir = _output_dir(output)
    out_fs = for_session(spark, out_dir)
    out_fs.delete(out_dir)  # the job owns its directory: a rerun replaces it as a whole
    # Spark reads the raw landing back: beside the output where the session reaches it, else (an object
    # store without the session's Hadoop connector) in a local directory of this job's.
    reachable = not fs.scheme(out_dir) or not isinstance(out_fs, fs.ArrowFS)
    raw_dir = fs.join(out_dir, RAW_DIR) if reachable else tempfile.mkdtemp(prefix="streamledger-raw-")
    try:
        return _transform_landed(spark, url=url, ranges=ranges, out_dir=out_dir, out_fs=out_fs,
                                 raw_dir=raw_dir, fmt=fmt, splits=splits, decode=decode,
                                 fail_on_data_loss=fail_on_data_loss, writer_options=writer_options,
                                 transform=transform)
    finally:
        if not reachable:
            shutil.rmtree(raw_dir, ignore_errors=True)


def _transform_landed(spark: Any, *, url: str, ranges: Mapping[str, Sequence[int]], out_dir: str,
                      out_fs: fs.OutputFS, raw_dir: str, fmt: str, splits: int, decode: str | None,
                      fail_on_data_loss: bool, writer_options: WriterOptions | None,
                      transform: Transform) -> Manifest:
    from streamledger.spark.transform import transform_range

    raw = job_manifest(spark, url=url, ranges=ranges, output=raw_dir, fmt="parquet", splits=splits,
                       decode=decode, fail_on_data_loss=fail_on_data_loss, writer="arrow",
                       writer_options=writer_options)
    ddl = log_kind(url).files_ddl()
    streams: dict[str, StreamEntry] = {}
    for i, stream in enumerate(sorted(raw.streams)):
        entry = raw.streams[stream]
        where = raw.entry_path(stream, raw_dir)
        names = entry.files if entry.files is not None else []
        path = fs.join(out_dir, f"{PART_COLUMN}={i}")
        done = transform_range(spark, transform, raw_files=[fs.join(where, n) for n in names], source_ddl=ddl,
                               stream=stream, start=entry.start, end=entry.end, out_dir=path, fmt=fmt)
        written = sorted(n for n in out_fs.files(path) if is_data_file(n))
        streams[stream] = replace(entry, path=path, files=tuple(written), rows=done.rows,
                                  dead_letter=done.dead_letter if transform.dead_letters else None)
    if raw_dir.startswith(out_dir):
        out_fs.delete(raw_dir)
    manifest = replace(raw, streams=streams, output=out_dir, format=fmt, transform=transform.fingerprint(),
                       written_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    out_fs.write_bytes(fs.join(out_dir, MANIFEST), manifest.to_json())  # last: it marks the output complete
    return manifest


def choose_writer(fmt: str, writer: str | None) -> str:
    """``arrow`` for Parquet unless ``spark`` is asked for; ``spark`` for ORC and JSON."""
    if writer is None:
        return "arrow" if fmt == "parquet" else "spark"
    if writer not in WRITERS:
        raise PlanningError(f"writer {writer!r} is not known; use one of {', '.join(WRITERS)}")
    if writer == "arrow" and fmt != "parquet":
        raise PlanningError(f"the arrow writer writes Parquet only; format {fmt!r} needs writer 'spark'")
    return writer


def _stream_dirs(order: Sequence[str]) -> dict[str, str]:
    """Each stream's directory relative to the job's output: flat for one stream, else a numbered
    partition directory (stream names may hold characters that paths escape)."""
    if len(order) == 1:
        return {order[0]: ""}
    return {s: f"{PART_COLUMN}={i}" for i, s in enumerate(order)}


def source_reader(kind: Any, *, url: str, ranges: Mapping[str, Sequence[int]], splits: int,
                  decode: str) -> Any:
    """The format's own reader (what its data source's read tasks run), for exact ranges."""
    options = {"url": url, "ranges": json.dumps({s: list(r) for s, r in ranges.items()}),
               "splitsPerStream": str(splits), "decode": decode, "failOnDataLoss": "true"}
    if kind.spark_format == "mewbase":
        from streamledger.spark.mewbase_source import MewbaseReader, MewbaseReadOptions

        return MewbaseReader(MewbaseReadOptions.parse(options))
    from streamledger.spark.datasource import RabbitMQStreamReader, ReadOptions

    return RabbitMQStreamReader(ReadOptions.parse(options))


Stats = dict[str, tuple[int, "int | None", "int | None"]]


def _write_arrow(spark: Any, *, kind: Any, url: str, planned: Sequence[PlannedRange], decode: str,
                 splits: int, out_dir: str, out_fs: fs.OutputFS, options: WriterOptions,
                 ) -> tuple[Stats, dict[str, str], dict[str, list[str]]]:
    """The tasks write the files (:mod:`streamledger.spark.arrow_writer`); the counts come from their
    accepted attempts' file summaries, and every other data file in ``out_dir`` is deleted."""
    order = sorted(r.stream for r in planned)
    rel = _stream_dirs(order)
    paths = {s: fs.join(out_dir, d) if d else out_dir for s, d in rel.items()}
    reader = source_reader(kind, url=url, ranges={r.stream: (r.start, r.end) for r in planned},
                           splits=splits, decode=decode)
    # Small ranges share tasks, but never fewer than two per core: one task reading 1,000 small
    # ranges one after the other leaves the other cores idle (issue 32, item 3).
    tasks = reader.tasks(planned, spread=2 * parallelism(spark))
    out_fs.delete(out_dir)  # the job owns its directory: a rerun replaces it as a whole
    summaries = write_files(spark, tasks=tasks, reader=reader, out_dir=out_dir, dirs=rel, options=options)
    stats: Stats = dict.fromkeys(order, (0, None, None))
    files: dict[str, list[str]] = {s: [] for s in order}
    for f in summaries:
        if f.stream not in stats:
            raise JobError(f"output holds {f.records} records of unplanned stream {f.stream!r}")
        had, first, last = stats[f.stream]
        stats[f.stream] = (had + f.records, f.first_offset if first is None else min(first, f.first_offset),
                           f.last_offset if last is None else max(last, f.last_offset))
        prefix = rel[f.stream]
        files[f.stream].append(f.file[len(prefix) + 1:] if prefix else f.file)
    keep_only(out_fs, out_dir, {f.file for f in summaries})
    for stream, path in paths.items():
        if not files[stream] and path != out_dir:
            out_fs.mkdirs(path)  # a stream without records still gets its (empty) directory
    if not summaries and len(order) == 1:
        out_fs.mkdirs(out_dir)
    return stats, paths, {s: sorted(v) for s, v in files.items()}


def keep_only(out_fs: fs.OutputFS, out_dir: str, counted: set[str]) -> None:
    """Delete every file under ``out_dir`` that no accepted attempt's summary names (a failed or
    killed attempt's file: its name is its own, so it never replaced one that counts)."""
    for name in out_fs.files(out_dir):
        if name not in counted:
            out_fs.delete(fs.join(out_dir, name))


def _write_spark(spark: Any, *, kind: Any, url: str, read_ranges: Mapping[str, list[int]], decode: str,
                 splits: int, out_dir: str, out_fs: fs.OutputFS, fmt: str) -> tuple[Stats, dict[str, str]]:
    """The JVM writer: a DataFrame of the source, written by Spark (ORC, JSON, or asked for)."""
    register_source(spark)
    if fmt == "parquet":
        # Timestamps as the Parquet standard's TIMESTAMP_MICROS (UTC), not Spark's legacy INT96: the
        # table sinks add these files to Iceberg / Delta tables as they are, and Iceberg has no INT96.
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    df = (
        spark.read.format(kind.spark_format)
        .option("url", url)
        .option("ranges", json.dumps(read_ranges))
        .option("splitsPerStream", splits)
        .option("decode", decode)
        # The clamping already happened above; loss appearing between the two plans must fail.
        .option("failOnDataLoss", "true")
        .option("sliceSummaries", "true")  # for the written-records metrics (_observe_written)
        .load()
    )
    out_fs.delete(fs.join(out_dir, MANIFEST))
    order = sorted(read_ranges)
    paths = {s: out_dir for s in order}
    if len(order) == 1:
        df, written_stats = _observe_written(df, order)
        df.write.mode("overwrite").format(fmt).save(out_dir)
    else:
        # One write for every stream, each into its own subdirectory: a numbered partition column
        # (stream names may hold characters that partition paths escape). The column is not in
        # the files; each subdirectory reads back with the plain schema.
        from pyspark.sql import functions as F

        part = F.create_map(*[x for i, s in enumerate(order) for x in (F.lit(s), F.lit(i))])
        paths = {s: fs.join(out_dir, f"{PART_COLUMN}={i}") for i, s in enumerate(order)}
        df, written_stats = _observe_written(df.withColumn(PART_COLUMN, part[F.col("stream")]), order,
                                             PART_COLUMN)
        (
            df
            .write.mode("overwrite")
            .partitionBy(PART_COLUMN)
            .format(fmt)
            .save(out_dir)
        )
        there = set(out_fs.listdir(out_dir))  # one listing, not a call per stream
        for path in paths.values():
            if fs.name(path) not in there:
                out_fs.mkdirs(path)  # a stream without records still gets its (empty) directory
    return written_stats(), paths


def _finish(planned: Sequence[PlannedRange], stats: Stats, paths: Mapping[str, str],
            files: Mapping[str, list[str]], *, out_dir: str, out_fs: fs.OutputFS, fmt: str, decode: str,
            splits: int, order: Sequence[str]) -> Manifest:
    """Check what was written against the plan and write the manifest (last: it marks the output
    complete)."""
    streams: dict[str, Any] = {}
    for r in planned:
        n, lo, hi = stats.pop(r.stream, (0, None, None))
        if n and (lo < r.start or hi >= r.end):  # type: ignore[operator]
            raise JobError(
                f"stream {r.stream!r}: wrote {n} records with offsets [{lo}, {hi}] outside the planned "
                f"range [{r.start}, {r.end})"
            )
        entry: dict[str, Any] = {
            "start": r.requested_start,
            "end": r.end,
            "read_start": r.start,
            "records": n,
            "first_offset": lo,
            "last_offset": hi,
            "path": paths[r.stream],
        }
        if r.stream in files:
            entry["files"] = files[r.stream]
        if r.lost is not None:
            entry["lost"] = [list(r.lost)]
        streams[r.stream] = entry

    manifest = Manifest(
        streams={s: StreamEntry.from_dict(s, e) for s, e in streams.items()},
        output=out_dir,
        format=fmt,
        decode=decode,
        splits=splits,
        written_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )
    out_fs.write_bytes(fs.join(out_dir, MANIFEST), manifest.to_json())  # temp + rename where atomic
    return manifest


def resolve_ranges(
    url: str, *, streams: Sequence[str], super_stream: str | None, start: str, end: str
) -> dict[str, tuple[int, int]]:
    """``--start``/``--end`` (earliest, latest, offset, {"timestamp": ms}) -> concrete ranges."""
    if super_stream:
        require_feature(url, "--super-stream")
    start_bound = parse_bound(start, what="--start")
    end_bound = parse_bound(end, what="--end")
    with connect_log(url) as client:
        names = (super_stream_partitions(client, super_stream, error=PlanningError) if super_stream
                 else list(streams))
        planned = plan_ranges(
            client, {s: (start_bound, end_bound) for s in names}, fail_on_data_loss=False
        )
    return {r.stream: (r.requested_start, r.end) for r in planned}


@contextlib.contextmanager
def url_file(url: str) -> Iterator[Path]:
    """``url`` in a file only this user can read (0600 in a fresh 0700 directory), removed on exit.

    Its *path* is what travels (``--url-file``): a path is no secret. In cluster deploy mode the
    driver runs elsewhere; ship the file with ``--files`` and the job finds it by name (see
    :func:`read_url_file`).
    """
    directory = Path(tempfile.mkdtemp(prefix="streamledger-"))
    try:
        path = directory / URL_FILE_NAME
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(url + "\n")
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def read_url_file(path: str) -> str:
    """The URL in ``path``, or in a file of the same name in the working directory (where YARN and
    Kubernetes put ``--files`` for a driver in cluster deploy mode)."""
    for candidate in (Path(path), Path(os.path.basename(path))):
        if candidate.is_file():
            url = candidate.read_text().strip()
            if not url:
                raise PlanningError(f"--url-file {path}: the file is empty")
            return url
    raise PlanningError(f"--url-file {path}: no such file here or in the working directory "
                        "(in cluster deploy mode, ship it with --files)")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="streamledger.spark.job",
        description="Read exact [start, end) offset ranges of RabbitMQ streams or mewbase channels into "
        "files with a manifest.",
    )
    p.add_argument("--url", default=os.environ.get("STREAMLEDGER_RABBITMQ_URL"),
                   help="rabbitmq-stream://user:pass@host:5552/vhost or mewbase://[user:pass@]host:port "
                   "(default: $STREAMLEDGER_RABBITMQ_URL); a password here shows in process lists")
    p.add_argument("--url-file", help="read the URL from this file instead (keeps the password off "
                   "the command line); wins over --url")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--stream", action="append", default=[], help="a stream or channel (repeatable)")
    src.add_argument("--super-stream", help="all partitions of this super stream")
    p.add_argument("--ranges", help='JSON {"stream": [start, end], ...}; replaces --stream/--start/--end')
    p.add_argument("--start", default="earliest", help="earliest | latest | offset | {\"timestamp\": ms}")
    p.add_argument("--end", default="latest", help="exclusive end, same forms as --start")
    p.add_argument("--output", required=True, help="output directory (overwritten by every run)")
    p.add_argument("--format", default="parquet", choices=FORMATS)
    p.add_argument("--splits", type=int, default=1, help="Spark partitions per stream range")
    p.add_argument("--writer", default=None, choices=WRITERS,
                   help="arrow: the tasks write Parquet with pyarrow (default for parquet); spark: the "
                   "JVM writer (orc, json)")
    p.add_argument("--row-group-bytes", type=int, default=ROW_GROUP_BYTES,
                   help="arrow writer: Arrow bytes buffered per row group (default %(default)s)")
    p.add_argument("--file-bytes", type=int, default=FILE_BYTES,
                   help="arrow writer: start a task's next file past this size (default %(default)s)")
    p.add_argument("--decode", default=None, choices=("amqp", "raw", "bson"),
                   help="default: amqp for RabbitMQ streams, bson for mewbase channels")
    p.add_argument("--allow-data-loss", action="store_true",
                   help="clamp starts below retention and record the lost span instead of failing")
    p.add_argument("--quick-start", action="store_true",
                   help="start the local JVM with C1-only JIT + serial GC (faster start, slower long reads)")
    p.add_argument("--remote", default=os.environ.get("SPARK_REMOTE"),
                   help="run on this Spark Connect server, sc://host:port (default: $SPARK_REMOTE); "
                   "replaces --master")
    p.add_argument("--session-id", default=None,
                   help="with --remote: the server-side session to attach to (a UUID; default: the one "
                   "all job processes share, whose Python workers stay warm)")
    p.add_argument("--master", default=None,
                   help=f"Spark master (default {DEFAULT_MASTER}; under spark-submit: spark-submit's)")
    p.add_argument("--transform", default=None,
                   help='JSON of the transform between read and write: {"sql": ..., "function": '
                   '"package.module:function", "body_format": "json", "body_schema": DDL, '
                   '"on_bad_record": ...}')
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.url_file:
            args.url = read_url_file(args.url_file)
        if not args.url:
            raise PlanningError("--url or --url-file is required (or set STREAMLEDGER_RABBITMQ_URL)")
        transform = None
        if args.transform:
            try:
                transform = Transform.from_dict(json.loads(args.transform))
            except ValueError as exc:
                raise PlanningError(f"--transform: {exc}") from None
        if args.ranges:
            if args.stream or args.super_stream:
                raise PlanningError("--ranges names the streams itself; drop --stream/--super-stream")
            ranges: dict[str, tuple[int, int]] = parse_ranges(args.ranges)
        elif args.stream or args.super_stream:
            ranges = resolve_ranges(
                args.url, streams=args.stream, super_stream=args.super_stream, start=args.start, end=args.end
            )
        else:
            raise PlanningError("give --stream, --super-stream or --ranges")
        if not args.remote:
            # Check the ranges against the broker before paying for a JVM start (a Connect server
            # is running already: the job plans first thing, before anything is written).
            plan_job(args.url, ranges, fail_on_data_loss=not args.allow_data_loss)
        if args.remote:
            if args.master:
                raise PlanningError("--remote and --master exclude each other")
            from streamledger.spark.connect import JOB_SESSION_ID, connect_session

            if args.session_id:
                try:
                    uuid.UUID(args.session_id)
                except ValueError:
                    raise PlanningError(f"--session-id {args.session_id!r} is not a UUID") from None

            # Attach to the jobs' long-lived server session: its Python workers are already warm.
            # Unregistered: the JVM writer registers the sources itself, the Arrow writer needs none.
            spark = connect_session(
                args.remote, session_id=args.session_id or JOB_SESSION_ID, keep_session=True, register=False
            )
        else:
            submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit launched us and owns the master
            master = args.master or (None if submitted else DEFAULT_MASTER)
            spark = build_session(master=master, app_name="streamledger-read", quick_start=args.quick_start)
        _started()
        try:
            manifest = run_job(
                spark, url=args.url, ranges=ranges, output=args.output, fmt=args.format,
                splits=args.splits, decode=args.decode, fail_on_data_loss=not args.allow_data_loss,
                writer=args.writer, writer_options=WriterOptions(args.row_group_bytes, args.file_bytes),
                transform=transform,
            )
        finally:
            spark.stop()
    except StreamledgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


def _started() -> None:
    """The session is there: what the start-up built lives as long as the process, so it is frozen
    (never scanned again) and the collector, off since the process began (``__main__`` only), is on."""
    if __name__ == "__main__" and not gc.isenabled():
        gc.freeze()
        gc.enable()


if __name__ == "__main__":
    exit_now(main())
