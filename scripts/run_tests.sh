#!/usr/bin/env bash
# Runs the whole pytest suite; servers are provisioned and started by the fixtures.
# Fails when pytest collects nothing (exit 5) or anything else goes wrong.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
set +e
"$VENV/bin/python" -m pytest -q --durations=15 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
