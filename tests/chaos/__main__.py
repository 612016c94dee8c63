"""``python -m tests.chaos [--parallel] [--seed N] [--kills N] [--duration S]``: one chaos run, exit 1 on
any violation. ``--parallel``: max_active_runs=3, retries=0, the operator clears only some failed runs."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tests.chaos.harness import ChaosOptions, report, run_chaos


def main(argv: list[str] | None = None) -> int:
    defaults = ChaosOptions()
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    p.add_argument("--seed", type=int, default=defaults.seed, help="RNG seed (kill moments and targets)")
    p.add_argument("--kills", type=int, default=defaults.kills, help="task processes to SIGKILL")
    p.add_argument("--duration", type=float, default=defaults.duration, help="publishing seconds (min)")
    p.add_argument("--interval", type=int, default=defaults.interval, help="DAG data interval in seconds")
    p.add_argument("--rate", type=float, default=defaults.rate, help="records published per second")
    p.add_argument("--idle-runs", type=int, default=defaults.idle_runs, help="live idle intervals to watch")
    p.add_argument("--parallel", action="store_true",
                   help="max_active_runs=3 and retries=0; the operator clears only some failed runs")
    p.add_argument("--clear-probability", type=float, default=defaults.clear_probability,
                   help="--parallel: the chance the operator ever clears a failed run (never all)")
    p.add_argument("--no-broker-restart", action="store_true")
    p.add_argument("--no-postgres-restart", action="store_true")
    p.add_argument("--settle-timeout", type=float, default=defaults.settle_timeout)
    p.add_argument("--scratch", type=Path, help="run directory (default $STREAMLEDGER_HOME/chaos/<stamp>)")
    p.add_argument("--broker-home", type=Path, help="STREAMLEDGER_HOME where RabbitMQ 4.3 is provisioned")
    p.add_argument("--keep", action="store_true", help="keep the run directory even when clean")
    a = p.parse_args(argv)
    opts = ChaosOptions(
        seed=a.seed, kills=a.kills, duration=a.duration, interval=a.interval, rate=a.rate,
        idle_runs=a.idle_runs, broker_restart=not a.no_broker_restart,
        postgres_restart=not a.no_postgres_restart, settle_timeout=a.settle_timeout, scratch=a.scratch,
        broker_home=a.broker_home, keep=a.keep, parallel=a.parallel, clear_probability=a.clear_probability,
    )
    # Tear the servers down on SIGTERM/SIGINT too (a background job starts with SIGINT ignored).
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    result = run_chaos(opts)
    print(report(result))
    return 0 if result.clean else 1


if __name__ == "__main__":
    sys.exit(main())
