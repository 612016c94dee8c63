"""The streaming source vs the batch source, same records, same run; then micro-batch latency.

1. Fill a 2-partition super stream with N AMQP messages (default 1,000,000 x 100 B).
2. One ``local[2]`` session (start and a one-record warm-up read not timed), then, alternating
   ``--rounds`` times: the batch read (``spark.read`` ``earliest``..``latest`` into Parquet) and the
   same records as a streaming ``Trigger.AvailableNow`` query into a Parquet file sink (start of the
   query to its end, checkpoint included); optionally (``--ledger``) the streaming query again with
   ledger recording on (SQLite), which adds the driver-side count of each range. Ratio = batch time /
   streaming time (>1: streaming is faster).
3. Latency: a publisher process writes ``--rate`` msg/s (each body starts with its publish time, ms,
   big-endian) into a fresh stream for ``--seconds``; a streaming query (trigger as fast as possible)
   writes them into a Parquet file sink and observes min/mean publish time per batch; latency = the
   batch's end (Spark's progress) minus those times: the median over batches of the mean record's
   latency, and the worst record's (batches holding records of the first 3 s are not counted).

Usage: ``python bench/streaming.py [--messages N] [--size B] [--rounds R] [--ledger] [--rate R]
[--seconds S] [--url URL] [--skip-throughput] [--skip-latency]``. Figures are noisy on a shared VM:
compare within one run and print the load average with them.
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


def _publisher(url: str, stream: str, rate: int, seconds: float, size: int, sent_out: Any) -> None:
    """``rate`` msg/s in 20 ms slices; each body starts with its publish time in ms (big-endian)."""
    pad = b"x" * max(0, size - 8)
    step = max(1, rate // 50)
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


def latency(spark: Any, args: Any, work: Path) -> None:
    """Per micro-batch (Spark's progress): the batch's end minus the publish times its records carry,
    observed on the rows as the file sink writes them (``observe``: no second job)."""
    from datetime import datetime

    from pyspark.sql import functions as F

    stream = f"bench-streaming-latency-{os.getpid()}"
    with StreamClient.connect(args.url) as client:
        client.delete_stream(stream, missing_ok=True)
        client.create_stream(stream)
    df = (spark.readStream.format("rabbitmq_stream").option("url", args.url).option("stream", stream)
          .option("startingOffsets", "earliest").load()
          .withColumn("ts", F.conv(F.hex(F.substring("body", 1, 8)), 16, 10).cast("long"))
          .observe("lat", F.min("ts").alias("oldest"), F.avg("ts").alias("mean"), F.count("ts").alias("n")))
    q = (df.writeStream.format("parquet").option("path", str(work / "latency"))
         .option("checkpointLocation", str(work / "latency-checkpoint")).start())
    ctx = multiprocessing.get_context("spawn")
    achieved = ctx.Value("d", 0.0)
    pub = ctx.Process(target=_publisher,
                      args=(args.url, stream, args.rate, args.seconds, args.size, achieved))
    with StreamClient.connect(args.url) as client:  # one record, to wait for a first (cold) batch
        client.publish(stream, [int(time.time() * 1000).to_bytes(8, "big")])
    while not any(p.numInputRows for p in q.recentProgress):
        time.sleep(0.2)
    begin = time.time() + 3.0  # warm-up: batches with records published before this are not counted
    pub.start()
    pub.join()
    time.sleep(5)
    q.stop()
    with StreamClient.connect(args.url) as client:
        client.delete_stream(stream, missing_ok=True)
    means, worst, sizes, took = [], [], [], []
    for p in q.recentProgress:
        m = p.observedMetrics.get("lat") if p.observedMetrics else None
        if m is None or not m["n"]:
            continue
        done = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp() * 1000
        done += p.durationMs.get("triggerExecution", 0)
        if m["oldest"] < begin * 1000:
            continue
        means.append(done - m["mean"])
        worst.append(done - m["oldest"])
        sizes.append(m["n"])
        took.append(p.durationMs.get("triggerExecution", 0))
    if not means:
        print("latency: no batch after the warm-up", flush=True)
        return
    means.sort()
    print(f"latency at {args.rate:,} msg/s asked ({achieved.value:,.0f} achieved) for {args.seconds:.0f}s: "
          f"{len(sizes)} batches, mean {sum(sizes) / len(sizes):,.0f} records, batch time median "
          f"{sorted(took)[len(took) // 2]:,} ms | publish->written: mean per batch median "
          f"{means[len(means) // 2]:,.0f} ms, oldest record max {max(worst):,.0f} ms | "
          f"load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=os.environ.get("STREAMLEDGER_RABBITMQ_URL", DEFAULT_URL))
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ledger", action="store_true")
    ap.add_argument("--rate", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-latency", action="store_true")
    args = ap.parse_args()
    from streamledger.spark.session import build_session

    t0 = time.perf_counter()
    spark = build_session(master="local[2]", conf={"spark.sql.shuffle.partitions": "2",
                                                  "spark.ui.showConsoleProgress": "false"})
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
