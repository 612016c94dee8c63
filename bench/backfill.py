"""One backfill of the example DAG under Airflow's real scheduler, with 1 vs N runs at a time.

Why: pinned interval ranges (``bound_by_interval=True``) let ``airflow backfill create
--max-active-runs N`` run intervals in parallel while each run still reads exactly its own
interval's records. This measures what that buys on this machine: the wall time of the same
backfill (same super stream, same intervals) with ``--max-active-runs 1`` and with N.

Setup: a fresh super stream on the local 4.3 broker; ``--intervals`` data intervals of
``--interval-s`` seconds (``STREAMLEDGER_INTERVAL``), each with ``--per-interval`` JSON records
published inside it, and one late wave after the last (data keeps arriving; the last interval's end
is resolvable at once). For each value of ``--max-active-runs`` (in the order given): a fresh Airflow
home and a fresh pipeline (its own SQLite ledger and output root) read the same intervals with the
real api-server, scheduler (LocalExecutor, ``parallelism`` = the largest N), dag-processor and
triggerer (``tests.support.airflow.airflow_components``); ``STREAMLEDGER_END_DATE`` stops the DAG's
own schedule at the last interval, so the backfill's runs are the only ones. Each run is the batch
(on in-process local Spark, or with ``--spark connect`` on a warm Spark Connect server), then the
DAG's audit task. The clock runs from the first run's start to
the last run's end, by Airflow's own timestamps (the backfill is created before the components
start, see ``backfill``). Prints the wall time of each, the ratio, and checks that every variant
committed the same ranges with every published record of the intervals.

Usage: ``python bench/backfill.py [--intervals 24] [--interval-s 5] [--per-interval 60]
[--partitions 3] [--max-active-runs 1,4] [--spark local|connect] [--url URL]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.airflow_interval import start_server  # noqa: E402
from tests.e2e.conftest import connection_json  # noqa: E402
from tests.support.airflow import AirflowHome, airflow_components, make_airflow_home  # noqa: E402

from streamledger.ledger import Ledger  # noqa: E402
from streamledger.protocol.rabbitmq import StreamClient  # noqa: E402

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
DAG_ID = "streamledger_backfill"


def publish(url: str, super_stream: str, t0: int, intervals: int, per_interval: int, interval_s: int) -> int:
    """One wave inside each interval ``[t0 + k*interval_s, ...)`` plus a late one; returns how many
    records the backfilled intervals hold."""
    with StreamClient.connect(url) as client:
        streams = client.partitions(super_stream)
        for k in range(intervals + 1):
            begin = t0 + k * interval_s
            time.sleep(max(0.0, begin + 0.3 - time.time()))
            batch: dict[str, list[bytes]] = {s: [] for s in streams}
            for i in range(per_interval):
                event = k * per_interval + i
                batch[streams[event % len(streams)]].append(json.dumps({"id": event, "interval": k}).encode())
            for stream, bodies in batch.items():
                client.publish(stream, bodies)
            if time.time() > begin + interval_s - 0.3:
                raise SystemExit(f"publishing overran a {interval_s}s interval; raise --interval-s")
    return intervals * per_interval


def runs(af: AirflowHome) -> list[tuple[str, str, str, str]]:
    """``(run_type, state, start_date, end_date)`` of the DAG's runs."""
    with sqlite3.connect(f"file:{af.home / 'airflow.db'}?mode=ro", uri=True, timeout=10) as db:
        rows = db.execute("SELECT run_type, state, start_date, end_date FROM dag_run WHERE dag_id = ?",
                          (DAG_ID,)).fetchall()
    return [(str(t), str(s), str(b), str(e)) for t, s, b, e in rows]


def warm_server(url: str, super_stream: str) -> tuple[str, bool]:
    """A running Spark Connect server (``streamledger spark-server``) whose data-source workers have
    started, the way a long-lived one is: its ``sc://`` URL, and whether this run started it."""
    server, started = start_server()
    warm = (
        "import sys\n"
        "from streamledger.spark.connect import JOB_SESSION_ID, connect_session\n"
        "from streamledger.spark.session import register_source\n"
        "s = connect_session(sys.argv[1], session_id=JOB_SESSION_ID, keep_session=True)\n"
        "register_source(s)\n"
        "s.read.format('rabbitmq_stream').option('url', sys.argv[2]).option('stream', sys.argv[3])"
        ".option('endingOffsets', '0').load().collect(); s.stop()\n"
    )
    subprocess.run([sys.executable, "-c", warm, server, url, f"{super_stream}-0"], check=True)
    return server, started


def prepare(work: Path, url: str, super_stream: str, starts: list[datetime], interval_s: int, active: int,
            parallelism: int, spark: dict[str, str]) -> tuple[AirflowHome, dict[str, str]]:
    """A migrated Airflow home with the DAGs serialized, for one variant."""
    tag = f"m{active}"
    env = {
        **spark,
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": connection_json(url),
        "STREAMLEDGER_SUPER_STREAM": super_stream,
        "STREAMLEDGER_PIPELINE": f"bench-{super_stream}-{tag}",
        "STREAMLEDGER_INTERVAL": f"{interval_s}s",
        "STREAMLEDGER_START_DATE": starts[0].isoformat(),
        "STREAMLEDGER_END_DATE": starts[-1].isoformat(),
        "STREAMLEDGER_LEDGER_URL": f"sqlite:///{work / tag}.sqlite",
        "STREAMLEDGER_OUTPUT_ROOT": str(work / f"out-{tag}"),
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
    }
    af = make_airflow_home(work / f"airflow-{tag}", extra_env=env)
    af.airflow("dags", "reserialize")
    return af, env


