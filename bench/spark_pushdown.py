"""Issue 34: what projection and filter pushdown save, against a full read of the same stream in one run.

Setup: one stream on the local 4.3 broker filled with N AMQP messages (default 300,000 x 100 bytes, each
with application properties, so a full read builds a map per record), published in ``--eras`` bursts a
little over a second apart (distinct chunk timestamps). Spark ``local[2]``, one session, a warm-up read;
then, alternating, ``--rounds`` times each (best time kept, into Spark's ``noop`` sink):

* full: every column (the maps are decoded and shipped);
* projected: ``.schema("offset LONG, body BINARY")`` (neither decoded nor shipped);
* ``select("offset", "body")`` on a full read (pyspark 4.2 does not tell a Python source the columns,
  so this costs what the full read costs: shown for honesty);
* window: ``chunk_timestamp`` within one era, with ``filterPushdown=true``, against the same filter on a
  read without pushdown; the offsets planned and their estimated stored bytes are printed for both;
* the per-query fixed cost (issue 44): a read of one offset, a pushed window that keeps nothing (past
  the tail: planned, resolved through the broker, no record read) and Spark's own one-row job.

Prints each time and the ratios (projection target >= 1.5x); the window's ratio also as the median of
each round's own ratio (its two reads run one after the other), which a loaded machine moves less than
the best times. Noisy on a shared VM: compare within a run.

``--splits K`` (issue 44, off by default) adds two labelled rows: both window reads again with
``splitsPerStream=K``, each stream's range read by K tasks instead of one (what a split of the window
over the cores costs and saves when the peer, the full read filtered in Spark, is split the same way).

Usage: ``python bench/spark_pushdown.py [--messages N] [--size B] [--eras K] [--rounds R] [--splits K]
[--url URL] [--name STREAM]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import time
from typing import Any

from streamledger.protocol.rabbitmq import StreamClient

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"


def prepare(url: str, name: str, messages: int, size: int, eras: int) -> list[dt.datetime]:
    """(Re)create the stream and fill it in ``eras`` bursts; returns the instant before each burst."""
    payload = os.urandom(size)
    cuts = []
    with StreamClient.connect(url) as client:
        client.delete_stream(name, missing_ok=True)
        client.create_stream(name)
        per = messages // eras
        for era in range(eras):
            if era:
                time.sleep(1.1)
            cuts.append(dt.datetime.now(dt.UTC))
            time.sleep(0.05)
            result = client.publish(name, (payload for _ in range(per)), batch_size=1000,
                                    application_properties={"era": era, "source": "bench"})
            assert result.confirmed == per, result
        print(f"published {per * eras:,} x {size} B with application properties into {name} in {eras} eras",
              flush=True)
        cuts.append(dt.datetime.now(dt.UTC))
        per_offset = client.bytes_per_offset(name) or 0.0
    print(f"stored bytes per offset (newest chunk): {per_offset:.1f}", flush=True)
    return cuts


def timed(run: Any) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=os.environ.get("STREAMLEDGER_RABBITMQ_URL", DEFAULT_URL))
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--eras", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="bench-pushdown")
    ap.add_argument("--splits", type=int, default=0,
                    help="also both window reads with splitsPerStream=K (K tasks per stream)")
    args = ap.parse_args()

    cuts = prepare(args.url, args.name, args.messages, args.size, args.eras)
    from pyspark.sql import functions as F

    from streamledger.spark.datasource import RabbitMQStreamDataSource
    from streamledger.spark.session import build_session

    spark = build_session(master="local[2]", app_name="bench-spark-pushdown",
                          conf={"spark.sql.python.filterPushdown.enabled": "true",
                                "spark.ui.showConsoleProgress": "false"})

    def reader(**options: str) -> Any:
        r = spark.read.format("rabbitmq_stream").option("url", args.url).option("stream", args.name)
        for k, v in options.items():
            r = r.option(k, v)
        return r

    window = (F.col("chunk_timestamp") >= F.lit(cuts[1])) & (F.col("chunk_timestamp") < F.lit(cuts[2]))
    past_tail = F.col("chunk_timestamp") >= F.lit(cuts[-1] + dt.timedelta(hours=1))
    one_offset = (spark.read.format("rabbitmq_stream").option("url", args.url)
                  .option("ranges", json.dumps({args.name: [0, 1]})))
    runs = {
        "full": lambda: reader().load().write.format("noop").mode("overwrite").save(),
        "projected": lambda: (reader().schema("offset LONG, body BINARY").load()
                              .write.format("noop").mode("overwrite").save()),
        "select on full": lambda: (reader().load().select("offset", "body")
                                   .write.format("noop").mode("overwrite").save()),
        "window, pushed": lambda: (reader(filterPushdown="true").load().filter(window)
                                   .write.format("noop").mode("overwrite").save()),
        "window, in Spark": lambda: (reader().load().filter(window)
                                     .write.format("noop").mode("overwrite").save()),
        "one offset": lambda: one_offset.load().write.format("noop").mode("overwrite").save(),
        "pushed, nothing": lambda: (reader(filterPushdown="true").load().filter(past_tail)
                                    .write.format("noop").mode("overwrite").save()),
        "one-row job": lambda: spark.range(1).write.format("noop").mode("overwrite").save(),
    }
    split = f"{args.splits} slices"
    if args.splits > 1:
        runs[f"window, pushed, {split}"] = lambda: (
            reader(filterPushdown="true", splitsPerStream=str(args.splits)).load().filter(window)
            .write.format("noop").mode("overwrite").save())
        runs[f"window, in Spark, {split}"] = lambda: (
            reader(splitsPerStream=str(args.splits)).load().filter(window)
            .write.format("noop").mode("overwrite").save())
    assert reader().schema("offset LONG").load().count() == (args.messages // args.eras) * args.eras
    # warm-up of the pushed path too: Spark plans it in a Python worker of its own (the pushdown
    # planner), whose first query pays its start and imports (round 1's ratio was ~0.5 without this)
    assert reader(filterPushdown="true").load().filter(past_tail).count() == 0
    best: dict[str, float] = {}
    ratios, split_ratios = [], []
    for _ in range(args.rounds):
        took_now = {}
        for label, run in runs.items():
            took = took_now[label] = timed(run)
            best[label] = min(best.get(label, took), took)
        ratios.append(took_now["window, in Spark"] / took_now["window, pushed"])
        if args.splits > 1:
            split_ratios.append(took_now[f"window, in Spark, {split}"] / took_now[f"window, pushed, {split}"])
    n = (args.messages // args.eras) * args.eras
    for label, took in best.items():
        print(f"{label:17}: {took:6.2f}s  ({n / took:>10,.0f} offsets/s of the stream)", flush=True)
    if args.splits > 1:
        print(f"filter, both reads in {split} per stream: window in Spark / window pushed = "
              f"{best[f'window, in Spark, {split}'] / best[f'window, pushed, {split}']:.2f}x (best times); "
              f"median of the rounds' ratios {statistics.median(split_ratios):.2f}x")
    print(f"projection: full / projected = {best['full'] / best['projected']:.2f}x (target >= 1.5x); "
          f"full / select on full = {best['full'] / best['select on full']:.2f}x")
    print(f"filter: window in Spark / window pushed = "
          f"{best['window, in Spark'] / best['window, pushed']:.2f}x (best times); median of the rounds' "
          f"ratios {statistics.median(ratios):.2f}x ({', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"per-query fixed cost: one-offset read {best['one offset']:.3f}s, pushed window keeping nothing "
          f"{best['pushed, nothing']:.3f}s, Spark's one-row job {best['one-row job']:.3f}s")

    # what each window read planned (the reader Spark's planner gets, driven here)
    from pyspark.sql.datasource import GreaterThanOrEqual, LessThan

    with StreamClient.connect(args.url) as client:
        per_offset = client.bytes_per_offset(args.name) or 0.0
    full_schema = reader().load().schema
    for pushed in (False, True):
        source = RabbitMQStreamDataSource({"url": args.url, "stream": args.name,
                                           "filterPushdown": str(pushed).lower()})
        r = source.reader(full_schema)
        if pushed:
            list(r.pushFilters([GreaterThanOrEqual(("chunk_timestamp",), cuts[1]),
                                LessThan(("chunk_timestamp",), cuts[2])]))
        offsets = sum(piece.end - piece.start for p in r.partitions() for piece in getattr(p, "slices", [p]))
        print(f"window {'pushed' if pushed else 'in Spark'}: {offsets:,} offsets planned, "
              f"~{offsets * per_offset / 1e6:,.1f} MB of chunks read")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
