"""The table sinks against the directory sink (issue 21): one 1 M-record batch into each, same run.

    PYTHONPATH=src python bench/sinks.py [--records 1000000] [--size 100] [--sinks directory,iceberg,delta]
                                         [--rounds 2] [--audit-ranges 10000] [--per-commit 100]
                                         [--range-records 10]
                                         [--audit-sinks iceberg,delta] [--url URL]

1. **Throughput.** A 2-partition super stream on the local broker is filled once with ``--records``
   AMQP messages of ``--size`` bytes (``StreamClient.publish``, the repo's own producer, as
   bench/spark_read.py fills it). Spark ``local[2]`` is warmed, and each sink's table is created, by
   an untimed batch of a small warm-up stream *into the same table* (so the timed batch is an append,
   as every batch but a table's first is). Then ``--rounds`` rounds of one ``run_batch`` per sink
   (the order rotated each round), each a fresh pipeline reading the same ``--records`` records (one
   range per partition, one Spark job), SQLite ledger; the table shows the medians.
   Printed: wall time, records/s, the ratio of each table sink's throughput to the directory
   sink's (target >= 0.9), the Spark job's share, and the **table commit latency** of the batch
   (the sink's ``publish``: one table commit adding the job's files, timed around the call).
2. **Audit at scale.** ``--audit-ranges`` committed ranges of ``--range-records`` records each are
   put in a table through the ledger and sink API directly, not through Spark (10,000 Spark jobs
   would take hours): batches over ``--per-commit`` partitions, each ``Ledger.claim_many`` -> one
   Parquet file of the job's schema + its ``_manifest.json`` per range -> ``Ledger.commit_many``
   (with the publish leases) -> one ``Sink.publish`` (one table commit) -> ``Ledger.mark_published``
   of each range with the receipt: the calls a batch makes, minus the broker and Spark. Printed:
   the build time, the table commit latency (median / p95 over the commits) and the time of
   ``streamledger.batch.proof.audit`` over the pipeline (the ledger's audit, every published
   directory's manifest, and the table: each range in exactly one commit, row counts per range,
   no duplicate ``(stream, offset)``).

Figures are noisy on a shared 2-core VM; compare within one run.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from streamledger.batch import BatchConfig, LocalSparkRunner, RunId, run_batch, sinks
from streamledger.batch.sinks import choose
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
TABLE_SINKS = ("iceberg", "delta")


class CommitTimer:
    """Wraps the sink a batch builds, timing each ``publish`` (the one table commit of a batch)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._make = choose.make_sink

    def __enter__(self) -> CommitTimer:
        timer = self

        def make(config: BatchConfig, ledger: Ledger) -> Any:
            sink = timer._make(config, ledger)
            publish = sink.publish

            def timed(batch: sinks.SinkBatch) -> dict[int, sinks.SinkReceipt]:
                began = time.perf_counter()
                try:
                    return publish(batch)
                finally:
                    timer.seconds.append(time.perf_counter() - began)

            sink.publish = timed  # type: ignore[method-assign]
            return sink

        choose.make_sink = make
        return self

    def __exit__(self, *exc: object) -> None:
        choose.make_sink = self._make


def fill(client: StreamClient, name: str, records: int, size: int) -> float:
    """A fresh 2-partition super stream holding ``records`` messages; seconds taken."""
    client.create_super_stream(name, partitions=2)
    parts = client.partitions(name)
    payload = os.urandom(size * 4096)
    began = time.perf_counter()
    for k, part in enumerate(parts):
        count = records // 2 + (1 if k < records % 2 else 0)
        bodies = (payload[(i % 4000) * size: (i % 4000) * size + size - 8] + i.to_bytes(8, "little")
                  for i in range(count))
        result = client.publish(part, bodies, batch_size=1000)
        if result.confirmed != count:
            raise SystemExit(f"publish to {part}: {result.confirmed}/{count} confirmed")
    return time.perf_counter() - began


def table_for(sink: str, root: Path) -> str | None:
    """One table per sink, shared by its warm-up and timed batches."""
    return {"iceberg": "bench.events", "delta": str(root / "delta-table")}.get(sink)


