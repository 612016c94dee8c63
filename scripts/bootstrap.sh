#!/usr/bin/env bash
# Create/refresh the project venv with everything the demo and the tests need. Idempotent.
# - Java 17 for local Spark (installed from the system's apt sources if missing)
# - the package in editable mode with all extras (the Airflow and Dagster extras share this one venv)
# - pyspark restored after the apache-spark provider's pyspark-client overwrote its files
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
PYSPARK_VERSION=${PYSPARK_VERSION:-4.3.0}

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

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
"$VENV/bin/pip" install -q -e ".[dev,compression,postgres,spark,airflow,dagster]" "pyspark==$PYSPARK_VERSION"

# apache-airflow-providers-apache-spark depends on pyspark-client, which writes into site-packages/pyspark/
# as well; whichever installed last wins. Put the full pyspark back when the versions disagree.
have=$("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null || echo none)
if [ "$have" != "$PYSPARK_VERSION" ]; then
  echo "bootstrap: pyspark reports $have, restoring pyspark $PYSPARK_VERSION"
  "$VENV/bin/pip" install -q --force-reinstall --no-deps "pyspark==$PYSPARK_VERSION"
fi
echo "bootstrap: venv ready at $VENV ($("$VENV/bin/python" --version), pyspark $("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)'))"
