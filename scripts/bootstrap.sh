#!/usr/bin/env bash
# Create/refresh the project venv with everything the demo and the tests need. Idempotent.
# - Java 17 for local Spark (installed from the system's apt sources if missing)
# - headless Chromium + chromedriver for the UI page's tests (same)
# - the package in editable mode with all extras (the Airflow and Dagster extras share this one venv)
# - one pyspark version: pyproject.toml pins pyspark and pyspark-client (the apache-spark provider's
#   dependency, a subset of pyspark's files) to the same release, so nothing is reinstalled afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}

if ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: installing Java 17 (headless JRE) from the system's apt sources"
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openjdk-17-jre-headless
fi

# python-qpid-proton (under the test-only rabbitmq-amqp-python-client) has no Linux wheel: pip builds it
# with gcc, and with OpenSSL's headers for its TLS support.
if ! dpkg -s libssl-dev >/dev/null 2>&1 || ! command -v gcc >/dev/null 2>&1; then
  echo "bootstrap: installing gcc and libssl-dev (build of python-qpid-proton) from the system's apt sources"
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gcc libssl-dev
fi

# Headless Chromium and its WebDriver for the UI tests of the Stream ledger page (tests/e2e/test_ledger_ui.py,
# bench/ui.py), from the system's apt sources.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "bootstrap: installing chromium and chromium-driver (UI tests) from the system's apt sources"
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver
fi

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
"$VENV/bin/pip" install -q -e ".[dev,compression,postgres,spark,airflow,celery,dagster]"
"$VENV/bin/pip" check
"$VENV/bin/python" scripts/check_pyspark.py
echo "bootstrap: venv ready at $VENV ($("$VENV/bin/python" --version))"
