"""Spark data source vs a single-process rstream consumer: the same messages into Parquet, same run.

Setup: a 2-partition super stream on the local 4.3 broker (127.0.0.1:5552) filled with N AMQP messages
(default 1,000,000 x 100 random bytes, split evenly). Then, in this order:

1. baseline: one Python process with rstream (``amqp_decoder``; no decoder with ``--decode raw``)
   consumes both partitions from the first offset to the committed tail and writes Parquet with
   pyarrow (same schema and the same map/timestamp conversion as the data source);
2. Spark on ``local[2]``: ``SparkSession`` start, then a one-record read (the first Python data-source
   call starts the lookup/planner/worker processes: a fixed cost), then the ``rabbitmq_stream`` source
   with ``superStream`` into Parquet.

Prints msgs/s for each, the ratio baseline time / Spark time end to end (session + warm-up + read), for the
first read alone and for a second read in the same session (warm JVM: a long-lived session's steady
state; also timed into Spark's ``noop`` sink, i.e. without Parquet encoding), and the share of Spark's
end-to-end time that is fixed start-up. Figures are noisy on a shared 2-core VM; compare within one run.

3. Spark Connect (``--connect``, or ``--remote sc://...`` for a server already running): a server is
   started (and warmed with a one-record read) *before* the timing, as a warm data plane would be;
   then ``python -m streamledger.spark.job --remote URL`` runs as its own process over the super
   stream (the whole job: interpreter start, imports, attaching to the jobs' shared server session,
   planning, read, Parquet, manifest), three times; the ratio is the baseline time / the job process's
   wall time. The first large job on a fresh server also pays the JVM's JIT warm-up; the later ones are
   the steady state of a server that has run such jobs before. The warm-up job also warms that shared
   session's Python workers, as earlier jobs would. In each round, beside it and timed the same way
   (a whole process, wall and CPU seconds): ``streamledger read`` of both partitions into Parquet in
   one process (the CLI's entry point, one partition after the other), and with ``--s3`` the same job
   into a bucket of the tests' S3 server (moto, credentials in the job's environment only). Printed:
   rstream / job, CLI / job and S3 / local ratios (best of three each), then a task's peak memory for
   three range sizes up to N records (:func:`memory` says what is measured), and per 1 M records.
   The broker URL reaches every process through its environment, not its command line.
   ``--skip-local`` leaves out step 2.

4. ``--memory-only``: just the fresh-process part of step 3's memory figures (no baseline, no Spark),
   ``--memory-rounds`` times each, the ranges alternating: quick to repeat before and after a change.

Usage: ``python bench/spark_read.py [--messages N] [--size B] [--decode amqp|raw] [--splits K]
[--quick-start] [--connect | --remote URL] [--s3] [--skip-local] [--memory-only [--memory-rounds R]]
[--url URL] [--keep]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/partitions.py's helpers

from streamledger.protocol.rabbitmq import StreamClient
from streamledger.spark.arrow import ARROW_SCHEMA, to_arrow

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"


def prepare(url: str, name: str, messages: int, size: int) -> tuple[list[str], dict[str, int]]:
    """(Re)create the super stream and fill it; returns its partitions and their tails."""
    payload = os.urandom(size * 4096)
    with StreamClient.connect(url) as client:
        client.delete_super_stream(name, missing_ok=True)
        client.create_super_stream(name, partitions=2)
        parts = client.partitions(name)
        t0 = time.perf_counter()
        for k, part in enumerate(parts):
            count = messages // len(parts) + (1 if k < messages % len(parts) else 0)
            bodies = (
                payload[(i % 4000) * size : (i % 4000) * size + size - 8] + i.to_bytes(8, "little")
                for i in range(count)
            )
            result = client.publish(part, bodies, batch_size=1000)
            if result.confirmed != count:
                raise SystemExit(f"publish to {part}: {result.confirmed}/{count} confirmed")
        took = time.perf_counter() - t0
        tails = {p: client.committed_tail(p) for p in parts}
    print(f"published {messages:,} x {size} B into {name} {parts} in {took:.1f}s "
          f"({messages / took:,.0f} msg/s)", flush=True)
    return parts, tails


async def _rstream_consume(url: str, tails: dict[str, int], out_dir: Path, decode: str) -> int:
    from rstream import (
        AMQPMessage,
        Consumer,
        ConsumerOffsetSpecification,
        MessageContext,
        OffsetType,
        amqp_decoder,
    )

    u = urlsplit(url)
    consumer = Consumer(u.hostname or "127.0.0.1", u.port or 5552, username=u.username or "guest",
                        password=u.password or "guest")
    cols: dict[str, dict[str, list[Any]]] = {
        p: {"offsets": [], "ts": [], "bodies": [], "props": [], "app": []} for p in tails
    }
    writers = {p: pq.ParquetWriter(out_dir / f"{p}.parquet", ARROW_SCHEMA) for p in tails}
    remaining = {p: t for p, t in tails.items() if t > 0}
    done = asyncio.Event()
    total = 0

    def flush(p: str) -> None:
        c = cols[p]
        if c["offsets"]:
            writers[p].write_batch(to_arrow(p, c["offsets"], c["ts"], c["bodies"], c["props"], c["app"]))
            for v in c.values():
                v.clear()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        nonlocal total
        p = ctx.stream
        if p not in remaining or ctx.offset >= tails[p]:
            return
        c = cols[p]
        c["offsets"].append(ctx.offset)
        c["ts"].append(ctx.timestamp)
        c["props"].append(None)
        if decode == "raw":
            c["bodies"].append(msg)
            c["app"].append(None)
        else:
            data = msg.body
            c["bodies"].append(data if isinstance(data, bytes) else b"".join(data))
            app = msg.application_properties
            c["app"].append(
                {k.decode() if isinstance(k, bytes) else k: v for k, v in app.items()} if app else None
            )
        total += 1
        if len(c["offsets"]) >= 65536:
            flush(p)
        if ctx.offset >= tails[p] - 1:
            del remaining[p]
            if not remaining:
                done.set()

    await consumer.start()
    for p in remaining:
        await consumer.subscribe(p, on_message, decoder=amqp_decoder if decode == "amqp" else None,
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
    if remaining:
        await asyncio.wait_for(done.wait(), timeout=900)
    await consumer.close()
    for p, w in writers.items():
        flush(p)
        w.close()
    return total


def baseline(url: str, tails: dict[str, int], out_dir: Path, decode: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = asyncio.run(_rstream_consume(url, tails, out_dir, decode))
    return n, time.perf_counter() - t0


def spark_read(spark: Any, url: str, decode: str, out: Path, fmt: str = "parquet",
               **options: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    reader = spark.read.format("rabbitmq_stream").option("url", url).option("decode", decode)
    for key, value in options.items():
        reader = reader.option(key, value)
    reader.load().write.mode("overwrite").format(fmt).save(str(out))
    took = time.perf_counter() - t0
    if fmt == "noop":
        return -1, took
    return pq.ParquetDataset(out).read(columns=["offset"]).num_rows, took


def job_timings(spark: Any, args: Any, parts: list[str], out: Path) -> dict[str, list[float]]:
    """``run_job`` over both partitions with each writer, ``--steady`` rounds alternating writers."""
    from streamledger.spark.job import run_job

    with StreamClient.connect(args.url) as client:
        ranges = {p: (0, client.committed_tail(p)) for p in parts}
    times: dict[str, list[float]] = {w: [] for w in args.writers.split(",")}
    for _ in range(max(1, args.steady)):
        for writer in times:
            t0 = time.perf_counter()
            run_job(spark, url=args.url, ranges=ranges, output=str(out), splits=args.splits,
                    decode=args.decode, writer=writer)
            times[writer].append(time.perf_counter() - t0)
    return times


def _cpu_children() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``command`` as its own process: (its result, wall seconds, its CPU seconds)."""
    cpu = _cpu_children()
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    took = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, took, _cpu_children() - cpu


