"""Issue 32: the Spark tasks write Parquet themselves (``streamledger.spark.arrow_writer``), real broker,
real local Spark: files as the JVM writer's (schema, timestamp types, rows), sizes by the options,
per-attempt names, only the files that count, and a batch that refuses a staging directory holding
any other."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger import fs
from streamledger.batch import BatchConfig, RunId, run_batch
from streamledger.errors import BatchError
from streamledger.ledger import Ledger
from streamledger.manifest import Manifest
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.sources import log_kind
from streamledger.spark.arrow_writer import WriterError, WriterOptions, write_task
from streamledger.spark.job import choose_writer, plan_job, run_job, source_reader
from streamledger.spark.planning import PlanningError
from tests.integration.batch.helpers import CountingRunner
from tests.integration.spark.helpers import RoundTrips, body, create_stream

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]


@pytest.fixture
def client(rabbitmq_url: str) -> Iterator[StreamClient]:
    with StreamClient.connect(rabbitmq_url) as c:
        yield c


def test_arrow_files_read_back_as_the_jvm_writers(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """Same ranges through both writers: Spark and pyarrow read the same schema, types and rows."""
    a, b = stream_name("aw-a"), stream_name("aw-b")
    create_stream(rabbitmq_url, a, 300)
    create_stream(rabbitmq_url, b, 50)
    ranges = {a: (10, 300), b: (0, 50)}
    arrow = run_job(spark, url=rabbitmq_url, ranges=ranges, output=str(tmp_path / "arrow"), splits=2)
    jvm = run_job(spark, url=rabbitmq_url, ranges=ranges, output=str(tmp_path / "jvm"), splits=2,
                  writer="spark")
    for s in (a, b):
        got, want = arrow["streams"][s], jvm["streams"][s]
        assert {k: got[k] for k in ("records", "first_offset", "last_offset")} == {
            k: want[k] for k in ("records", "first_offset", "last_offset")}
        assert got["files"] == sorted(n for n in fs.LOCAL.files(got["path"]))
        assert "files" not in want
        by_spark = spark.read.parquet(got["path"])
        assert by_spark.schema == spark.read.parquet(want["path"]).schema
        columns = ("offset", "body", "chunk_timestamp")
        assert sorted(tuple(r) for r in by_spark.select(*columns).collect()) == sorted(
            tuple(r) for r in spark.read.parquet(want["path"]).select(*columns).collect())
        arrow_schema = pq.read_schema(str(Path(got["path"]) / got["files"][0]))
        jvm_file = next(p for p in Path(want["path"]).iterdir() if p.suffix == ".parquet")
        jvm_schema = pq.read_schema(str(jvm_file))
        assert [(f.name, f.type) for f in arrow_schema] == [(f.name, f.type) for f in jvm_schema]
        assert str(arrow_schema.field("chunk_timestamp").type) == "timestamp[us, tz=UTC]"
        table = pq.read_table(got["path"], columns=["offset", "body"])
        assert table.num_rows == got["records"]
        assert all(r["body"] == body(s, r["offset"]) for r in table.to_pylist())


def test_row_groups_and_files_follow_the_options(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    s = stream_name("aw-sizes")
    create_stream(rabbitmq_url, s, 3000)
    small = WriterOptions(row_group_bytes=16 << 10, file_bytes=8 << 10)
    manifest = run_job(spark, url=rabbitmq_url, ranges={s: (0, 3000)}, output=str(tmp_path / "o"),
                       writer_options=small)
    entry = manifest["streams"][s]
    sizes = [(Path(entry["path"]) / f).stat().st_size for f in entry["files"]]
    assert entry["records"] == 3000 and len(entry["files"]) > 1, sizes
    groups = [pq.ParquetFile(Path(entry["path"]) / f).metadata.num_row_groups for f in entry["files"]]
    assert max(groups) > 1, groups
    assert sum(pq.ParquetFile(Path(entry["path"]) / f).metadata.num_rows for f in entry["files"]) == 3000
    default = run_job(spark, url=rabbitmq_url, ranges={s: (0, 3000)}, output=str(tmp_path / "d"))
    assert len(default["streams"][s]["files"]) == 1


def test_bad_writer_options_are_refused_in_one_line() -> None:
    with pytest.raises(WriterError, match="row_group_bytes must be a positive number of bytes, got 0"):
        WriterOptions(row_group_bytes=0)
    with pytest.raises(WriterError, match="compression must be one of"):
        WriterOptions(compression="brotli9")
    with pytest.raises(PlanningError, match="the arrow writer writes Parquet only; format 'orc'"):
        choose_writer("orc", "arrow")
    assert choose_writer("parquet", None) == "arrow" and choose_writer("json", None) == "spark"


def test_two_attempts_of_a_task_write_two_names_and_only_the_accepted_one_is_kept(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """A failed attempt that wrote its file before dying, then the retry: different names, never an
    overwrite; the job keeps the file the accepted attempt's summary names and deletes the other."""
    from streamledger.spark.job import keep_only

    s = stream_name("aw-attempts")
    create_stream(rabbitmq_url, s, 100)
    planned = plan_job(rabbitmq_url, {s: (0, 100)})
    reader = source_reader(log_kind(rabbitmq_url), url=rabbitmq_url, ranges={s: (0, 100)}, splits=1,
                           decode="amqp")
    (task,) = reader.tasks(planned)
    out = tmp_path / "out"
    arrow_fs, root = fs.arrow_filesystem(str(out))
    first = write_task(task, reader, fs=arrow_fs, root=root, dirs={s: ""}, options=WriterOptions(), task=0,
                       attempt=7)
    second = write_task(task, reader, fs=arrow_fs, root=root, dirs={s: ""}, options=WriterOptions(), task=0,
                        attempt=8)
    assert [f.records for f in first] == [f.records for f in second] == [100]
    assert first[0].file != second[0].file and "-7-" in first[0].file and "-8-" in second[0].file
    assert sorted(p.name for p in out.iterdir()) == sorted([first[0].file, second[0].file])
    keep_only(fs.LOCAL, str(out), {second[0].file})
    assert [p.name for p in out.iterdir()] == [second[0].file]


