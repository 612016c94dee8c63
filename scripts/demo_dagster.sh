#!/usr/bin/env bash
# The Dagster example (`make demo-dagster`): the YAML component (StreamBatchComponent) in a dg project,
# bounded, ledgered batches of a super stream run the way a Dagster user runs them.
#
#  1. provision + start the local RabbitMQ 4.3 broker (idempotent; the first time takes ~1 min)
#  2. reset the demo state and create the super stream (3 partitions)
#  3. a dg project: `dg list components`, `dg scaffold defs ...StreamBatchComponent events`, its
#     defs.yaml filled in, `dg utils refresh-defs-state` (discovers the partitions), `dg check defs`
#     with the broker URL pointing at a closed port (loading the code location calls no broker)
#  4. a first wave of events, `dg launch --assets streams/dagster-demo`: one range per partition,
#     read by local Spark into Parquet, committed in the ledger (SQLite), broker offsets stored; the
#     ledger-audit asset check runs after it
#  5. a second wave; a `dg launch` SIGKILLed once its claims are in the ledger, marked failed (what
#     run monitoring does), then re-executed from failure with Dagster's Python API (there is no CLI
#     for re-execution): same root run id -> the same ranges, committed and published once
#  6. a third wave and a second `dg launch` (the next ranges)
#  7. print the ranges, the audit and the Parquet row counts (each event exactly once)
#
# Rerunnable: every run starts from a clean demo state (super stream, ledger, output, Dagster home).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
VENV=${VENV:-.venv}
case $VENV in /*) ;; *) VENV=$REPO/$VENV ;; esac
PY=$VENV/bin/python
DG=$VENV/bin/dg

export STREAMLEDGER_HOME=${STREAMLEDGER_HOME:-/var/tmp/streamledger}
DEMO=$STREAMLEDGER_HOME/dagster-demo
PROJECT=$DEMO/project
export PER_WAVE=${PER_WAVE:-300}
export STREAMLEDGER_RABBITMQ_URL=${STREAMLEDGER_DEMO_URL:-rabbitmq-stream://guest:guest@127.0.0.1:5552/}
export STREAMLEDGER_LEDGER_URL=sqlite:///$DEMO/ledger.db
export STREAMLEDGER_OUTPUT_ROOT=$DEMO/output
export STREAMLEDGER_SUPER_STREAM=${STREAMLEDGER_SUPER_STREAM:-dagster-demo-events}
export STREAMLEDGER_PIPELINE=${STREAMLEDGER_PIPELINE:-dagster-demo}
export DAGSTER_HOME=$DEMO/dagster-home
export DAGSTER_DISABLE_TELEMETRY=1
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$PY}
# the project's code (a dg project is normally pip-installed into the venv) and this checkout
export PYTHONPATH="$REPO/src:$PROJECT/src${PYTHONPATH:+:$PYTHONPATH}"
export COLUMNS=${COLUMNS:-200}
KEY=streams/$STREAMLEDGER_PIPELINE
TYPE=streamledger.dagster.components.StreamBatchComponent
LOGS=$DEMO/logs

step() { printf '\n== %s\n' "$*"; }
t0=$(date +%s)

step "1. RabbitMQ 4.3 broker"
scripts/rabbitmq.sh provision 4.3 && scripts/rabbitmq.sh start 4.3 && scripts/rabbitmq.sh wait 4.3

step "2. clean demo state, super stream $STREAMLEDGER_SUPER_STREAM (3 partitions)"
rm -rf "$DEMO"
mkdir -p "$DAGSTER_HOME" "$LOGS"
publish() { # first_id count
  "$PY" - "$1" "$2" <<'PYEOF'
import json, os, sys
from streamledger.protocol.rabbitmq import StreamClient
first, count = int(sys.argv[1]), int(sys.argv[2])
with StreamClient.connect(os.environ["STREAMLEDGER_RABBITMQ_URL"]) as c:
    parts = c.partitions(os.environ["STREAMLEDGER_SUPER_STREAM"])
    by_part = {p: [] for p in parts}
    for i in range(first, first + count):
        by_part[parts[i % len(parts)]].append(json.dumps({"id": i, "user": f"u{i % 17}"}).encode())
    for p, bodies in by_part.items():
        assert c.publish(p, bodies).confirmed == len(bodies)
print(f"   published events {first}..{first + count - 1} over {len(parts)} partitions")
PYEOF
}
"$PY" - <<'PYEOF'
import os
from streamledger.protocol.rabbitmq import StreamClient
name = os.environ["STREAMLEDGER_SUPER_STREAM"]
with StreamClient.connect(os.environ["STREAMLEDGER_RABBITMQ_URL"]) as c:
    c.delete_super_stream(name, missing_ok=True)
    c.create_super_stream(name, partitions=3)
    print("   partitions:", ", ".join(c.partitions(name)))
PYEOF

dg() { # log_name args...: dg in the project, its output in $LOGS/<log_name>.log
  local log=$LOGS/$1.log; shift
  if ! (cd "$PROJECT" && "$DG" "$@") >"$log" 2>&1; then
    tail -40 "$log"; echo "demo: dg $* failed (log: $log)" >&2; exit 1
  fi
}

launch() { # log_name
  dg "$1" launch --assets "$KEY"
  local log=$LOGS/$1.log run_id
  run_id=$(grep -m1 -oE ' - [0-9a-f-]{36} - ' "$log" | tr -d ' -' | cut -c1-8)
  grep -E "committed: [0-9]+ records" "$log" | sed -E 's/^.* - streams__[^ ]* - /   /; s/, output .*//'
  grep -oE "Asset check 'ledger_audit' on '[^']*' (passed|failed)" "$log" | sed 's/^/   /'
  grep -q RUN_SUCCESS "$log" && echo "   run $run_id: RUN_SUCCESS (log: $log)"
}

