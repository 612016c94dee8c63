"""``python -m tests.topology up [--spark submit|connect]|down|status`` (what ``scripts/topology.sh``
runs). ``--spark`` is the DAG setting that picks where the batch's jobs run, kept for later ``up``s."""

from __future__ import annotations

import argparse
import sys

from tests.topology import stack


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="scripts/topology.sh")
    p.add_argument("command", choices=("up", "down", "status"))
    p.add_argument("--spark", choices=stack.SPARK_MODES,
                   help="up: spark-submit to the standalone cluster, or a Spark Connect server before it")
    a = p.parse_args(argv)
    if a.spark and a.command != "up":
        p.error("--spark goes with up")
    if a.command == "up":
        if a.spark:
            stack.set_spark_mode(stack.layout(), a.spark)
        stack.up()
    elif a.command == "down":
        stack.down()
    states = stack.status()
    for name, state in states.items():
        print(f"{name:16} {state}")
    if a.command == "down":
        return 0 if not any(s.startswith("running") for s in states.values()) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