def throughput(args: argparse.Namespace, client: StreamClient, runner: LocalSparkRunner, tmp: Path) -> None:
    name = f"bench-sinks-{uuid.uuid4().hex[:6]}"
    warm = f"{name}-warm"
    try:
        took = fill(client, name, args.records, args.size)
        print(f"published {args.records:,} x {args.size} B into {name} (2 partitions) in {took:.1f} s "
              f"({args.records / took:,.0f} msg/s)", flush=True)
        # A tenth of the records: a small warm-up left the JIT cold, and the first large batch ran ~2x
        # slower whichever sink it was (measured).
        fill(client, warm, max(2_000, args.records // 10), args.size)
        began = time.perf_counter()
        runner.session().sparkContext.setLogLevel("ERROR")
        with Ledger(f"sqlite:///{tmp / 'ledger.sqlite'}", create=True) as led:
            for sink in args.sinks:
                cfg = BatchConfig(pipeline=f"warm-{sink}", url=args.url, output_root=str(tmp / sink),
                                  super_stream=warm, sink=sink, table=table_for(sink, tmp))
                run_batch(cfg, run=RunId("bench", f"warm-{sink}", "t"), ledger=led, broker=client,
                          runner=runner)
            print(f"warm-up (Spark session, one batch and the table per sink): "
                  f"{time.perf_counter() - began:.1f} s", flush=True)
            rows: dict[str, list[tuple[float, float, float]]] = {s: [] for s in args.sinks}
            for rnd in range(args.rounds):
                order = args.sinks[rnd % len(args.sinks):] + args.sinks[:rnd % len(args.sinks)]
                for sink in order:  # rotated each round: no sink always pays for going first
                    cfg = BatchConfig(pipeline=f"bench-{sink}-{rnd}", url=args.url,
                                      output_root=str(tmp / sink), super_stream=name, sink=sink,
                                      table=table_for(sink, tmp))
                    marks: dict[str, float] = {}

                    def mark(step: str, _batch: Any, marks: dict[str, float] = marks) -> None:
                        marks[step] = time.perf_counter()

                    with CommitTimer() as timer:
                        began = time.perf_counter()
                        result = run_batch(cfg, run=RunId("bench", f"{sink}-{rnd}", "t"), ledger=led,
                                           broker=client, runner=runner, on_step=mark)
                        wall = time.perf_counter() - began
                    if result.records != args.records:
                        raise SystemExit(f"{sink}: read {result.records} records, not {args.records}")
                    job = marks.get("job", began) - marks.get("probed", marks.get("claimed", began))
                    rows[sink].append((wall, job, sum(timer.seconds)))
                    print(f"  round {rnd + 1} {sink}: {wall:.1f} s", flush=True)
        med = {sink: tuple(statistics.median(r[i] for r in runs) for i in range(3))
               for sink, runs in rows.items()}
        base = med.get("directory")
        print(f"\n1 batch of {args.records:,} records, 2 partitions (one range each), local[2], "
              f"median of {args.rounds} round(s):")
        print(f"  {'sink':<10} {'wall s':>7} {'records/s':>11} {'vs directory':>13} {'job s':>7} "
              f"{'table commit s':>15}")
        for sink, (wall, job, commit_s) in med.items():
            ratio = f"{base[0] / wall:.2f}x" if base is not None else "-"
            commit = f"{commit_s:.3f}" if sink in TABLE_SINKS else "-"
            print(f"  {sink:<10} {wall:>7.1f} {args.records / wall:>11,.0f} {ratio:>13} {job:>7.1f} "
                  f"{commit:>15}")
        print("  (ratio: the sink's records/s over the directory sink's; target >= 0.90x)")
        print("  per round (wall s): " + "; ".join(
            f"{sink} " + " ".join(f"{r[0]:.1f}" for r in runs) for sink, runs in rows.items()))
    finally:
        for s in (name, warm):
            client.delete_super_stream(s, missing_ok=True)


def range_files(final: str, stream: str, start: int, end: int) -> None:
    """One Parquet file of the job's schema for ``[start, end)`` in ``final``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamledger.spark.arrow import ARROW_SCHEMA

    n = end - start
    Path(final).mkdir(parents=True)
    table = pa.table({
        "stream": pa.array([stream] * n), "offset": pa.array(range(start, end), pa.int64()),
        "chunk_timestamp": pa.array([time.time_ns() // 1000] * n, pa.int64()).cast(
            ARROW_SCHEMA.field("chunk_timestamp").type),
        "body": pa.array([b"x" * 16] * n, pa.binary()),
        **{c: pa.array([[]] * n, ARROW_SCHEMA.field(c).type)
           for c in ("properties", "application_properties", "message_annotations")},
    }, schema=ARROW_SCHEMA)
    pq.write_table(table, f"{final}/part-00000.parquet")


def audit_at_scale(sink_name: str, args: argparse.Namespace, tmp: Path) -> None:
    """``--audit-ranges`` committed ranges in a table through the ledger + sink API, then the audit.

    Each round is what one batch over ``--per-commit`` partitions does, minus the broker and Spark:
    ``claim_many`` (one range of ``--range-records`` per partition), the files and manifests,
    ``commit_many`` (with the publish leases), one ``Sink.publish`` (one table commit), and
    ``mark_published`` of each range with the receipt."""
    from streamledger.batch import outputs
    from streamledger.batch.proof import audit
    from streamledger.ledger.types import ClaimRequest, CommitRequest, SourceRef

    root = tmp / f"audit-{sink_name}"
    pipeline, broker = f"audit-{sink_name}", "rabbitmq://bench:5552/"
    streams = [f"events-{i}" for i in range(args.per_commit)]
    sources = [SourceRef(broker, s, "events") for s in streams]
    k = args.range_records
    cfg = BatchConfig(pipeline=pipeline, url="rabbitmq-stream://bench:5552/", output_root=str(root),
                      super_stream="events", sink=sink_name)  # type: ignore[arg-type]
    rounds = -(-args.audit_ranges // args.per_commit)
    with Ledger(f"sqlite:///{root}.sqlite", create=True) as led:
        sink = choose.make_sink(cfg, led)
        began = time.perf_counter()
        commit_s: list[float] = []
        for j in range(rounds):
            run = RunId("bench-audit", f"round-{j}", "t")
            token = run.attempt_token(uuid.uuid4().hex[:8])
            asked = [ClaimRequest(src, (j + 1) * k, initial_start=0) for src in sources]
            claimed = led.claim_many(pipeline, asked, run, max_span=k)
            asks, finals = [], []
            for rng in claimed:
                start, end, stream = rng.start, rng.end, rng.source.stream
                final = sink.range_dir(broker, stream, start, end, 0)
                range_files(final, stream, start, end)
                outputs.write_manifest(final, {
                    "streams": {stream: {"start": start, "end": end, "records": end - start,
                                         "first_offset": start, "last_offset": end - 1}},
                    "pipeline": pipeline, "broker": broker, "range_id": rng.id, "output": final,
                    "files": ["part-00000.parquet"], "format": "parquet"})
                asks.append(CommitRequest(rng.id, end - start, start, end - 1, final, publisher=token))
                finals.append(final)
            done = led.commit_many(asks)
            batch = sinks.SinkBatch(pipeline=pipeline, broker=broker, run=run, attempt=token,
                                    ranges=tuple(sinks.SinkRange(r, f)
                                                 for r, f in zip(done, finals, strict=True)),
                                    output_root=str(root))
            t0 = time.perf_counter()
            receipts = sink.publish(batch)
            commit_s.append(time.perf_counter() - t0)
            for r in done:
                receipt = receipts[r.id]
                led.mark_published(r.id, token, table=(receipt.table, receipt.commit))
            if (j + 1) % 10 == 0:
                print(f"  {sink_name}: {(j + 1) * len(sources):,} ranges in "
                      f"{time.perf_counter() - began:.0f} s", flush=True)
        built = time.perf_counter() - began
        began = time.perf_counter()
        report = audit(led, pipeline)
        took = time.perf_counter() - began
    n = rounds * len(sources)
    p95 = sorted(commit_s)[max(0, math.ceil(len(commit_s) * 0.95) - 1)]
    print(f"\n{sink_name}: {n:,} committed ranges x {k} records ({len(sources)} partitions x {rounds} "
          f"batches, one table commit each), built in {built:.1f} s "
          "(ledger + Parquet + sink API, no Spark)")
    print(f"  table commit latency: median {statistics.median(commit_s):.3f} s, p95 {p95:.3f} s, "
          f"first {commit_s[0]:.3f} s, last {commit_s[-1]:.3f} s ({len(sources)} files per commit)")
    print(f"  audit (ledger + {n:,} directories + the table): {took:.1f} s, "
          f"{'clean' if report.clean else f'{len(report.violations)} violation(s)'}")
    if not report.clean:
        print("\n".join("    " + line for line in report.to_text().splitlines()[:10]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="timed batches per sink (order rotated)")
    parser.add_argument("--sinks", default="directory,iceberg,delta")
    parser.add_argument("--audit-ranges", type=int, default=10_000)
    parser.add_argument("--per-commit", type=int, default=100,
                        help="partitions per batch = ranges per table commit (audit part)")
    parser.add_argument("--range-records", type=int, default=10)
    parser.add_argument("--audit-sinks", default="iceberg,delta", help="'' skips the audit part")
    parser.add_argument("--url", default=os.environ.get("STREAMLEDGER_BENCH_URL", DEFAULT_URL))
    args = parser.parse_args()
    args.sinks = [s for s in args.sinks.split(",") if s]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    tmp = Path(tempfile.mkdtemp(prefix="sl-bench-sinks-"))
    try:
        if args.sinks and args.records:
            runner = LocalSparkRunner("local[2]", conf={"spark.driver.memory": "2g"})
            with StreamClient.connect(args.url, timeout=60.0) as client:
                throughput(args, client, runner, tmp)
        for sink in [s for s in args.audit_sinks.split(",") if s]:
            audit_at_scale(sink, args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
