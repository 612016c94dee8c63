#!/usr/bin/env bash
# Runs the whole pytest suite; servers are provisioned and started up front (below) and by the fixtures.
# Fails when pytest collects nothing (exit 5) in any lane, or anything else goes wrong.
#
# `scripts/run_tests.sh --lint` (what `make test` runs) also runs `make lint` at the same time as the
# suite (lint is CPU while the lanes wait on servers; on a fresh machine mypy without a cache takes
# minutes) and fails when lint fails, its output and verdict printed at the end. Before the lanes, the
# whole suite provisions and starts the shared servers once (tests/support/provision.py: PostgreSQL,
# the three brokers, the S3 server), while lint runs, so the lanes do not queue on the fixtures' locks
# behind a first-time provisioning; the fixtures still start whatever is missing, as when one test
# file runs alone.
#
# Three lanes run at the same time, because much of the suite's wall time is spent waiting, not computing:
# * lane "core": tests/unit and tests/integration (but the Airflow unit tests and the Dagster, Spark,
#   mewbase, ledger and AMQP 1.0 integration tests) in one process (one shared classic SparkSession);
# * lane "airflow": tests/integration/dagster and tests/e2e, whose time goes to Airflow's own
#   processes (the scheduler's loops, `airflow dags test` starting up), with tests/unit/airflow and
#   tests/integration/amqp10 (moved here from core, the longest lane: 1,450 s against 1,097 s here
#   on a loaded warm run, 2026-11-29; ~190 s of test time); then, in
#   a process of its own, the tests that open Spark Connect sessions in-process
#   (tests/integration/spark/test_connect.py): PySpark refuses a Connect session in a process that
#   already runs a classic session;
# * lane "side": tests/chaos, the short chaos run, most of whose time is waiting for data intervals
#   to pass and for faults to be healed; then tests/integration/spark (but Connect),
#   tests/integration/mewbase, the model checker's short form (tests/model) and the PostgreSQL ledger
#   tests (tests/integration/ledger), with a classic SparkSession of their own (the last two moved
#   here from core, the longest lane: 1,169 s against 819 s here); then tests/install (the longest
#   lane, airflow, was 1,021 s against 640 s here with it there).
# Balanced by measurement (see docs/development.md); move whole directories between them, never split one.
# The servers are shared safely: the fixtures start each one once under an fcntl lock, tests use
# their own streams, databases and Airflow homes, and the chaos run restarts only its private servers.
# The core lane prints as it goes; the other lanes' output follows when all are done.
# Tests marked `matrix` (further cells of a fault matrix the suite samples one cell per row of) run
# with `make test-matrix`, not here.
# STREAMLEDGER_TEST_LANES=1 runs the lanes one after the other (for a quiet profile of each);
# STREAMLEDGER_DURATIONS=0 prints every test's time (default: the slowest 15 of each pytest run).
# STREAMLEDGER_TEST_TIMES=FILE appends each test phase's time to FILE as the suite goes (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
CONNECT_TESTS=tests/integration/spark/test_connect.py
DAGSTER_TESTS=tests/integration/dagster
AIRFLOW_UNIT_TESTS=tests/unit/airflow
AMQP10_TESTS=tests/integration/amqp10
AIRFLOW_LANE=("$DAGSTER_TESTS" tests/e2e "$AIRFLOW_UNIT_TESTS" "$AMQP10_TESTS")
CHAOS_TESTS=tests/chaos
SPARK_TESTS=tests/integration/spark
MEWBASE_TESTS=tests/integration/mewbase
MODEL_TESTS=tests/model
LEDGER_TESTS=tests/integration/ledger
INSTALL_TESTS=tests/install

run() {
  set +e
  "$VENV/bin/python" -m pytest -q --durations="${STREAMLEDGER_DURATIONS:-15}" "$@"
  local rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    return 1
  fi
  return "$rc"
}

lint=0
if [ "${1:-}" = "--lint" ]; then
  lint=1
  shift
fi

if [ "$#" -gt 0 ]; then
  rc=0
  if [ "$lint" = 1 ]; then "${MAKE:-make}" --no-print-directory lint VENV="$VENV" || rc=$?; fi
  run "$@" || rc=$?
  exit "$rc"