step "3. a dg project with the StreamBatchComponent"
mkdir -p "$PROJECT/src/demo_project/defs"
cat >"$PROJECT/pyproject.toml" <<'TOML'
[project]
name = "demo-project"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["streamledger[dagster]"]

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "demo_project"
TOML
touch "$PROJECT/src/demo_project/__init__.py" "$PROJECT/src/demo_project/defs/__init__.py"
cat >"$PROJECT/src/demo_project/definitions.py" <<'PYEOF'
from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    # one process per run: the batch step's Spark session starts once
    return dg.Definitions.merge(
        dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
        dg.Definitions(executor=dg.in_process_executor),
    )
PYEOF
dg components list components
grep -m1 -F "$TYPE" "$LOGS/components.log" | tr -s ' ' | sed 's/^/   dg list components: /'
dg scaffold scaffold defs "$TYPE" events
echo "   dg scaffold defs $TYPE events: wrote src/demo_project/defs/events/defs.yaml, filled in as:"
cat >"$PROJECT/src/demo_project/defs/events/defs.yaml" <<YAML
type: $TYPE
attributes:
  pipeline: $STREAMLEDGER_PIPELINE
  super_stream: $STREAMLEDGER_SUPER_STREAM
  output_root: $STREAMLEDGER_OUTPUT_ROOT
  broker_url_env: STREAMLEDGER_RABBITMQ_URL
  ledger_url_env: STREAMLEDGER_LEDGER_URL
  spark_master: local[2]
  asset_attributes:
    key: "streams/{{ pipeline }}"
    owners: ["team:data"]
  freshness:
    fail_after_seconds: 3600
  backlog_sensor:
    min_backlog: 100
YAML
sed 's/^/     /' "$PROJECT/src/demo_project/defs/events/defs.yaml"
dg refresh utils refresh-defs-state
echo "   dg utils refresh-defs-state: $(cat "$PROJECT"/src/demo_project/defs/.local_defs_state/*/state)"
STREAMLEDGER_RABBITMQ_URL=rabbitmq-stream://guest:guest@127.0.0.1:9/ dg check check defs
echo "   dg check defs, the broker URL at a closed port: $(grep -o 'All definitions loaded successfully' "$LOGS/check.log")"

step "4. wave 1 + dg launch --assets $KEY"
publish 0 "$PER_WAVE"
launch run-1

step "5. wave 2; a dg launch killed once it holds its claims, then re-executed from failure"
publish "$PER_WAVE" "$PER_WAVE"
(cd "$PROJECT" && "$PY" - "$DG" "$KEY" "$LOGS/run-2-killed.log") <<'PYEOF'
import os, signal, subprocess, sys, time
from streamledger.ledger import Ledger
dg, key, log = sys.argv[1:4]
ledger = Ledger(os.environ["STREAMLEDGER_LEDGER_URL"])
pipeline = os.environ["STREAMLEDGER_PIPELINE"]
before = {r.id for r in ledger.ranges(pipeline)}
with open(log, "w") as out:  # its own process group, so the kill reaches its Spark JVM too
    proc = subprocess.Popen([dg, "launch", "--assets", key], stdout=out, stderr=out, start_new_session=True)
deadline = time.monotonic() + 300
while proc.poll() is None and time.monotonic() < deadline:
    if len([r for r in ledger.ranges(pipeline) if r.id not in before and r.status.value == "claimed"]) == 3:
        break
    time.sleep(0.1)
