"""A batch's cost per partition: ``run_batch`` over super streams of N partitions x 10 records.

    PYTHONPATH=src python bench/partitions.py [--partitions 3,30,100] [--ledgers sqlite,postgres]
                                              [--rounds 2] [--idle 2] [--url URL] [--calls] [--keep]
                                              [--profile PREFIX]

For every partition count and ledger (SQLite file; PostgreSQL from ``scripts/postgres.sh``, a fresh
database per round), each round creates a fresh super stream of N partitions, publishes 10 AMQP
records into each, then runs the **first batch** (claims, reads and publishes all N x 10 records)
and ``--idle`` **idle batches** (nothing new) with ``run_batch``, local Spark ``local[2]`` (the JVM
and the Python workers are warmed first with an untimed batch), directory outputs.

The first idle batch after the first batch (``idle-1``: it finds the tracking chunk the first batch's
StoreOffset wrote in every partition, probes it for user records and commits it) is reported apart from
the later ones (``idle``, nothing to probe), so a median of all idle batches cannot hide it.

The time of each batch is split by step from the batch's ``on_step`` marks (perf counter at each):
``plan`` (broker partitions, tails, stored offsets, the ledger's position per source), ``claim``,
``probe`` (ranges holding only tracking chunks), ``job`` (the Spark job), ``verify`` (manifest
checks, per-range manifests), ``commit``, ``publish``, ``store`` (StoreOffset + read back). The
table prints medians over the rounds; broker and ledger calls per batch are counted through thin
proxies (counts only, no timing inside them), and ``(broker writes)`` counts the driver's writes to
the broker (a pipelined round of requests is one): round trips, which do not move with the load.
The per-partition questions to the broker (fingerprint check, probe of tracking-only ranges,
fingerprints at commit) are one call each for all partitions (``chunks_at``, ``user_records_many``):
a call count that grows with N is a regression. ``--writers`` times the job's Arrow writer (issue 32) and
the JVM writer in the same run, on the same warm session. Targets (issues 32 and 44, printed, not
asserted): 100 partitions <= 2 s first batch, 1,000 partitions <= 10 s; every idle batch <= 0.5 s (the
worst of each kind is printed).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from ledger import pg_database, pg_server  # noqa: E402  (bench/ledger.py: the private cluster)

from streamledger.batch import BatchConfig, LocalSparkRunner, RunId, run_batch  # noqa: E402
from streamledger.ledger import Ledger  # noqa: E402
from streamledger.protocol.rabbitmq import StreamClient  # noqa: E402
from streamledger.protocol.rabbitmq.connection import Connection  # noqa: E402

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
RECORDS = 10
BATCHES = ("first", "idle-1", "idle")  # the first idle batch after a data batch, then the later ones
STEPS = ("plan", "claim", "probe", "job", "verify", "commit", "publish", "store")
# on_step mark -> the step that ended there (time since the previous mark)
MARKS = {"planned": "plan", "claimed": "claim", "probed": "probe", "job": "job", "read": "verify",
         "committed": "commit", "published": "publish", "stored": "store"}


class Counting:
    """A proxy that counts the calls made through it (per method name)."""

    def __init__(self, inner: Any, counts: collections.Counter[str]) -> None:
        self._inner, self._counts = inner, counts

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value):
            return value
        counts = self._counts

        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return value(*args, **kwargs)

        return call


def _tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of process ``root`` and its live descendants, plus what its
    waited-for children used (``cutime``/``cstime``): the Spark JVM and its Python workers."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stats[int(entry)] = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [p for p, st in stats.items() if int(st[1]) == pid and p not in tree]
    total = 0
    for pid in tree:
        st = stats.get(pid)
        if st is not None:  # fields 14-17 (utime stime cutime cstime) are st[11:15] after the name
            total += int(st[11]) + int(st[12]) + (int(st[13]) + int(st[14]) if pid == root else 0)
    return total / tick


def spark_pid(runner: LocalSparkRunner) -> int | None:
    """The Spark JVM's process id (the local py4j gateway's child), if it can be found."""
    proc = getattr(runner.session().sparkContext._gateway, "proc", None)
    return getattr(proc, "pid", None)


def timed_batch(cfg: BatchConfig, run: RunId, ledger: Ledger, broker: StreamClient,
                runner: LocalSparkRunner) -> tuple[float, float, float, dict[str, float], dict[str, int],
                                                   int]:
    """One ``run_batch``: (wall s, driver CPU s, Spark CPU s, seconds per step, calls per broker/ledger
    method, records).

    Driver CPU is this process's time (``time.process_time``: the batch's Python and its threads);
    Spark CPU the JVM's and its Python workers' (``/proc``). On a shared machine CPU time moves far
    less than wall time with the load."""
    jvm = spark_pid(runner)
    spark_cpu = _tree_cpu(jvm) if jvm else 0.0
    steps: dict[str, float] = dict.fromkeys(STEPS, 0.0)
    calls: collections.Counter[str] = collections.Counter()
    last = [0.0]

    def mark(name: str, _batch: Any) -> None:
        now = time.perf_counter()
        step = MARKS.get(name)
        if step is not None:
            steps[step] += now - last[0]
        last[0] = now

    cpu = time.process_time()
    last[0] = began = time.perf_counter()
    send = Connection.send

    def counted(conn: Connection, frame: bytes | bytearray | memoryview) -> None:
        # the driver's writes to the broker: a pipelined round of requests is one
        calls["(broker writes)"] += 1
        send(conn, frame)

    Connection.send = counted  # type: ignore[method-assign,assignment]
    try:
        result = run_batch(cfg, run=run, ledger=Counting(ledger, calls),  # type: ignore[arg-type]
                           broker=Counting(broker, calls), runner=runner, on_step=mark)
    finally:
        Connection.send = send  # type: ignore[method-assign]
    wall = time.perf_counter() - began
    spark = (_tree_cpu(jvm) - spark_cpu) if jvm else 0.0
    return wall, time.process_time() - cpu, spark, steps, dict(calls), result.records


def fill(client: StreamClient, name: str, partitions: int) -> float:
    """A fresh super stream of ``partitions`` partitions with RECORDS records each; seconds taken."""
    began = time.perf_counter()
    client.create_super_stream(name, partitions=partitions)
    for part in client.partitions(name):
        result = client.publish(part, (f"{part}:{i}".encode() for i in range(RECORDS)))
        if result.confirmed != RECORDS:
            raise SystemExit(f"publish to {part}: {result.confirmed}/{RECORDS} confirmed")
    return time.perf_counter() - began


def ledger_url(kind: str, tmp: Path, server: Callable[[], str]) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / f'ledger-{uuid.uuid4().hex[:8]}.sqlite'}"
    return pg_database(server(), f"sl_bench_parts_{uuid.uuid4().hex[:10]}", fresh=True)


def drop_pg(url: str) -> None:
    import psycopg

    admin, name = url.rsplit("/", 1)
    with psycopg.connect(admin.replace("postgresql+psycopg://", "postgresql://", 1) + "/postgres",
                         autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


Row = tuple[int, str, str, float, float, float, dict[str, float], dict[str, int]]


def kept(client: StreamClient, name: str, partitions: int) -> bool:
    """Whether a kept super stream of ``partitions`` partitions is there already (``--keep``)."""
    try:
        return len(client.partitions(name)) == partitions
    except Exception:  # not there: filled afresh
        return False


class WriterRunner(LocalSparkRunner):
    """The local runner with the job's writer chosen (``arrow``: the tasks write Parquet with pyarrow,
    issue 32; ``spark``: the JVM's writer), so both are timed in one run on one warm session."""

    writer: str | None = None

    def __call__(self, *, url: str, ranges: Any, output: str, fmt: str, splits: int) -> Any:
        from streamledger.spark.job import run_job

        with self.tagged():
            return run_job(self.session(), url=url, ranges=dict(ranges), output=output, fmt=fmt,
                           splits=splits, writer=self.writer)


