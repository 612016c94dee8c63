"""A cron or Kubernetes job's batch: ``streamledger batch run`` of N new records, timed from the shell.

    PYTHONPATH=src python bench/cli_batch.py [--records 5000] [--rounds 3] [--partitions 1]
                                             [--modes warm,cold] [--url URL]

Each round publishes ``--records`` new AMQP records (100 B) into a stream (or a super stream of
``--partitions`` partitions) and runs ``streamledger batch run`` as its own process, the way a
scheduler's job does, once per mode, on the same pipeline's next records (each mode has its own
pipeline, SQLite ledger and output root):

* ``warm``: the Connect server ``streamledger spark-server start`` recorded (started once, untimed,
  in a private ``$STREAMLEDGER_HOME``): ``batch run`` finds it without a flag (issue 44, item 2);
* ``cold``: local Spark, its JVM started by the command (no server recorded, none named).

Prints each command's wall time (the whole process: interpreter, imports, ledger, broker, job,
exit) and records/s, medians per mode and their ratio.
Target (issue 44, printed, not asserted): warm <= 5 s for 5,000 records.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from streamledger.protocol.rabbitmq import StreamClient

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
SRC = str(Path(__file__).resolve().parents[1] / "src")


def environment(home: Path, ledger: Path, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMLEDGER_SPARK_REMOTE"}
    env.update(STREAMLEDGER_HOME=str(home), STREAMLEDGER_LEDGER_URL=f"sqlite:///{ledger}",
               STREAMLEDGER_BROKER_URL=url, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    return env


def batch_run(env: dict[str, str], target: list[str], pipeline: str, out: Path) -> tuple[float, int, str]:
    """One ``streamledger batch run`` process: (wall s, records, stderr)."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "streamledger.cli", "batch", "run", *target, "--pipeline",
                           pipeline, "--output-root", str(out), "--json"], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"batch run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return wall, int(json.loads(done.stdout)["records"]), done.stderr


def publish(client: StreamClient, streams: list[str], records: int) -> None:
    each = records // len(streams)
    for i, stream in enumerate(streams):
        n = each + (records - each * len(streams) if i == 0 else 0)
        result = client.publish(stream, (f"{i:04d}".encode() * 25 for _ in range(n)))
        if result.confirmed != n:
            raise SystemExit(f"publish to {stream}: {result.confirmed}/{n} confirmed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=1, help="1: a stream; more: a super stream")
    parser.add_argument("--modes", default="warm,cold")
    parser.add_argument("--url", default=os.environ.get("STREAMLEDGER_BENCH_URL", DEFAULT_URL))
    args = parser.parse_args()
    modes = args.modes.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="sl-bench-cli-"))
    name = f"bench-cli-{uuid.uuid4().hex[:6]}"
    client = StreamClient.connect(args.url, timeout=60.0)
    homes = {mode: tmp / f"home-{mode}" for mode in modes}
    server_env: dict[str, str] | None = None
    walls: dict[str, list[float]] = {mode: [] for mode in modes}
    try:
        if args.partitions > 1:
            client.create_super_stream(name, partitions=args.partitions)
            streams, target = client.partitions(name), ["--super-stream", name]
        else:
            client.create_stream(name)
            streams, target = [name], ["--stream", name]
        if "warm" in modes:
            server_env = environment(homes["warm"], tmp / "unused.sqlite", args.url)
            began = time.perf_counter()
            subprocess.run([sys.executable, "-m", "streamledger.cli", "spark-server", "start"],
                           env=server_env, check=True, capture_output=True, timeout=300)
            print(f"warm server started (untimed) in {time.perf_counter() - began:.1f} s", flush=True)
        for mode in modes:  # a first batch per mode reads nothing yet: the ledger is created, untimed
            batch_run(environment(homes[mode], tmp / f"{mode}.sqlite", args.url), target, mode, tmp / mode)
        for rnd in range(args.rounds):
            publish(client, streams, args.records)
            for mode in (modes if rnd % 2 == 0 else modes[::-1]):  # alternate which goes first
                wall, records, _err = batch_run(environment(homes[mode], tmp / f"{mode}.sqlite", args.url),
                                               target, mode, tmp / mode)
                if records != args.records:
                    raise SystemExit(f"{mode}: read {records} records, not {args.records}")
                walls[mode].append(wall)
                print(f"  round {rnd + 1} {mode}: {wall:.2f} s = {records / wall:,.0f} records/s "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
        print()
        med = {mode: statistics.median(w) for mode, w in walls.items()}
        for mode in modes:
            print(f"{mode}: median {med[mode]:.2f} s over {len(walls[mode])} rounds "
                  f"(min {min(walls[mode]):.2f}, max {max(walls[mode]):.2f}) = "
                  f"{args.records / med[mode]:,.0f} records/s")
        if "warm" in med and "cold" in med:
            print(f"cold / warm: {med['cold'] / med['warm']:.2f}x")
        if "warm" in med:
            print(f"target: warm <= 5 s for {args.records:,} records: "
                  f"{'met' if med['warm'] <= 5 else 'not met'} ({med['warm']:.2f} s)")
    finally:
        if server_env is not None:
            subprocess.run([sys.executable, "-m", "streamledger.cli", "spark-server", "stop"], env=server_env,
                           check=False, capture_output=True, timeout=120)
        try:
            if args.partitions > 1:
                client.delete_super_stream(name, missing_ok=True)
            else:
                client.delete_stream(name)
        except Exception as exc:  # clean-up is best effort
            print(f"could not delete {name}: {exc}", file=sys.stderr)
        client.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