os.killpg(proc.pid, signal.SIGSTOP)
mine = [r for r in ledger.ranges(pipeline) if r.id not in before]
os.killpg(proc.pid, signal.SIGKILL)
proc.wait()
print("   dg launch SIGKILLed mid-batch, holding: "
      + ", ".join(f"{r.source.stream} [{r.start}, {r.end}) {r.status.value}" for r in mine))
if len(mine) != 3 or {r.status.value for r in mine} != {"claimed"}:
    raise SystemExit("demo: the launch was not caught holding its claims; run the demo again")
PYEOF
(cd "$PROJECT" && "$PY" -) 2>"$LOGS/reexecute.log" <<'PYEOF'
import os
from dagster import DagsterInstance, ReexecutionOptions, execute_job
from dagster._utils.hosted_user_process import recon_job_from_origin
from streamledger.ledger import Ledger

instance = DagsterInstance.get()
pipeline = os.environ["STREAMLEDGER_PIPELINE"]
ledger = Ledger(os.environ["STREAMLEDGER_LEDGER_URL"])
held = [r for r in ledger.ranges(pipeline) if r.status.value == "claimed"]
killed = instance.get_run_by_id(held[0].run.run_id)
instance.report_run_failed(killed)  # what run monitoring does for a run whose process died
print(f"   run {killed.run_id[:8]}: marked failed")
with execute_job(recon_job_from_origin(killed.job_code_origin), instance=instance,
                 reexecution_options=ReexecutionOptions.from_failure(killed.run_id, instance)) as again:
    run = again.dagster_run
    print(f"   re-execution {run.run_id[:8]} (root {run.root_run_id[:8]}): success={again.success}")
done = {(r.source.stream, r.start, r.end) for r in ledger.ranges(pipeline) if r.status.value == "committed"}
assert all((r.source.stream, r.start, r.end) in done for r in held), "re-execution must commit the same ranges"
print("   the re-execution committed exactly the claimed ranges")
PYEOF

step "6. wave 3 + a second dg launch (the next ranges)"
publish $((2 * PER_WAVE)) "$PER_WAVE"
launch run-3

step "7. ledger, audit and output"
"$PY" - <<'PYEOF'
import json, os
from pathlib import Path
import pyarrow.parquet as pq
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
ledger = Ledger(os.environ["STREAMLEDGER_LEDGER_URL"])
pipeline, super_stream = os.environ["STREAMLEDGER_PIPELINE"], os.environ["STREAMLEDGER_SUPER_STREAM"]
print(f"ledger {os.environ['STREAMLEDGER_LEDGER_URL']}, pipeline {pipeline}:")
print(f"   {'stream':<22} {'range':>12} {'records':>8}  {'status':<10} {'stored':<8} run (root) / try")
for r in sorted(ledger.ranges(pipeline), key=lambda r: (r.source.stream, r.start, r.id)):
    stored = "verified" if r.offset_verified else ("stored" if r.offset_stored else "-")
    print(f"   {r.source.stream:<22} {f'[{r.start}, {r.end})':>12} {r.records:>8}  {r.status.value:<10} "
          f"{stored:<8} {r.run.run_id[:8]} / {r.run.try_number}")
with StreamClient.connect(os.environ["STREAMLEDGER_RABBITMQ_URL"]) as c:
    report = ledger.audit(pipeline, broker=c)
    stored = {p: c.query_offset(p, pipeline) for p in c.partitions(super_stream)}
print(f"broker stored offsets for {pipeline}: {stored}")
print("audit:", "CLEAN" if report.clean else "VIOLATIONS")
print("\n".join("   " + line for line in report.to_text().splitlines()))
root = Path(os.environ["STREAMLEDGER_OUTPUT_ROOT"]) / pipeline
files = sorted(root.glob("*/*/*/*.parquet"))
ids = [json.loads(b)["id"] for f in files for b in pq.read_table(f, columns=["body"]).column("body").to_pylist()]
print(f"Parquet output: {root}  ({len(files)} files, {len(ids)} rows, {len(set(ids))} distinct event ids)")
for d in sorted({f.parent for f in files}):
    print(f"   {d.relative_to(root)}")
expected = 3 * int(os.environ.get("PER_WAVE", "300"))
if not report.clean or len(ids) != len(set(ids)) or set(ids) != set(range(expected)):
    raise SystemExit("demo: audit not clean, duplicates or missing events")
print(f"every one of the {expected} events is in the output exactly once")
PYEOF
echo
echo "demo finished in $(( $(date +%s) - t0 )) s; Dagster home $DAGSTER_HOME, logs in $LOGS"
