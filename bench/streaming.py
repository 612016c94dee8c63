"""The streaming source vs the batch source, same records, same run; then micro-batch latency.

1. Fill a 2-partition super stream with N AMQP messages (default 1,000,000 x 100 B).
2. One ``local[2]`` session (start and a one-record warm-up read not timed), then, alternating
   ``--rounds`` times: the batch read (``spark.read`` ``earliest``..``latest`` into Parquet) and the
   same records as a streaming ``Trigger.AvailableNow`` query into a Parquet file sink (start of the
   query to its end, checkpoint included); optionally (``--ledger``) the streaming query again with
   ledger recording on (SQLite), which adds the driver-side count of each range. Ratio = batch time /
   streaming time (>1: streaming is faster).
3. Latency: a publisher process writes ``--rate`` msg/s (each body starts with its publish time, ms,
   big-endian) into a fresh stream for ``--seconds``; a streaming query (trigger as fast as possible,
   ``foreachBatch`` writing Parquet) reports, per record, the time from publish to its batch's write
   having finished; printed as p50 / p95 / max over the run (the first 3 s are warm-up, not counted).

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


def _publisher(url: str, stream: str, rate: int, seconds: float, size: int) -> None:
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


def latency(spark: Any, args: Any, work: Path) -> None:
    from pyspark.sql import functions as F

    stream = f"bench-streaming-latency-{os.getpid()}"
    with StreamClient.connect(args.url) as client:
        client.delete_stream(stream, missing_ok=True)
        client.create_stream(stream)
    lats: list[float] = []
    sizes: list[int] = []
    begin = time.time() + 3.0

    def each(df: Any, batch_id: int) -> None:
        df = df.select(F.conv(F.hex(F.substring("body", 1, 8)), 16, 10).cast("long").alias("ts")).persist()
        df.write.mode("append").parquet(str(work / "latency"))
        done = time.time() * 1000
        stamps = [r["ts"] for r in df.collect()]
        df.unpersist()
        if stamps and min(stamps) >= begin * 1000:
            lats.extend(done - s for s in stamps)
            sizes.append(len(stamps))

    q = (spark.readStream.format("rabbitmq_stream").option("url", args.url).option("stream", stream)
         .option("startingOffsets", "earliest").load().writeStream.foreachBatch(each)
         .option("checkpointLocation", str(work / "latency-checkpoint")).start())
    pub = multiprocessing.get_context("spawn").Process(
        target=_publisher, args=(args.url, stream, args.rate, args.seconds, args.size))
    pub.start()
    pub.join()
    time.sleep(3)
    q.stop()
    with StreamClient.connect(args.url) as client:
        client.delete_stream(stream, missing_ok=True)
    if not lats:
        print("latency: no batch after the warm-up", flush=True)
        return
    lats.sort()
    pick = lambda f: lats[min(len(lats) - 1, int(f * len(lats)))]  # noqa: E731
    print(f"latency at {args.rate:,} msg/s for {args.seconds:.0f}s: {len(lats):,} records in {len(sizes)} "
          f"batches (mean {sum(sizes) / len(sizes):,.0f} per batch): p50 {pick(0.5):,.0f} ms, p95 "
          f"{pick(0.95):,.0f} ms, max {lats[-1]:,.0f} ms | load {os.getloadavg()[0]:.1f}", flush=True)


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