class AddsAFile:
    """The real runner; after its job, a file no attempt's summary names appears in staging (what a
    zombie attempt finishing late would leave)."""

    def __init__(self, inner: CountingRunner) -> None:
        self.inner = inner

    def __call__(self, **kwargs: Any) -> Manifest:
        manifest = self.inner(**kwargs)  # runners hand the batch a typed Manifest (issue 31)
        entry = next(iter(manifest.streams.values()))
        assert entry.path is not None
        path = Path(entry.path)
        good = next(p for p in path.iterdir() if p.suffix == ".parquet")
        (path / "part-99999-000-1-late.parquet").write_bytes(good.read_bytes())
        return manifest


def test_verify_refuses_a_data_file_the_job_did_not_list(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, client: StreamClient
) -> None:
    s = stream_name("aw-extra")
    create_stream(rabbitmq_url, s, 40)
    cfg = BatchConfig(pipeline="p-extra", url=rabbitmq_url, output_root=str(tmp_path / "out"), stream=s)
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", create=True) as ledger:
        with pytest.raises(BatchError, match=r"part-99999-000-1-late\.parquet") as caught:
            run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client,
                      runner=AddsAFile(CountingRunner(spark)))
        assert "\n" not in str(caught.value)
        assert [r.status.value for r in ledger.ranges("p-extra")] != ["committed"]
        published = [p for p in (tmp_path / "out").rglob("_manifest.json") if "_staging" not in p.parts]
        assert not published, published


def _spark_tasks(spark: Any, group: str) -> int:
    """How many Spark tasks the jobs of ``group`` ran (the status tracker's stages)."""
    tracker = spark.sparkContext.statusTracker()
    stages = [s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds]
    return sum(tracker.getStageInfo(s).numTasks for s in stages)