def cli_command(parts: list[str], out_dir: Path) -> list[str]:
    """``streamledger read`` of every partition to Parquet, one after the other, in one process (the
    CLI's own entry point; the broker URL comes from the environment)."""
    calls = [["read", p, "--start", "first", "--end", "next", "--output", str(out_dir / f"{p}.parquet")]
             for p in parts]
    code = ("import sys; from streamledger.cli import main; "
            f"sys.exit(max(main(argv) for argv in {calls!r}))")
    return [sys.executable, "-c", code]


def _task_lines(stats_dir: Path) -> list[dict[str, Any]]:
    """The task lines the server's workers wrote (``$STREAMLEDGER_TASK_STATS``), then forgets them."""
    path = stats_dir / "tasks.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.unlink()
    return lines


def connect_bench(args: Any, parts: list[str], expected: int, t_base: float, work: Path) -> None:
    """A job process against a warm Spark Connect server (started here unless ``--remote``), beside
    ``streamledger read`` of the same partitions in one process and the same job into S3 (moto).

    Wall time moves with the machine's load; the CPU seconds of each peer (the job: its own process
    plus the server's JVM and Python workers; the CLI: its process) do much less, so both are printed.
    Started here, the server's workers write each task's timings and peak memory
    (``$STREAMLEDGER_TASK_STATS``, :func:`streamledger.spark.arrow_writer.task_stats`)."""
    from partitions import _tree_cpu  # bench/partitions.py

    from streamledger.spark import connect
    from streamledger.spark.arrow_writer import STATS_ENV

    root = work / "connect-server"
    stats_dir = work / "task-stats"
    url = args.remote
    env = {**os.environ, "STREAMLEDGER_RABBITMQ_URL": args.url, "STREAMLEDGER_BROKER_URL": args.url}
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        env.pop(name, None)
    server_pid: int | None = None
    try:
        if url is None:
            t0 = time.perf_counter()
            os.environ[STATS_ENV] = str(stats_dir)  # the server's workers inherit it
            try:
                state = connect.start(root=root, conf={"spark.driver.memory": "4g"})
            finally:
                del os.environ[STATS_ENV]
            url, server_pid = state.url, state.pid
            print(f"connect server   : started in {time.perf_counter() - t0:6.2f}s at {url}", flush=True)
        job = [sys.executable, "-m", "streamledger.spark.job", "--remote", url,
               "--decode", args.decode, "--splits", str(args.splits)]
        warm = subprocess.run([*job, "--ranges", json.dumps({parts[0]: [0, 1]}), "--output",
                               str(work / "connect-warmup")], capture_output=True, text=True, check=False,
                              env=env)
        assert warm.returncode == 0, warm.stderr[-3000:]
        bucket_env: dict[str, str] | None = None
        if args.s3:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.support.s3 import new_bucket, start_server

            bucket = new_bucket(start_server())
            bucket_env = {**env, **bucket.environment()}
            s3_out = bucket.uri("connect")
        (work / "cli").mkdir()
        rows: dict[str, list[tuple[float, float]]] = {}

        def record(name: str, took: float, cpu: float, n: int) -> None:
            rows.setdefault(name, []).append((took, cpu))
            print(f"  {name:22s}: {n:,} msgs in {took:6.2f}s ({n / took:>9,.0f} msg/s), CPU {cpu:5.2f}s; "
                  f"rstream time / it {t_base / took:.2f}x  (load {os.getloadavg()[0]:.1f})", flush=True)

        def server_cpu() -> float:
            return _tree_cpu(server_pid) if server_pid else 0.0

        for attempt in (1, 2, 3):
            print(f"round {attempt}:", flush=True)
            for writer in args.writers.split(","):
                before = server_cpu()
                proc, took, cpu = _timed([*job, "--super-stream", args.name, "--output",
                                          str(work / "connect"), "--writer", writer], env)
                n = sum(e["records"] for e in json.loads(proc.stdout)["streams"].values())
                assert n == expected, (n, expected)
                record(f"job {writer} -> local", took, cpu + server_cpu() - before, n)
                tasks = _task_lines(stats_dir)
                if tasks:
                    print("    tasks: " + "; ".join(
                        f"{t['records']:,} rec {t['wall']:.2f}s wall {t['cpu']:.2f}s CPU" for t in tasks))
            proc, took, cpu = _timed(cli_command(parts, work / "cli"), env)
            n = sum(json.loads(line)["records"] for line in proc.stdout.splitlines() if line.startswith("{"))
            assert n == expected, (n, expected)
            record("streamledger read", took, cpu, n)
            if bucket_env is not None:
                before = server_cpu()
                proc, took, cpu = _timed([*job, "--super-stream", args.name, "--output", s3_out,
                                          "--writer", "arrow"], bucket_env)
                assert bucket.secret_key not in proc.stdout + proc.stderr
                n = sum(e["records"] for e in json.loads(proc.stdout)["streams"].values())
                assert n == expected, (n, expected)
                record("job arrow -> s3 (moto)", took, cpu + server_cpu() - before, n)
                _task_lines(stats_dir)

        # What a long-lived client pays per job (the batch's Connect runner keeps its session): one
        # process attaches once, then runs the job three times; only the jobs are timed.
        spec = {"remote": url, "super_stream": args.name, "output": str(work / "in-session")}
        proc, _took, _cpu = _timed([sys.executable, __file__, "--warm-client", json.dumps(spec)], env)
        for took, n in json.loads(proc.stdout.splitlines()[-1]):
            assert n == expected, (n, expected)
            record("job in a warm client", took, float("nan"), n)
        _task_lines(stats_dir)

        def best(name: str) -> tuple[float, float]:
            return min(t for t, _ in rows[name]), min(c for _, c in rows[name])

        if "job arrow -> local" in rows:
            job_t, job_c = best("job arrow -> local")
            cli_t, cli_c = best("streamledger read")
            print(f"ratios (best of 3 each, same run): rstream / job {t_base / job_t:.2f}x "
                  "(issue 32: >= 6x); "
                  f"streamledger read / job {cli_t / job_t:.2f}x wall, {cli_c / job_c:.2f}x CPU "
                  "(issue 32: >= 1.0x, aim 1.3x)")
            warm_t = min(t for t, _ in rows["job in a warm client"])
            print(f"job in a warm client (a batch runner's session, no process start): rstream / job "
                  f"{t_base / warm_t:.2f}x, streamledger read / job {cli_t / warm_t:.2f}x wall")
            if "job arrow -> s3 (moto)" in rows:
                s3_t, s3_c = best("job arrow -> s3 (moto)")
                print(f"ratio job into S3 (moto) / into the local file system: {s3_t / job_t:.2f}x wall, "
                      f"{s3_c / job_c:.2f}x CPU")
        if server_pid:
            stream = memory_stream(args.url, args.name, args.messages, args.size)
            try:
                memory(stream, args.messages, env, work, job=job, stats_dir=stats_dir,
                       rounds=args.memory_rounds)
            finally:
                with StreamClient.connect(args.url) as client:
                    client.delete_stream(stream, missing_ok=True)
    finally:
        if args.remote is None:
            connect.stop(root)


