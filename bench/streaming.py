"""The streaming source vs the batch source, same records, same run; then micro-batch latency.

1. Fill a 2-partition super stream with N AMQP messages (default 1,000,000 x 100 B).
2. One ``local[2]`` session (start and a one-record warm-up read not timed), then, alternating
   ``--rounds`` times: the batch read (``spark.read`` ``earliest``..``latest`` into Parquet) and the
   same records as a streaming ``Trigger.AvailableNow`` query into a Parquet file sink (start of the
   query to its end, checkpoint included); optionally (``--ledger``) the streaming query again with
   ledger recording on (SQLite), which adds the driver-side count of each range. Ratio = batch time /
   streaming time (>1: streaming is faster).
3. Latency: ``--publishers`` processes write ``--rate`` msg/s in all, paced, (each body starts with
   its publish time, ms, big-endian) into a fresh stream for ``--seconds`` while a streaming query
   (``processingTime`` ``--trigger``) writes them into a Parquet file sink. Per record, latency = the
   commit of its micro-batch (the mtime of the checkpoint's commit-log entry) minus its publish time,
   over every record published after a 3 s warm-up: p50 / p95 / max; "kept up" = the latency did
   not grow over the run and everything was committed within ~2 batch intervals of the end.

Usage: ``python bench/streaming.py [--messages N] [--size B] [--rounds R] [--ledger] [--rate R]
[--seconds S] [--publishers P] [--trigger T] [--url URL] [--skip-throughput] [--skip-latency]``.
Figures are noisy on a shared VM: compare within one run and print the load average with them.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from streamledger.protocol.rabbitmq import StreamClient

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"


def prepare(url: str, name: str, messages: int, size: int) -> list[str]:
    payload = os.urandom(size * 4096)
    with StreamClient.connect(url) as client:
        client.delete_super_stream(name, missing_ok=True)
        client.create_super_stream(name, partitions=2)
        parts = client.partitions(name)
        t0 = time.perf_counter()
        for k, part in enumerate(parts):
            count = messages // len(parts) + (1 if k < messages % len(parts) else 0)
            bodies = (payload[(i % 4000) * size:(i % 4000) * size + size] for i in range(count))
            result = client.publish(part, bodies, batch_size=1000)
            if result.confirmed != count:
                raise SystemExit(f"publish to {part}: {result.confirmed}/{count} confirmed")
        took = time.perf_counter() - t0
    print(f"published {messages:,} x {size} B into {name} {parts} in {took:.1f}s", flush=True)
    return parts


def rows(path: Path) -> int:
    return int(pq.ParquetDataset(path).read(columns=["offset"]).num_rows)


def batch_read(spark: Any, url: str, sup: str, out: Path) -> float:
    t0 = time.perf_counter()
    (spark.read.format("rabbitmq_stream").option("url", url).option("superStream", sup)
     .option("startingOffsets", "earliest").option("endingOffsets", "latest").load()
     .write.mode("overwrite").parquet(str(out)))
    return time.perf_counter() - t0


def stream_read(spark: Any, url: str, sup: str, work: Path, **options: str) -> tuple[float, int]:
    shutil.rmtree(work, ignore_errors=True)
    reader = (spark.readStream.format("rabbitmq_stream").option("url", url).option("superStream", sup)
              .option("startingOffsets", "earliest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    t0 = time.perf_counter()
    q = (reader.load().writeStream.format("parquet").option("path", str(work / "out"))
         .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start())
    q.awaitTermination()
    took = time.perf_counter() - t0
    return took, len([p for p in q.recentProgress if p.numInputRows])


def throughput(spark: Any, args: Any, work: Path) -> None:
    sup = f"bench-streaming-{os.getpid()}"
    prepare(args.url, sup, args.messages, args.size)
    spark.read.format("rabbitmq_stream").option("url", args.url).option("superStream", sup) \
        .option("endingOffsets", "1").load().collect()  # warm-up: the Python worker processes
    try:
        for r in range(args.rounds):
            t_batch = batch_read(spark, args.url, sup, work / "batch")
            n_batch = rows(work / "batch")
            t_stream, batches = stream_read(spark, args.url, sup, work / "stream")
            n_stream = rows(work / "stream" / "out")
            line = (f"round {r + 1}: batch {n_batch:,} rows {t_batch:.2f}s ({n_batch / t_batch:,.0f}/s) | "
                    f"availableNow {n_stream:,} rows in {batches} batch(es) {t_stream:.2f}s "
                    f"({n_stream / t_stream:,.0f}/s) | ratio batch/stream {t_batch / t_stream:.2f}")
            if args.ledger:
                ledger = f"sqlite:///{work / f'ledger-{r}.sqlite'}"
                t_led, _ = stream_read(spark, args.url, sup, work / "stream-ledger", ledger=ledger,
                                       pipeline="bench", ledgerOutput=str(work / "ranges"))
                line += f" | with ledger {t_led:.2f}s (ratio {t_batch / t_led:.2f})"
            print(line + f" | load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        with StreamClient.connect(args.url) as client:
            client.delete_super_stream(sup, missing_ok=True)


def _publisher(url: str, stream: str, rate: float, seconds: float, size: int, sent_out: Any) -> None:
    """``rate`` msg/s in 20 ms slices (paced against the clock, so a slow slice is caught up, never
    skipped); each body starts with its publish time in ms (big-endian)."""
    pad = b"x" * max(0, size - 8)
    step = max(1, int(rate) // 50)
    with StreamClient.connect(url) as client:
        t0 = time.monotonic()
        sent = 0
        while time.monotonic() - t0 < seconds:
            due = int((time.monotonic() - t0) * rate)
            if sent >= due:
                time.sleep(0.005)
                continue
            n = min(step, due - sent)
            stamp = int(time.time() * 1000).to_bytes(8, "big")
            client.publish(stream, [stamp + pad] * n, batch_size=500)
            sent += n
        sent_out.value = sent / (time.monotonic() - t0)


def _log_lines(path: Path) -> list[str]:
    """The lines of one Spark metadata log entry after its version line."""
    return [line for line in path.read_text().splitlines()[1:] if line.strip()]


def committed_batches(checkpoint: Path, sink: Path) -> list[tuple[int, float, int, list[str]]]:
    """``(batch, commit time ms, end offset, data files)`` of every committed micro-batch, from the
    checkpoint's commit log (its file's mtime is the commit), its offset log and the file sink's
    metadata log (the session disables log compaction and cleanup so each batch keeps its entry)."""
    import json

    out = []
    for entry in sorted((checkpoint / "commits").iterdir(), key=lambda f: f.name):
        if not entry.name.isdigit():
            continue
        n = int(entry.name)
        commit_ms = entry.stat().st_mtime * 1000
        offset = json.loads(_log_lines(checkpoint / "offsets" / entry.name)[-1])
        end = sum(offset["offsets"].values())
        files = [json.loads(line)["path"].removeprefix("file://")
                 for line in _log_lines(sink / "_spark_metadata" / entry.name)]
        out.append((n, commit_ms, end, files))
    return out


def _pct(sorted_values: Any, q: float) -> float:
    return float(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))])


def latency(spark: Any, args: Any, work: Path) -> None:
    """Publisher processes paced at ``--rate`` msg/s in all for ``--seconds`` while a streaming query
    (``--trigger``) writes into a Parquet file sink; per record, latency = its micro-batch's commit
    (the checkpoint commit log's mtime) minus the publish time its body carries."""
    import numpy as np

    stream = f"bench-streaming-latency-{os.getpid()}"
    with StreamClient.connect(args.url) as client:
        client.delete_stream(stream, missing_ok=True)
        client.create_stream(stream)
    sink, checkpoint = work / "latency", work / "latency-checkpoint"
    writer = (spark.readStream.format("rabbitmq_stream").option("url", args.url).option("stream", stream)
              .option("startingOffsets", "earliest").load()
              .writeStream.format("parquet").option("path", str(sink))
              .option("checkpointLocation", str(checkpoint)))
    q = writer.trigger(processingTime=args.trigger).start()
    ctx = multiprocessing.get_context("spawn")
    achieved = [ctx.Value("d", 0.0) for _ in range(args.publishers)]
    pubs = [ctx.Process(target=_publisher, args=(args.url, stream, args.rate / args.publishers,
                                                 args.seconds, args.size, a)) for a in achieved]
    with StreamClient.connect(args.url) as client:  # one record, to wait for a first (cold) batch
        client.publish(stream, [int(time.time() * 1000).to_bytes(8, "big")])
    while not any(p.numInputRows for p in q.recentProgress):
        time.sleep(0.2)
    begin_ms = (time.time() + 3.0) * 1000  # warm-up: records published before this are not counted
    for pub in pubs:
        pub.start()
    for pub in pubs:
        pub.join()
    stopped_ms = time.time() * 1000
    with StreamClient.connect(args.url) as client:
        tail = int(client.committed_tail(stream))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the query has committed everything published
        done = committed_batches(checkpoint, sink)
        if done and done[-1][2] >= tail:
            break
        time.sleep(0.5)
    q.stop()
    with StreamClient.connect(args.url) as client:
        client.delete_stream(stream, missing_ok=True)
    done = committed_batches(checkpoint, sink)
    lat: list[Any] = []
    sizes, batch_ms = [], []
    previous_commit = None
    for _, commit_ms, _, files in done:
        if files:
            ts = pq.read_table(files, columns=["body"]).column("body").to_pylist()
            stamps = np.array([int.from_bytes(b[:8], "big") for b in ts], dtype=np.float64)
            stamps = stamps[stamps >= begin_ms]
            if len(stamps):
                lat.append(commit_ms - stamps)
                sizes.append(len(stamps))
                if previous_commit is not None:
                    batch_ms.append(commit_ms - previous_commit)
        previous_commit = commit_ms
    rate = sum(a.value for a in achieved)
    if not lat:
        print("latency: no batch after the warm-up", flush=True)
        return
    every = np.sort(np.concatenate(lat))
    third = max(1, len(lat) // 3)
    early, late = np.median(np.concatenate(lat[:third])), np.median(np.concatenate(lat[-third:]))
    drained = [c for _, c, end, _ in done if end >= tail]
    drain_s = (drained[0] - stopped_ms) / 1000 if drained else float("nan")
    gap = float(np.median(batch_ms)) if batch_ms else float("nan")
    # Kept up: the backlog did not grow (records of the last third waited about as long as those of the
    # first third) and everything published was committed within ~2 batch intervals of the end.
    kept_up = bool(drained) and late <= 1.5 * early + 1000 and drain_s * 1000 <= 2 * gap + 1000
    print(f"latency at {args.rate:,} msg/s asked ({rate:,.0f} achieved by {args.publishers} publisher "
          f"process(es)) for {args.seconds:.0f}s, trigger {args.trigger}: {len(sizes)} batches, mean "
          f"{sum(sizes) / len(sizes):,.0f} records, commit interval median {gap:,.0f} ms | publish->commit "
          f"over {len(every):,} records: p50 {_pct(every, 0.5):,.0f} ms, p95 {_pct(every, 0.95):,.0f} ms, "
          f"max {every[-1]:,.0f} ms | p50 first third {early:,.0f} ms, last third {late:,.0f} ms | "
          f"all committed {drain_s:.1f}s after the publishers stopped | "
          f"kept up: {'yes' if kept_up else 'no'} | load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=os.environ.get("STREAMLEDGER_RABBITMQ_URL", DEFAULT_URL))
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ledger", action="store_true")
    ap.add_argument("--rate", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--publishers", type=int, default=2, help="publisher processes sharing --rate")
    ap.add_argument("--trigger", default="500 milliseconds", help="the latency query's processingTime")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-latency", action="store_true")
    args = ap.parse_args()
    from streamledger.spark.session import build_session

    t0 = time.perf_counter()
    spark = build_session(master="local[2]", conf={
        "spark.sql.shuffle.partitions": "2", "spark.ui.showConsoleProgress": "false",
        # the source's driver-side Python worker may take > 15 s to start on an oversubscribed host
        "spark.python.authenticate.socketTimeout": "120s",
        # the latency part reads each batch's entry of the commit, offset and file-sink logs
        "spark.sql.streaming.minBatchesToRetain": "100000",
        "spark.sql.streaming.fileSink.log.compactInterval": "100000",
        "spark.sql.streaming.fileSink.log.cleanupDelay": "100000000"})
    spark.sparkContext.setLogLevel("ERROR")
    print(f"session {time.perf_counter() - t0:.1f}s | load {os.getloadavg()[0]:.1f}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-streaming-"))
    try:
        if not args.skip_throughput:
            throughput(spark, args, work)
        if not args.skip_latency:
            latency(spark, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
