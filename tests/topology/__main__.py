"""``python -m tests.topology up|down|status`` (what ``scripts/topology.sh`` runs)."""

from __future__ import annotations

import sys

from tests.topology import stack


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("up", "down", "status"):
        print("usage: scripts/topology.sh up|down|status", file=sys.stderr)
        return 2
    if argv[0] == "up":
        stack.up()
    elif argv[0] == "down":
        stack.down()
    states = stack.status()
    for name, state in states.items():
        print(f"{name:16} {state}")
    if argv[0] == "down":
        return 0 if not any(s.startswith("running") for s in states.values()) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
