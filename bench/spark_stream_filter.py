"""Issue 34: what RabbitMQ stream filtering saves under ``filter_value = v``, against a full read of the
same stream in the same run.

Setup: one stream on the local broker (default 200,000 AMQP messages x 100 bytes), published in bursts
of ``--burst`` messages, burst ``k`` carrying application property ``region`` = ``r<k mod regions>``
set as the stream filter value (``publish(filter_property="region")``), so each region's messages sit
in their own chunks. Spark ``local[2]``, one session, a warm-up read; then, alternating, ``--rounds``
times each (best time kept, into Spark's ``noop`` sink):

* in Spark: ``filter_value = 'r0'`` on a read without pushdown (every chunk read, filtered by Spark);
* pushed: the same filter with ``filterPushdown=true`` (the broker skips the other regions' chunks).

Then the chunks and bytes the broker delivered for each (the planned slices read once more through
``read_slice`` with a ``ReadStats``), and the ratios. Noisy on a shared VM: compare within a run.

Usage: ``python bench/spark_stream_filter.py [--messages N] [--size B] [--regions K] [--burst M]
[--rounds R] [--url URL]``
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from streamledger.protocol.rabbitmq import OutboundMessage, ReadStats, StreamClient

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"


def prepare(url: str, name: str, messages: int, size: int, regions: int, burst: int) -> int:
    """(Re)create the stream and fill it; returns the number of messages of region r0."""
    payload = os.urandom(size)
    wanted = 0
    with StreamClient.connect(url) as client:
        client.delete_stream(name, missing_ok=True)
        client.create_stream(name)
        for k in range(messages // burst):
            props = {"region": f"r{k % regions}", "source": "bench"}
            result = client.publish(name, (OutboundMessage(payload, props) for _ in range(burst)),
                                    batch_size=1000, filter_property="region")
            assert result.confirmed == burst, result
            wanted += burst if k % regions == 0 else 0
    print(f"published {messages // burst * burst:,} x {size} B into {name}: {messages // burst} bursts of "
          f"{burst}, {regions} regions, filter value = application property region", flush=True)
    return wanted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=os.environ.get("STREAMLEDGER_RABBITMQ_URL", DEFAULT_URL))
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--regions", type=int, default=10)
    ap.add_argument("--burst", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="bench-stream-filter")
    args = ap.parse_args()

    wanted = prepare(args.url, args.name, args.messages, args.size, args.regions, args.burst)
    from pyspark.sql import functions as F

    from streamledger.spark.datasource import RabbitMQStreamDataSource, read_slice
    from streamledger.spark.session import build_session

    spark = build_session(master="local[2]", app_name="bench-stream-filter",
                          conf={"spark.sql.python.filterPushdown.enabled": "true",
                                "spark.ui.showConsoleProgress": "false"})

    def reader(**options: str) -> Any:
        r = (spark.read.format("rabbitmq_stream").option("url", args.url).option("stream", args.name)
             .option("filterValueProperty", "region"))
        for k, v in options.items():
            r = r.option(k, v)
        return r

    only = F.col("filter_value") == "r0"
    runs: dict[str, Any] = {
        "in Spark": lambda: reader().load().filter(only).write.format("noop").mode("overwrite").save(),
        "pushed": lambda: (reader(filterPushdown="true").load().filter(only)
                           .write.format("noop").mode("overwrite").save()),
    }
    assert reader(filterPushdown="true").load().filter(only).count() == wanted  # and exact
    assert reader().load().filter(only).count() == wanted
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for label, run in runs.items():
            t0 = time.perf_counter()
            run()
            took = time.perf_counter() - t0
            best[label] = min(best.get(label, took), took)

    # what the broker delivered for each read: the reader Spark's planner gets, driven here
    from pyspark.sql.datasource import EqualTo

    schema = reader().load().schema
    delivered: dict[str, ReadStats] = {}
    for label, pushed in (("in Spark", False), ("pushed", True)):
        source = RabbitMQStreamDataSource({"url": args.url, "stream": args.name,
                                           "filterValueProperty": "region",
                                           "filterPushdown": str(pushed).lower()})
        r = source.reader(schema)
        if pushed:
            assert list(r.pushFilters([EqualTo(("filter_value",), "r0")])) == []
        stats = ReadStats()
        rows = sum(b.num_rows for p in r.partitions() for piece in getattr(p, "slices", [p])
                   for b in read_slice(r.options, piece, stats=stats))
        assert rows == (wanted if pushed else args.messages // args.burst * args.burst), rows
        delivered[label] = stats
    for label in runs:
        s = delivered[label]
        print(f"{label:9}: {best[label]:6.2f}s  {s.chunks:>6,} chunks  "
              f"{s.chunk_bytes / 1e6:8.2f} MB delivered  {s.records:>9,} records decoded", flush=True)
    whole, pruned = delivered["in Spark"], delivered["pushed"]
    print(f"stream filtering: time in Spark / pushed = {best['in Spark'] / best['pushed']:.2f}x; "
          f"bytes {whole.chunk_bytes / pruned.chunk_bytes:.2f}x fewer, "
          f"chunks {whole.chunks / pruned.chunks:.2f}x fewer "
          f"({wanted:,} of {args.messages // args.burst * args.burst:,} rows match)")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