def test_many_small_ranges_share_a_few_tasks_that_use_every_core(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """Issue 32 item 3: many small ranges are packed into about two tasks per core, not one task per
    range (scheduling) nor one task for all (a single core reading every range one after the
    other). Every record is still written once, in files named by the task that wrote them."""
    streams = [stream_name(f"aw-many-{i}") for i in range(12)]
    for s in streams:
        create_stream(rabbitmq_url, s, 10)
    group = f"aw-many-{tmp_path.name}"
    spark.sparkContext.setJobGroup(group, "many small ranges")
    try:
        manifest = run_job(spark, url=rabbitmq_url, ranges={s: (0, 10) for s in streams},
                           output=str(tmp_path / "o"))
    finally:
        spark.sparkContext.setJobGroup("", "")
    cores = spark.sparkContext.defaultParallelism
    tasks = _spark_tasks(spark, group)
    assert cores <= tasks <= 2 * cores, f"{tasks} Spark tasks for 12 small ranges on {cores} cores"
    writers = {name.split("-")[1] for s in streams for name in manifest["streams"][s]["files"]}
    assert len(writers) == tasks
    assert [manifest["streams"][s]["records"] for s in streams] == [10] * 12
    table = pq.read_table(str(tmp_path / "o"), columns=["stream", "offset"])
    assert sorted((r["stream"], r["offset"]) for r in table.to_pylist()) == [
        (s, o) for s in sorted(streams) for o in range(10)]


def test_a_task_of_many_small_ranges_costs_round_trips_per_window_not_per_range(
    rabbitmq_url: str, stream_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: at 1,000 partitions x 10 records a writer task holds ~100 small ranges; read one
    by one each costs ~4 round trips (StreamStats, Metadata, Subscribe, Unsubscribe). Read through
    subscriptions in flight together, the task's round trips do not grow with its ranges (one
    window holds up to 255), and its files hold exactly the records read_range reads."""
    from streamledger.spark.reading import SliceGroup

    trips: dict[int, int] = {}
    for n in (12, 48):
        streams = [stream_name(f"aw-rt{n}-{i}") for i in range(n)]
        for i, s in enumerate(streams):
            create_stream(rabbitmq_url, s, 10 + i % 3)
        ranges = {s: (i % 3, 10 + i % 3) for i, s in enumerate(streams)}
        planned = plan_job(rabbitmq_url, ranges)
        reader = source_reader(log_kind(rabbitmq_url), url=rabbitmq_url, ranges=ranges, splits=1,
                               decode="amqp")
        (task,) = reader.tasks(planned, spread=1)
        assert isinstance(task, SliceGroup) and len(task.slices) == n
        arrow_fs, root = fs.arrow_filesystem(str(tmp_path / f"out{n}"))
        counter = RoundTrips(monkeypatch)
        written = write_task(task, reader, fs=arrow_fs, root=root, dirs={s: s for s in streams},
                             options=WriterOptions(), task=0, attempt=1)
        trips[n] = counter.count
        monkeypatch.undo()
        with StreamClient.connect(rabbitmq_url) as client:
            for s in streams:
                (f,) = [w for w in written if w.stream == s]
                table = pq.read_table(str(tmp_path / f"out{n}" / f.file))
                want = [(o, bytes(b)) for batch in client.read_range(s, *ranges[s]) for o, b in
                        zip(batch.offsets, batch.bodies, strict=True)]
                assert list(zip(table.column("offset").to_pylist(), table.column("body").to_pylist(),
                                strict=True)) == want
    assert trips[48] == trips[12], trips  # one window: the same round trips for 12 ranges as for 48
    assert trips[48] < 48 // 2, trips  # one by one: ~4 per range (206 for 48 ranges)



def _task_peak(url: str, stream: str, end: int, out: Path, options: WriterOptions) -> int:
    """Bytes one task's read + write of ``[0, end)`` held at most: the peak of Python's allocations
    (the client's record buffers are bytearrays) plus the peak of what Arrow allocated through its
    default pool, each over this task alone."""
    import tracemalloc

    import pyarrow as pa

    planned = plan_job(url, {stream: (0, end)})
    reader = source_reader(log_kind(url), url=url, ranges={stream: (0, end)}, splits=1, decode="amqp")
    (task,) = reader.tasks(planned)
    arrow_fs, root = fs.arrow_filesystem(str(out))
    previous = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(previous)
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        (written,) = write_task(task, reader, fs=arrow_fs, root=root, dirs={stream: ""}, options=options,
                                task=0, attempt=0)
        traced = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(previous)
    assert written.records == end
    return traced + pool.max_memory()


def test_a_tasks_peak_memory_follows_its_row_group_not_its_range(
    rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """Issue 32 item 4: a task streams row groups, so what it holds is about a row group and the
    batch in hand, whatever its range: 8x the records (5.6 MB more) may not raise its peak by a row
    group. Allocations are measured, not the resident set (which the allocators' retention blurs).
    The records are published 500 at a time, so no broker chunk (a read batch's least) is large."""
    s = stream_name("aw-memory")
    n, size, per_chunk = 32_000, 200, 500
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(s)
        for at in range(0, n, per_chunk):
            bodies = [i.to_bytes(8, "little") * (size // 8) for i in range(at, at + per_chunk)]
            assert client.publish(s, bodies, batch_size=per_chunk).confirmed == per_chunk
    options = WriterOptions(row_group_bytes=256 << 10)
    _task_peak(rabbitmq_url, s, 100, tmp_path / "warm", options)  # first-use imports and caches
    small = _task_peak(rabbitmq_url, s, n // 8, tmp_path / "small", options)
    large = _task_peak(rabbitmq_url, s, n, tmp_path / "large", options)
    assert large - small < options.row_group_bytes, (
        f"a task's peak: {small / 2**20:.2f} MiB for {n // 8:,} records of {size} B, "
        f"{large / 2**20:.2f} MiB for {n:,}, row groups of {options.row_group_bytes >> 10} KiB")