def backfill(af: AirflowHome, env: dict[str, str], starts: list[datetime],
             active: int) -> tuple[float, float, list[tuple[str, int, int, int | None]]]:
    """The backfill with ``active`` runs at a time: seconds from the first run's start to the last
    run's end (Airflow's own timestamps), seconds from starting the components to the end, and the
    committed ranges. The backfill is created before the components start: the CLI and a running
    scheduler contend for the SQLite metadata database."""
    af.airflow("backfill", "create", "--dag-id", DAG_ID, "--from-date", starts[0].isoformat(),
               "--to-date", starts[-1].isoformat(), "--max-active-runs", str(active))
    began = time.monotonic()
    with airflow_components(af, env=env):
        af.airflow("dags", "unpause", DAG_ID)  # once the execution API is up
        while True:
            now = runs(af)
            if [r for r in now if r[1] == "failed"]:
                raise SystemExit(f"max_active_runs={active}: a run failed; logs under {af.home / 'logs'}")
            if len(now) == len(starts) and all(r[1] == "success" for r in now):
                break
            time.sleep(1.0)
        total = time.monotonic() - began
    if {r[0] for r in now} != {"backfill"}:
        raise SystemExit(f"runs other than the backfill's: {now}")
    first = min(datetime.fromisoformat(r[2]) for r in now)
    last = max(datetime.fromisoformat(r[3]) for r in now)
    ledger = Ledger(env["STREAMLEDGER_LEDGER_URL"])
    # non-empty only: an empty committed range marks the history's origin when a later interval
    # happened to claim first (with parallel runs), which is bookkeeping, not data
    ranges = sorted((r.source.stream, r.start, r.end, r.records)
                    for r in ledger.ranges(env["STREAMLEDGER_PIPELINE"])
                    if r.status.value == "committed" and not r.empty)
    ledger.close()
    return (last - first).total_seconds(), total, ranges


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--intervals", type=int, default=24)
    ap.add_argument("--interval-s", type=int, default=5)
    ap.add_argument("--per-interval", type=int, default=60)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--max-active-runs", default="1,4", help="comma-separated, measured in this order")
    ap.add_argument("--spark", choices=["local", "connect"], default="local",
                    help="local: in-process local[2] in every task (the DAG's default); connect: a "
                         "warm Spark Connect server (streamledger spark-server; stopped after if this run "
                         "started it)")
    ap.add_argument("--url", default=DEFAULT_URL)
    args = ap.parse_args()
    variants = [int(v) for v in args.max_active_runs.split(",")]

    work = Path(tempfile.mkdtemp(prefix="bench-backfill-", dir=os.environ.get("STREAMLEDGER_HOME")))
    super_stream = f"bench-bf-{uuid.uuid4().hex[:8]}"
    with StreamClient.connect(args.url) as client:
        client.create_super_stream(super_stream, partitions=args.partitions)
    started_server = False
    try:
        t0 = math.ceil(time.time()) + 1
        starts = [datetime.fromtimestamp(t0 + k * args.interval_s, UTC) for k in range(args.intervals)]
        expected: list[int] = []
        publisher = threading.Thread(target=lambda: expected.append(publish(
            args.url, super_stream, t0, args.intervals, args.per_interval, args.interval_s)))
        publisher.start()  # meanwhile, migrate the Airflow homes
        spark: dict[str, str] = {}
        if args.spark == "connect":
            sc, started_server = warm_server(args.url, super_stream)
            server = urlsplit(sc)
            spark = {"STREAMLEDGER_SPARK_CONNECT_CONN_ID": "spark_connect_bench",
                     "AIRFLOW_CONN_SPARK_CONNECT_BENCH": json.dumps(
                         {"conn_type": "spark_connect", "host": server.hostname, "port": server.port})}
        homes = {a: prepare(work, args.url, super_stream, starts, args.interval_s, a, max(variants), spark)
                 for a in variants}
        publisher.join()
        if not expected:
            raise SystemExit("publishing failed")
        print(f"published {args.intervals} intervals x {args.per_interval} records into {super_stream} "
              f"({args.partitions} partitions), work dir {work}", flush=True)
        walls: dict[int, float] = {}
        totals: dict[int, float] = {}
        committed: dict[int, list[tuple[str, int, int, int | None]]] = {}
        for active in variants:
            walls[active], totals[active], committed[active] = backfill(*homes[active], starts, active)
            print(f"--max-active-runs {active}: {args.intervals} intervals in {walls[active]:.1f} s "
                  f"({walls[active] / args.intervals:.1f} s per interval; {totals[active]:.1f} s with the "
                  f"components' start)", flush=True)
        first = committed[variants[0]]
        for active, ranges in committed.items():
            if ranges != first:
                raise SystemExit(f"max_active_runs={active} committed other ranges than {variants[0]}")
            if sum(r[3] or 0 for r in ranges) != expected[0]:
                raise SystemExit(f"max_active_runs={active}: {sum(r[3] or 0 for r in ranges)} records, "
                                 f"expected {expected[0]}")
        base = walls[1] if 1 in walls else walls[variants[0]]
        print(json.dumps({
            "spark": args.spark, "intervals": args.intervals, "interval_s": args.interval_s,
            "records": expected[0],
            "ranges_committed": len(first),
            "wall_s": {str(a): round(w, 1) for a, w in walls.items()},
            "with_components_start_s": {str(a): round(w, 1) for a, w in totals.items()},
            "speedup_vs_1": {str(a): round(base / w, 2) for a, w in walls.items()},
        }, indent=2))
    finally:
        with StreamClient.connect(args.url) as client:
            client.delete_super_stream(super_stream, missing_ok=True)
        if started_server:
            subprocess.run([str(Path(sys.executable).with_name("streamledger")), "spark-server", "stop"],
                           check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