def one_round(n: int, kind: str, url: str, args: argparse.Namespace, name: str, out: Path,
              client: StreamClient, runner: LocalSparkRunner, pipeline: str = "bench") -> list[Row]:
    """The first batch over a freshly filled super stream, then ``args.idle`` idle batches."""
    rows: list[Row] = []
    with Ledger(url, create=True) as led:
        cfg = BatchConfig(pipeline=pipeline, url=args.url, output_root=str(out), super_stream=name)
        for i in range(1 + args.idle):
            batch = BATCHES[min(i, 2)]
            run = RunId("bench", f"{batch}-{i}", "t")
            prof = cProfile.Profile() if args.profile and batch == "idle-1" else None
            if prof is not None:
                prof.enable()
            wall, cpu, spark, steps, calls, records = timed_batch(cfg, run, led, client, runner)
            if prof is not None:
                prof.disable()
                prof.dump_stats(f"{args.profile}.{n}.{kind.replace('/', '-')}.{len(rows)}")
            want = n * RECORDS if i == 0 else 0
            if records != want:
                raise SystemExit(f"{name}: {batch} batch read {records} records, not {want}")
            rows.append((n, kind, batch, wall, cpu, spark, steps, calls))
            print(f"  N={n} {kind}: {batch} batch {wall:.2f} s (CPU: driver {cpu:.2f} s, Spark "
                  f"{spark:.2f} s; load {os.getloadavg()[0]:.1f})", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="3,30,100")
    parser.add_argument("--ledgers", default="sqlite,postgres")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle", type=int, default=2, help="idle batches after each first batch")
    parser.add_argument("--url", default=os.environ.get("STREAMLEDGER_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--calls", action="store_true", help="print broker/ledger calls per batch")
    parser.add_argument("--writers", default="arrow,spark",
                        help="the job's writers to time, each in every round (arrow: issue 32; spark: JVM)")
    parser.add_argument("--profile", metavar="PREFIX",
                        help="cProfile each first idle batch (idle-1) into PREFIX.<N>.<kind>.<row>")
    parser.add_argument("--keep", action="store_true",
                        help="keep the super streams (bench-parts-keep-N) and reuse them in later runs: "
                             "a fresh pipeline name per round reads them from the start")
    args = parser.parse_args()
    counts = [int(x) for x in args.partitions.split(",")]
    ledgers = args.ledgers.split(",")
    writers = args.writers.split(",")
    kinds = [f"{k}/{w}" for k in ledgers for w in writers]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    tmp = Path(tempfile.mkdtemp(prefix="sl-bench-parts-"))
    server_url: list[str] = []

    def server() -> str:
        if not server_url:
            server_url.append(pg_server())
        return server_url[0]

    runner = WriterRunner("local[2]", conf={"spark.driver.memory": "2g"})
    client = StreamClient.connect(args.url, timeout=60.0)
    made: list[str] = []
    rows: list[Row] = []
    try:
        began = time.perf_counter()
        runner.session().sparkContext.setLogLevel("ERROR")
        warm = f"bench-parts-warm-{uuid.uuid4().hex[:6]}"
        made.append(warm)
        fill(client, warm, 3)
        with Ledger(ledger_url("sqlite", tmp, server), create=True) as led:
            cfg = BatchConfig(pipeline="bench", url=args.url, output_root=str(tmp / "warm"),
                              super_stream=warm)
            for i in range(2 * len(writers)):
                runner.writer = writers[i % len(writers)]
                run_batch(cfg, run=RunId("bench", f"warm-{i}", "t"), ledger=led, broker=client, runner=runner)
        print(f"warm-up (Spark session + 2 batches): {time.perf_counter() - began:.1f} s", flush=True)
        for n in counts:
            for kind in kinds:
                ledger_kind, runner.writer = kind.split("/")
                for rnd in range(args.rounds):
                    name = f"bench-parts-keep-{n}" if args.keep else f"bench-parts-{n}-{uuid.uuid4().hex[:6]}"
                    if not args.keep:
                        made.append(name)
                    if not (args.keep and kept(client, name, n)):
                        took = fill(client, name, n)
                        print(f"  N={n} {kind} round {rnd + 1}: super stream filled in {took:.1f} s",
                              flush=True)
                    url = ledger_url(ledger_kind, tmp, server)
                    pipeline = f"bench-{uuid.uuid4().hex[:6]}" if args.keep else "bench"
                    try:
                        rows += one_round(n, kind, url, args, name, tmp / name, client, runner, pipeline)
                    finally:
                        if ledger_kind == "postgres":
                            drop_pg(url)
                        shutil.rmtree(tmp / name, ignore_errors=True)
                        if not args.keep:
                            client.delete_super_stream(name, missing_ok=True)
                            made.remove(name)
        report(rows, counts, kinds, args.calls)
    finally:
        for name in made:
            try:
                client.delete_super_stream(name, missing_ok=True)
            except Exception as exc:  # clean-up is best effort
                print(f"could not delete {name}: {exc}", file=sys.stderr)
        client.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(rows: list[Row], counts: list[int], kinds: list[str], show_calls: bool) -> None:
    """Medians per (partitions, ledger, batch): wall, per partition, and the split by step."""
    print()
    print("| partitions | ledger/writer | batch | wall | per partition | driver CPU | Spark CPU | "
          + " | ".join(STEPS) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(STEPS))
    walls: dict[tuple[int, str, str], float] = {}
    for n in counts:
        for kind in kinds:
            for batch in BATCHES:
                mine = [r for r in rows if r[:3] == (n, kind, batch)]
                if not mine:
                    continue
                wall = median([r[3] for r in mine])
                walls[(n, kind, batch)] = wall
                cpu, spark = median([r[4] for r in mine]), median([r[5] for r in mine])
                split = " | ".join(f"{median([r[6][s] for r in mine]):.2f}" for s in STEPS)
                print(f"| {n} | {kind} | {batch} | {wall:.2f} s | {wall / n * 1000:,.0f} ms | {cpu:.2f} s "
                      f"| {spark:.2f} s | {split} |")
                if show_calls:
                    calls = mine[-1][7]
                    print("    calls: " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
    print()
    for kind in kinds:
        for n in (100, 1000):
            first = walls.get((n, kind, "first"))
            if first is None:
                continue
            goal = 2 if n == 100 else 10
            line = (f"targets ({kind}): {n:,} partitions first batch {first:.2f} s (<= {goal} s: "
                    f"{'met' if first <= goal else 'not met'})")
            for batch in ("idle-1", "idle"):  # every idle batch <= 0.5 s: the worst one counts
                worst = max((r[3] for r in rows if r[:3] == (n, kind, batch)), default=None)
                if worst is not None:
                    met = "met" if worst <= 0.5 else "not met"
                    line += f", {batch} worst {worst:.2f} s (<= 0.5 s: {met})"
            print(line)

if __name__ == "__main__":
    raise SystemExit(main())
