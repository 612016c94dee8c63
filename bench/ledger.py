"""Ledger benchmark: claim+commit latency (SQLite, PostgreSQL) and the audit of 1,000,000 ranges.

    .venv/bin/python bench/ledger.py [--pairs 500] [--sources 1000] [--ranges-per-source 1000]

* latency: one process claims and commits ``--pairs`` consecutive ranges of one source (two
  transactions each, durable commits) and prints p50/p99 of the pair, after a short warm-up;
* audit: bulk-loads ``sources x ranges-per-source`` committed ranges into a PostgreSQL database
  (COPY; the contiguity trigger is disabled during the load only, the exclusion constraint stays
  on) and times ``Ledger.audit()`` over all of them (best and median of 3). The loaded database is
  kept (``sl_bench_audit``) and reused by the next run.

Targets (issue 3): p50 claim+commit < 5 ms on both dialects; audit of 1M ranges < 2 s on PostgreSQL.
PostgreSQL is the private cluster of ``scripts/postgres.sh`` (started if needed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from streamledger.ledger import Ledger, RunIdentity, SourceRef

REPO = Path(__file__).resolve().parents[1]
HOME = Path(os.environ.get("STREAMLEDGER_HOME", "/var/tmp/streamledger"))
AUDIT_DB = "sl_bench_audit"


def pg_server() -> str:
    out = subprocess.run(
        [str(REPO / "scripts" / "postgres.sh"), "start"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def pg_database(server: str, name: str, *, fresh: bool) -> str:
    import psycopg

    dsn = server.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists and fresh:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            exists = None
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    return server.rsplit("/", 1)[0] + f"/{name}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency(url: str, label: str, pairs: int) -> None:
    ledger = Ledger(url, create=True)
    src = SourceRef("rabbitmq://127.0.0.1:5552/", f"bench-{time.time_ns()}")
    timings: list[float] = []
    claim_t: list[float] = []
    cpu = 0.0
    for i in range(pairs + 20):
        c0 = time.process_time()
        run = RunIdentity("bench", f"run-{i}", "read")
        t0 = time.perf_counter()
        r = ledger.claim("bench", src, (i + 1) * 100, run, initial_start=0)
        t1 = time.perf_counter()
        ledger.commit(r.id, records=100, first_seen=r.start, last_seen=r.end - 1, output=None)
        t2 = time.perf_counter()
        if i >= 20:
            cpu += time.process_time() - c0
            timings.append((t2 - t0) * 1000)
            claim_t.append((t1 - t0) * 1000)
    ledger.close()
    print(
        f"{label:<11} claim+commit p50 {statistics.median(timings):6.2f} ms  "
        f"p99 {percentile(timings, 0.99):6.2f} ms  "
        f"(claim alone p50 {statistics.median(claim_t):.2f} ms; client CPU "
        f"{cpu / pairs * 1000:.2f} ms/pair; {pairs} pairs)"
    )


def load_audit_db(url: str, sources: int, per_source: int) -> None:
    import psycopg

    ledger = Ledger(url, create=True)
    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn) as conn:
        have = conn.execute("SELECT COUNT(*) FROM streamledger_range").fetchone()
        if have and have[0] == sources * per_source:
            print(f"audit db: reusing {have[0]:,} ranges in {AUDIT_DB}")
            return
        conn.execute("TRUNCATE streamledger_range, streamledger_source, streamledger_pipeline CASCADE")
        now = datetime.now(UTC).replace(tzinfo=None)
        pid = conn.execute(
            "INSERT INTO streamledger_pipeline (name, created_at) VALUES ('bench-audit', %s) RETURNING id",
            (now,),
        ).fetchone()[0]  # type: ignore[index]
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO streamledger_source (pipeline_id, broker, stream, created_at) "
                "VALUES (%s, %s, %s, %s)",
                [(pid, "rabbitmq://127.0.0.1:5552/", f"s-{i:04d}", now) for i in range(sources)],
            )
        sids = [row[0] for row in conn.execute("SELECT id FROM streamledger_source ORDER BY id")]
        started = time.perf_counter()
        conn.execute("ALTER TABLE streamledger_range DISABLE TRIGGER streamledger_range_guard")
        columns = (
            "source_id, start_offset, end_offset, status, dag_id, run_id, task_id, map_index, try_number, "
            "records, first_seen, last_seen, offset_stored, offset_verified, claimed_at, committed_at, "
            "updated_at"
        )
        with conn.cursor().copy(f"COPY streamledger_range ({columns}) FROM STDIN") as copy:
            for sid in sids:
                for k in range(per_source):
                    start = k * 100
                    copy.write_row(
                        (sid, start, start + 100, "committed", "bench", f"r{k}", "read", -1, 1,
                         90, start, start + 99, True, True, now, now, now)
                    )  # fmt: skip
        conn.execute("ALTER TABLE streamledger_range ENABLE TRIGGER streamledger_range_guard")
        conn.commit()
        print(f"audit db: loaded {len(sids) * per_source:,} ranges in {time.perf_counter() - started:.1f} s")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE streamledger_range")
    ledger.close()


def audit_time(url: str) -> None:
    ledger = Ledger(url)
    times = []
    report = None
    for _ in range(3):
        t0 = time.perf_counter()
        report = ledger.audit()
        times.append(time.perf_counter() - t0)
    ledger.close()
    assert report is not None
    print(
        f"audit      {report.ranges:,} ranges / {report.sources:,} sources: best {min(times):.2f} s, "
        f"median {statistics.median(times):.2f} s, clean={report.clean}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--ranges-per-source", type=int, default=1000)
    parser.add_argument("--skip-audit", action="store_true")
    args = parser.parse_args()

    bench_dir = HOME / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    sqlite_file = bench_dir / "ledger-latency.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{sqlite_file}{suffix}").unlink(missing_ok=True)
    server = pg_server()
    load = os.getloadavg()[0]
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpu(s), load average {load:.1f}; "
        f"PostgreSQL via {server.split('@')[-1]}"
    )
    latency(f"sqlite:///{sqlite_file}", "sqlite", args.pairs)
    latency(pg_database(server, "sl_bench_latency", fresh=True), "postgresql", args.pairs)
    if not args.skip_audit:
        url = pg_database(server, AUDIT_DB, fresh=False)
        load_audit_db(url, args.sources, args.ranges_per_source)
        audit_time(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
