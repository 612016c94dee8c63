#!/usr/bin/env bash
# The production topology on one machine, sharing nothing but services (docs/deployment.md):
#
#   scripts/topology.sh up [--spark submit|connect] | down | status
#
# Redis, PostgreSQL, the 3-node RabbitMQ 4.3 cluster, a Spark standalone master with two workers
# (with --spark connect also a Spark Connect server in front of them: the DAG setting that picks,
# kept for later `up`s), Airflow 3 with the CeleryExecutor (api-server, scheduler, dag-processor,
# triggerer) and two Celery workers, all on loopback; state under $STREAMLEDGER_TOPOLOGY_HOME
# (default /var/tmp/streamledger-topology). Idempotent; `down` leaves nothing of it running.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || { echo "topology: no venv at $VENV (run: make venv)" >&2; exit 1; }
exec "$VENV/bin/python" -m tests.topology "$@"
