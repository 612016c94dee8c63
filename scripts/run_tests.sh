#!/usr/bin/env bash
# Runs the whole pytest suite; servers are provisioned and started by the fixtures.
# Fails when pytest collects nothing (exit 5) or anything else goes wrong.
#
# Two pytest processes: PySpark refuses a Spark Connect session in a process that already runs a
# classic (local) SparkSession, and most of the suite shares one classic session. So the tests that
# open Connect sessions in-process (tests/integration/spark/test_connect.py) run in their own process.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
CONNECT_TESTS=tests/integration/spark/test_connect.py

run() {
  set +e
  "$VENV/bin/python" -m pytest -q --durations=15 "$@"
  local rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    return 1
  fi
  return "$rc"
}

if [ "$#" -gt 0 ]; then
  run "$@"
  exit $?
fi
rc=0
run --ignore="$CONNECT_TESTS" || rc=$?
run "$CONNECT_TESTS" || rc=$?
exit "$rc"
