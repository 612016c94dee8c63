"""One Airflow backfill interval (``airflow dags test streamledger_backfill``) with in-process local
Spark vs a warm Spark Connect server, the same intervals of the same super stream, in the same run.

Why: with local Spark every task process starts a JVM and Spark's Python workers before its first
record; a warm Connect server pays that once, so each task only opens a gRPC session. This measures
what a user sees per interval: the whole ``dags test`` process (DAG parse, the read task, the audit).

Setup: a fresh 3-partition super stream on the local 4.3 broker; ``--intervals`` data intervals of
``--interval-s`` seconds, each with ``--per-interval`` AMQP messages of ``--size`` bytes published inside
it (chunk timestamps are the broker's clock, so intervals need real time). Two pipelines read the same
intervals, each with its own ledger and output: ``local`` (``local[2]`` in the task process) and
``connect`` (the DAG's ``STREAMLEDGER_SPARK_CONNECT_CONN_ID``, a ``spark_connect`` connection to
``streamledger spark-server start``, started and warmed before the timing). For each interval the two
``dags test`` runs alternate, so both see the same machine load. Prints seconds per interval, the
ratio local / connect and checks that both pipelines committed the same ranges.

Usage: ``python bench/airflow_interval.py [--intervals 3] [--per-interval 100000] [--size 100]
[--interval-s 8] [--url URL] [--keep-server]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.airflow import make_airflow_home  # noqa: E402

from streamledger.ledger import Ledger  # noqa: E402
from streamledger.protocol.rabbitmq import StreamClient  # noqa: E402

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
STREAMLEDGER = Path(sys.executable).with_name("streamledger")


def connection(url: str) -> str:
    parts = urlsplit(url)
    return json.dumps({
        "conn_type": "rabbitmq_stream", "host": parts.hostname, "port": parts.port or 5552,
        "login": unquote(parts.username or "guest"), "password": unquote(parts.password or "guest"),
        "schema": "/" if parts.path in ("", "/") else unquote(parts.path[1:]),
    })


def publish(url: str, super_stream: str, intervals: int, per_interval: int, size: int,
            interval_s: int) -> list[datetime]:
    """Publish one wave inside each interval; returns the interval ends (the logical dates)."""
    payload = os.urandom(size)
    ends = []
    with StreamClient.connect(url) as client:
        streams = client.partitions(super_stream)
        t0 = math.ceil(time.time()) + 1
        for k in range(intervals):
            begin = t0 + k * interval_s
            time.sleep(max(0.0, begin + 0.2 - time.time()))
            share = per_interval // len(streams)
            for s in streams:
                done = 0
                while done < share:
                    n = min(50_000, share - done)
                    client.publish(s, [payload] * n)
                    done += n
            if time.time() > begin + interval_s - 0.2:
                raise SystemExit(f"publishing {per_interval} messages overran a {interval_s}s interval; "
                                 "raise --interval-s")
            ends.append(datetime.fromtimestamp(begin + interval_s, UTC))
        time.sleep(max(0.0, t0 + intervals * interval_s - time.time()))
    return ends


def start_server() -> tuple[str, bool]:
    """The warm server's sc:// URL, and whether this run started it."""
    status = subprocess.run([str(STREAMLEDGER), "spark-server", "status"], capture_output=True, text=True)
    was_running = status.returncode == 0
    out = subprocess.run([str(STREAMLEDGER), "spark-server", "start"], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().splitlines()[-1], not was_running


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--intervals", type=int, default=3)
    ap.add_argument("--per-interval", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--interval-s", type=int, default=8)
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--keep-server", action="store_true", help="leave a server this run started running")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-airflow-", dir=os.environ.get("STREAMLEDGER_HOME")))
    af = make_airflow_home(work / "airflow")
    super_stream = f"bench-af-{uuid.uuid4().hex[:8]}"
    with StreamClient.connect(args.url) as client:
        client.create_super_stream(super_stream, partitions=3)

    began = time.monotonic()
    server, started = start_server()
    host, port = urlsplit(server).hostname, urlsplit(server).port
    # Warm the server the way a long-lived one is: its first Python data-source read starts the
    # planner and worker processes (a plain range() query starts none).
    warm = (
        "import sys\n"
        "from streamledger.spark.connect import JOB_SESSION_ID, connect_session\n"
        "from streamledger.spark.session import register_source\n"
        "s = connect_session(sys.argv[1], session_id=JOB_SESSION_ID, keep_session=True)\n"
        "register_source(s)\n"
        "s.read.format('rabbitmq_stream').option('url', sys.argv[2]).option('stream', sys.argv[3])"
        ".option('endingOffsets', '0').load().collect(); s.stop()\n"
    )
    subprocess.run([sys.executable, "-c", warm, server, args.url, f"{super_stream}-0"], check=True)
    print(f"Connect server {server} ready ({'started' if started else 'reused'}, "
          f"{time.monotonic() - began:.1f} s)", flush=True)

    try:
        ends = publish(args.url, super_stream, args.intervals, args.per_interval, args.size, args.interval_s)
        print(f"published {args.intervals} x {args.per_interval} x {args.size} B into {super_stream}",
              flush=True)
        modes = {
            "local": {},
            "connect": {
                "STREAMLEDGER_SPARK_CONNECT_CONN_ID": "spark_connect_bench",
                "AIRFLOW_CONN_SPARK_CONNECT_BENCH": json.dumps(
                    {"conn_type": "spark_connect", "host": host, "port": port}),
            },
        }
        rows = []
        for k, end in enumerate(ends):
            row: dict[str, float] = {}
            for mode, extra in modes.items():
                env = {
                    "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": connection(args.url),
                    "STREAMLEDGER_SUPER_STREAM": super_stream,
                    "STREAMLEDGER_PIPELINE": f"bench-{mode}",
                    "STREAMLEDGER_INTERVAL": f"{args.interval_s}s",
                    "STREAMLEDGER_LEDGER_URL": f"sqlite:///{work}/{mode}.sqlite",
                    "STREAMLEDGER_OUTPUT_ROOT": str(work / f"out-{mode}"),
                    **extra,
                }
                t = time.monotonic()
                proc = af.dags_test("streamledger_backfill", end.isoformat(), env=env)
                row[mode] = time.monotonic() - t
                (work / f"dags-test-{mode}-{k + 1}.log").write_text(proc.stdout)
            rows.append(row)
            print(f"interval {k + 1}: local {row['local']:.1f} s, connect {row['connect']:.1f} s, "
                  f"local/connect {row['local'] / row['connect']:.2f}x", flush=True)

        ranges = {}
        for mode in modes:
            ledger = Ledger(f"sqlite:///{work}/{mode}.sqlite")
            ranges[mode] = sorted((r.source.stream, r.start, r.end, r.records, r.status.value)
                                  for r in ledger.ranges(f"bench-{mode}"))
            ledger.close()
        if ranges["local"] != ranges["connect"]:
            raise SystemExit(f"the two pipelines committed different ranges:\n{ranges}")
        records = sum(r[3] or 0 for r in ranges["local"])
        local = sum(r["local"] for r in rows)
        connect = sum(r["connect"] for r in rows)
        print(f"dags test logs: {work}/dags-test-*.log")
        print(json.dumps({
            "intervals": args.intervals, "records_per_pipeline": records,
            "ranges_committed_per_pipeline": len(ranges["local"]),
            "dags_test_s_local": [round(r["local"], 1) for r in rows],
            "dags_test_s_connect": [round(r["connect"], 1) for r in rows],
            "mean_s_local": round(local / len(rows), 1), "mean_s_connect": round(connect / len(rows), 1),
            "ratio_local_over_connect": round(local / connect, 2),
        }, indent=2))
    finally:
        with StreamClient.connect(args.url) as client:
            client.delete_super_stream(super_stream, missing_ok=True)
        if started and not args.keep_server:
            subprocess.run([str(STREAMLEDGER), "spark-server", "stop"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