fi

airflow_lane() {
  local rc=0
  run "${AIRFLOW_LANE[@]}" -m "not matrix" || rc=$?
  run "$CONNECT_TESTS" || rc=$?
  return "$rc"
}

side_lane() {
  local rc=0
  run "$CHAOS_TESTS" || rc=$?
  run "$SPARK_TESTS" "$MEWBASE_TESTS" "$MODEL_TESTS" "$LEDGER_TESTS" --ignore="$CONNECT_TESTS" \
    -m "not matrix" || rc=$?
  run "$INSTALL_TESTS" || rc=$?
  return "$rc"
}

core_lane() {
  run tests/unit tests/integration --ignore="$CONNECT_TESTS" --ignore="$DAGSTER_TESTS" \
    --ignore="$SPARK_TESTS" --ignore="$MEWBASE_TESTS" --ignore="$LEDGER_TESTS" \
    --ignore="$AIRFLOW_UNIT_TESTS" --ignore="$AMQP10_TESTS" -m "not matrix"
}

start=$SECONDS
began=$SECONDS
rc=0
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
if [ "$lint" = 1 ]; then
  ( lrc=0; "${MAKE:-make}" --no-print-directory lint VENV="$VENV" > "$logs/lint.log" 2>&1 || lrc=$?
    echo "$lrc" > "$logs/lint.rc"; echo $((SECONDS - began)) > "$logs/lint.s" ) &
fi
lint_report() {  # the lint job's output and verdict (it runs beside the lanes); 1 when it failed
  [ "$lint" = 1 ] || return 0
  wait
  local lrc
  lrc=$(cat "$logs/lint.rc" 2>/dev/null || echo 1)
  echo "== lint (ruff, mypy, import graph; beside the lanes): $(cat "$logs/lint.s" 2>/dev/null || echo '?') s (exit $lrc)"
  cat "$logs/lint.log"
  if [ "$lrc" -ne 0 ]; then
    echo "== LINT FAILED (exit $lrc): the suite fails with it"
    return 1
  fi
}
"$VENV/bin/python" -m tests.support.provision \
  || echo "== provisioning failed (above); the lanes' fixtures try again" >&2
echo "== servers ready: $((SECONDS - start)) s"
began=$SECONDS  # the lanes' clock

if [ "${STREAMLEDGER_TEST_LANES:-3}" = "1" ]; then
  core_lane || rc=$?
  echo "== lane core: $((SECONDS - began)) s"
  mark=$SECONDS
  airflow_lane || rc=$?
  echo "== lane airflow: $((SECONDS - mark)) s"
  mark=$SECONDS
  side_lane || rc=$?
  echo "== lane side: $((SECONDS - mark)) s"
  lint_report || rc=1
  exit "$rc"
fi

background() {  # background NAME: run NAME_lane, its output, exit code and seconds kept in $logs
  local name=$1
  ( lrc=0; "${name}_lane" > "$logs/$name.log" 2>&1 || lrc=$?
    echo "$lrc" > "$logs/$name.rc"; echo $((SECONDS - began)) > "$logs/$name.s" ) &
}
background side
background airflow
core_lane || rc=$?
echo "== lane core (tests/unit tests/integration): $((SECONDS - began)) s (exit $rc)"
wait || true
for name in airflow side; do
  lane_rc=$(cat "$logs/$name.rc" 2>/dev/null || echo 1)
  case $name in
    airflow) what="${AIRFLOW_LANE[*]}, then $CONNECT_TESTS" ;;
    side) what="$CHAOS_TESTS, then $SPARK_TESTS, $MEWBASE_TESTS, $MODEL_TESTS and $LEDGER_TESTS, then $INSTALL_TESTS" ;;
  esac
  echo "== lane $name ($what): $(cat "$logs/$name.s" 2>/dev/null || echo '?') s (exit $lane_rc)"
  cat "$logs/$name.log"
  [ "$lane_rc" -eq 0 ] || rc=$lane_rc
done
lint_report || rc=1
echo "== all lanes: $((SECONDS - began)) s; with the servers' start: $((SECONDS - start)) s (exit $rc)"
exit "$rc"