MEMORY_ROW_GROUPS = (None, 4 << 20)  # the default, and 4 MiB


def memory_stream(url: str, name: str, messages: int, size: int) -> str:
    """A single stream of ``messages`` records for :func:`memory` (a task reads one stream's slice,
    and the super stream's partitions hold half the records each)."""
    stream = f"{name}-memory"
    payload = os.urandom(size * 4096)
    with StreamClient.connect(url) as client:
        client.delete_stream(stream, missing_ok=True)
        client.create_stream(stream)
        bodies = (payload[(i % 4000) * size : (i % 4000) * size + size - 8] + i.to_bytes(8, "little")
                  for i in range(messages))
        result = client.publish(stream, bodies, batch_size=1000)
        if result.confirmed != messages:
            raise SystemExit(f"publish to {stream}: {result.confirmed}/{messages} confirmed")
    return stream


def memory(stream: str, messages: int, env: dict[str, str], work: Path, *, job: list[str] | None = None,
           stats_dir: Path | None = None, rounds: int = 1) -> None:
    """A task's peak memory against its range: the first 1/16, 1/4 and all of ``stream`` (62,500 /
    250,000 / 1,000,000 records by default), with the default row groups and with 4 MiB ones,
    ``rounds`` times, the ranges alternating.

    * **fresh process**: the task's own code (the job's reader and ``write_task``, what a Spark task
      runs) in a new Python process per range: its peak resident set (``VmHWM``) minus its resident
      set before the read, after the imports and after what a reused worker has done once (the
      first Parquet table and writer import pandas: ~30 MiB that a Spark worker pays once, not per
      task). Printed per range and, for the whole stream, as the peak per 1 M records.
    * **Spark task** (``job``: a warm Connect server started here): the job, one task; the Python
      worker's resident-set high-water mark during the task (``VmHWM``, reset at the task's start
      through ``/proc/self/clear_refs``). A reused worker keeps memory its earlier tasks freed (the
      allocators hold it), so this is an absolute figure for the worker, not what the task added.
    """
    spark = "" if job is None else "; Spark task: the reused worker's RSS high-water mark during the task"
    print(f"task memory per range (fresh process: peak RSS minus RSS before the read; load "
          f"{os.getloadavg()[0]:.1f}){spark}:", flush=True)
    spans = (messages // 16, messages // 4, messages)
    held: dict[tuple[int | None, int], list[float]] = {}
    for _ in range(max(1, rounds)):
        for row_group in MEMORY_ROW_GROUPS:
            for span in spans:
                probe = subprocess.run(
                    [sys.executable, __file__, "--memory-probe", json.dumps({
                        "stream": stream, "end": span, "row_group": row_group, "out": str(work / "probe")})],
                    capture_output=True, text=True, check=False, env=env)
                assert probe.returncode == 0, probe.stderr[-3000:]
                got = json.loads(probe.stdout.splitlines()[-1])
                assert got["records"] == span, got
                mib = (got["peak_kib"] - got["start_kib"]) / 1024
                held.setdefault((row_group, span), []).append(mib)
                label = "default" if row_group is None else f"{row_group >> 20} MiB"
                line = (f"  row groups {label:>7s}, {span:>9,} records: fresh process holds {mib:6.1f} MiB "
                        f"at most (RSS before the read {got['start_kib'] / 1024:.0f} MiB)")
                if job is not None and stats_dir is not None:
                    options = ["--row-group-bytes", str(row_group)] if row_group else []
                    _timed([*job, "--ranges", json.dumps({stream: [0, span]}), "--output",
                            str(work / "memory"), "--writer", "arrow", *options], env)
                    (task,) = _task_lines(stats_dir)
                    assert task["records"] == span and task["peak_reset"], task
                    line += (f"; Spark task: worker peak {task['peak_kib'] / 1024:6.1f} MiB (RSS at its "
                             f"start {task['rss_kib'] / 1024:.0f} MiB)")
                print(line, flush=True)
    for row_group in MEMORY_ROW_GROUPS:
        label = "default" if row_group is None else f"{row_group >> 20} MiB"
        best = [min(held[(row_group, span)]) for span in spans]
        print(f"  -> {label} row groups: a task's peak {' / '.join(f'{h:.1f}' for h in best)} MiB at "
              f"{' / '.join(f'{s:,}' for s in spans)} records (least of {max(1, rounds)}); per 1 M "
              f"records {best[-1] / spans[-1] * 1e6:.1f} MiB; {best[-1] - best[0]:+.1f} MiB from the "
              f"smallest range to the largest (issue 32: must not grow with the range)", flush=True)


def warm_client(spec: dict[str, Any]) -> None:
    """Attach to the jobs' Connect session once, run the job three times (:func:`connect_bench`);
    prints JSON ``[[seconds, records], ...]``."""
    from streamledger.spark.connect import JOB_SESSION_ID, connect_session
    from streamledger.spark.job import resolve_ranges, run_job

    broker = os.environ["STREAMLEDGER_RABBITMQ_URL"]
    spark = connect_session(spec["remote"], session_id=JOB_SESSION_ID, keep_session=True, register=False)
    try:
        ranges = resolve_ranges(broker, streams=[], super_stream=spec["super_stream"], start="earliest",
                                end="latest")
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            manifest = run_job(spark, url=broker, ranges=ranges, output=spec["output"])
            times.append([time.perf_counter() - t0, sum(e["records"] for e in manifest["streams"].values())])
    finally:
        spark.stop()
    print(json.dumps(times))


def _first_parquet_write(out: str) -> None:
    """What a reused Spark worker has done before: a first Parquet write (its table and writer
    import pandas and pyarrow's Parquet library, ~30 MiB of a fresh process, once)."""
    import pyarrow as pa

    table = pa.Table.from_batches([pa.record_batch([pa.array([1])], names=["x"])])
    pq.write_table(table, os.path.join(out, "warm.parquet"))
    os.remove(os.path.join(out, "warm.parquet"))


def memory_probe(spec: dict[str, Any]) -> None:
    """One task's work (:func:`memory`) in this fresh process; prints JSON with its memory."""
    import pyarrow.fs as pafs

    from streamledger.sources import log_kind
    from streamledger.spark.arrow_writer import WriterOptions, write_task
    from streamledger.spark.job import plan_job, source_reader

    url = os.environ["STREAMLEDGER_RABBITMQ_URL"]
    ranges = {spec["stream"]: (0, spec["end"])}
    planned = plan_job(url, ranges)
    reader = source_reader(log_kind(url), url=url, ranges=ranges, splits=1, decode="amqp")
    (task,) = reader.tasks(planned)
    options = WriterOptions(row_group_bytes=spec["row_group"]) if spec["row_group"] else WriterOptions()
    shutil.rmtree(spec["out"], ignore_errors=True)
    os.makedirs(spec["out"])
    _first_parquet_write(spec["out"])

    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

    start = status("VmRSS")
    files = write_task(task, reader, fs=pafs.LocalFileSystem(), root=spec["out"], dirs={spec["stream"]: ""},
                       options=options, task=0, attempt=0)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over an exec, so it would be the bench's own peak.
    print(json.dumps({"records": sum(f.records for f in files), "start_kib": start,
                      "peak_kib": status("VmHWM")}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=os.environ.get("STREAMLEDGER_RABBITMQ_URL", DEFAULT_URL))
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--name", default="bench-spark-read")
    ap.add_argument("--decode", default="amqp", choices=("amqp", "raw"))
    ap.add_argument("--splits", type=int, default=1, help="Spark partitions per stream partition")
    ap.add_argument("--quick-start", action="store_true", help="C1-only JIT + serial GC for the Spark JVM")
    ap.add_argument("--keep", action="store_true", help="keep the super stream afterwards")
    ap.add_argument("--steady", type=int, default=3,
                    help="more in-session reads after the second; their median is the steady-state rate")
    ap.add_argument("--connect", action="store_true", help="also time a job process on a warm Connect server")
    ap.add_argument("--remote", default=None, help="use this running Connect server (implies --connect)")
    ap.add_argument("--skip-local", action="store_true", help="skip the in-process local[2] Spark timing")
    ap.add_argument("--s3", action="store_true",
                    help="with --connect: also time the job into S3 (the tests' moto server) against local")
    ap.add_argument("--writers", default="arrow,spark",
                    help="the job's writers to time (arrow: the tasks write Parquet, issue 32; spark: JVM)")
    ap.add_argument("--memory-only", action="store_true",
                    help="only a task's peak memory per range (fresh processes; no Spark, no baseline)")
    ap.add_argument("--memory-rounds", type=int, default=1, help="times each range's memory is measured")
    ap.add_argument("--memory-probe", help=argparse.SUPPRESS)  # one task's work, for memory()
    ap.add_argument("--warm-client", help=argparse.SUPPRESS)  # jobs on one attached session
    args = ap.parse_args()
    if args.memory_probe:
        memory_probe(json.loads(args.memory_probe))
        return 0
    if args.warm_client:
        warm_client(json.loads(args.warm_client))
        return 0
    if args.size < 8:
        raise SystemExit("--size must be >= 8")
    if args.memory_only:
        env = {**os.environ, "STREAMLEDGER_RABBITMQ_URL": args.url}
        work = Path(tempfile.mkdtemp(prefix="spark-read-memory-"))
        stream = memory_stream(args.url, args.name, args.messages, args.size)
        try:
            memory(stream, args.messages, env, work, rounds=args.memory_rounds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            with StreamClient.connect(args.url) as client:
                client.delete_stream(stream, missing_ok=True)
        return 0
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    home = Path(os.environ.get("STREAMLEDGER_HOME", "/var/tmp/streamledger")) / "bench"
    home.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="spark-read-", dir=home))
    try:
        parts, tails = prepare(args.url, args.name, args.messages, args.size)
        expected = sum(tails.values())  # fresh partitions: offsets 0..tail-1 are all user records

        (work / "rstream").mkdir()
        n_base, t_base = baseline(args.url, tails, work / "rstream", args.decode)
        assert n_base == expected, (n_base, expected)
        print(f"rstream baseline : {n_base:,} msgs in {t_base:6.2f}s  -> {n_base / t_base:>10,.0f} msg/s",
              flush=True)

        if args.connect or args.remote:
            connect_bench(args, parts, expected, t_base, work)
        if args.skip_local:
            return 0
        t0 = time.perf_counter()
        from streamledger.spark.session import build_session

        spark = build_session(master="local[2]", app_name="bench-spark-read", quick_start=args.quick_start,
                              conf={"spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        t_start = time.perf_counter() - t0
        try:
            first = json.dumps({parts[0]: [0, 1]})
            _, t_warmup = spark_read(spark, args.url, args.decode, work / "spark-warmup", ranges=first)
            n_spark, t_read = spark_read(spark, args.url, args.decode, work / "spark", superStream=args.name,
                                         splitsPerStream=str(args.splits))
            # The same read again in the same session: JIT-compiled JVM, Python workers running. This is
            # the steady state of a long-lived session; the first read above still pays JVM warm-up.
            n_warm, t_warm = spark_read(spark, args.url, args.decode, work / "spark", superStream=args.name,
                                        splitsPerStream=str(args.splits))
            assert n_warm == expected, (n_warm, expected)
            # A long-lived session has run such reads many times: its JIT has compiled the Arrow ->
            # row -> Parquet path fully, which the second read has not yet (measured in a quiet minute:
            # the third to fifth reads 1.1-1.3x faster than the second). The median of --steady more.
            steady = sorted(
                spark_read(spark, args.url, args.decode, work / "spark", superStream=args.name,
                           splitsPerStream=str(args.splits))[1]
                for _ in range(args.steady)
            )
            t_steady = steady[len(steady) // 2] if steady else t_warm
            # The same again into Spark's noop sink: the data source -> Arrow -> JVM rate without the
            # Parquet encoding (which costs about as much again on a small host).
            _, t_noop = spark_read(spark, args.url, args.decode, work / "spark-noop", fmt="noop",
                                   superStream=args.name, splitsPerStream=str(args.splits))
            # The job itself (run_job: plan, write, manifest) with each writer, twice each, alternating.
            jobs = job_timings(spark, args, parts, work / "job")
        finally:
            spark.stop()
        assert n_spark == expected, (n_spark, expected)
        fixed = t_start + t_warmup
        e2e = fixed + t_read
        print(f"spark session    : {t_start:6.2f}s")
        print(f"spark 1st read   : {t_warmup:6.2f}s (one record: lookup/planner/worker start-up)")
        print(f"spark read       : {n_spark:,} msgs in {t_read:6.2f}s  -> {n_spark / t_read:>10,.0f} msg/s")
        print(f"spark warm read  : {n_warm:,} msgs in {t_warm:6.2f}s  -> {n_warm / t_warm:>10,.0f} msg/s "
              "(second read, same session)")
        print(f"spark warm noop  : {expected:,} msgs in {t_noop:6.2f}s  -> {expected / t_noop:>10,.0f} msg/s "
              "(same read into the noop sink: no Parquet encoding)")
        print(f"spark end to end : {e2e:6.2f}s  -> {expected / e2e:>10,.0f} msg/s; fixed start-up share "
              f"{fixed / e2e:.0%} ({fixed:.1f}s)")
        print(f"ratio rstream time / spark time: end to end {t_base / e2e:.2f}x, "
              f"read alone {t_base / t_read:.2f}x, warm read {t_base / t_warm:.2f}x "
              "(target >= 2x end to end)")
        print(f"spark steady read: {expected:,} msgs in {t_steady:6.2f}s  -> {expected / t_steady:>10,.0f} "
              f"msg/s (median of {args.steady} more reads, same session); ratio {t_base / t_steady:.2f}x")
        for writer, times in jobs.items():
            best = min(times)
            print(f"job {writer:5s} writer: {expected:,} msgs in {best:6.2f}s (best of {len(times)}: "
                  f"{', '.join(f'{t:.2f}' for t in times)})  -> {expected / best:>10,.0f} msg/s; "
                  f"ratio rstream time / job time {t_base / best:.2f}x")
        print(f"warm in-session rate: second read {expected / t_warm:,.0f} msgs/s, steady "
              f"{expected / t_steady:,.0f} msgs/s into Parquet (target >= 1,000,000 msgs/s on local[2]), "
              f"{expected / t_noop:,.0f} msgs/s into noop")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            with StreamClient.connect(args.url) as client:
                client.delete_super_stream(args.name, missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
