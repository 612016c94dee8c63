#!/usr/bin/env bash
# The Dagster example (`make demo-dagster`): bounded, ledgered batches of a super stream run by Dagster.
#
#  1. provision + start the local RabbitMQ 4.3 broker (idempotent; the first time takes ~1 min)
#  2. reset the demo state and create the super stream (3 partitions)
#  3. publish a first wave of events, then `dagster asset materialize -m streamledger.dagster.example
#     --select stream_batch`: one range per partition, read by local Spark into Parquet, committed in
#     the ledger (SQLite), broker offsets stored; the ledger-audit asset check runs after it
#  4. a run killed after claiming (the Spark step dies once its staging output is written), then
#     the same run re-executed from failure with Dagster's Python API: same root run id -> the
#     same ranges, committed and published once
#  5. a second wave and a second materialization (the next ranges)
#  6. print the ranges, the audit and the Parquet row counts (each event exactly once)
#
# Rerunnable: every run starts from a clean demo state (super stream, ledger, output, Dagster home).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
VENV=${VENV:-.venv}
case $VENV in /*) ;; *) VENV=$REPO/$VENV ;; esac
PY=$VENV/bin/python
DAGSTER=$VENV/bin/dagster

export STREAMLEDGER_HOME=${STREAMLEDGER_HOME:-/var/tmp/streamledger}
DEMO=$STREAMLEDGER_HOME/dagster-demo
export PER_WAVE=${PER_WAVE:-300}
export STREAMLEDGER_RABBITMQ_URL=${STREAMLEDGER_DEMO_URL:-rabbitmq-stream://guest:guest@127.0.0.1:5552/}
export STREAMLEDGER_LEDGER_URL=sqlite:///$DEMO/ledger.db
export STREAMLEDGER_OUTPUT_ROOT=$DEMO/output
export STREAMLEDGER_SUPER_STREAM=${STREAMLEDGER_SUPER_STREAM:-dagster-demo-events}
export STREAMLEDGER_PIPELINE=${STREAMLEDGER_PIPELINE:-dagster-demo}
export DAGSTER_HOME=$DEMO/dagster-home
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$PY}
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

materialize() { # log_name
  if ! "$DAGSTER" asset materialize -m streamledger.dagster.example --select stream_batch >"$LOGS/$1.log" 2>&1; then
    tail -40 "$LOGS/$1.log"; echo "demo: dagster asset materialize failed (log: $LOGS/$1.log)" >&2; exit 1
  fi
  local run_id
  run_id=$(grep -m1 -oE ' - [0-9a-f-]{36} - ' "$LOGS/$1.log" | tr -d ' -' | cut -c1-8)
  grep -E "committed: [0-9]+ records" "$LOGS/$1.log" | sed -E 's/^.* - stream_batch - /   /; s/, output .*//'
  grep -oE "Asset check 'ledger_audit' on 'stream_batch' (passed|failed)" "$LOGS/$1.log" | sed 's/^/   /'
  grep -q RUN_SUCCESS "$LOGS/$1.log" && echo "   run $run_id: RUN_SUCCESS (log: $LOGS/$1.log)"
}

step "3. wave 1 + dagster asset materialize -m streamledger.dagster.example --select stream_batch"
"$DAGSTER" definitions validate -m streamledger.dagster.example >"$LOGS/validate.log" 2>&1 \
  || { cat "$LOGS/validate.log"; exit 1; }
echo "   dagster definitions validate: ok"
publish 0 "$PER_WAVE"
materialize run-1

step "4. wave 2; a run killed after claiming, then re-executed from failure (same root run id)"
publish "$PER_WAVE" "$PER_WAVE"
# Re-execution has no CLI command: use Dagster's Python API on a reconstructable job (a module
# function). The demo's job is the example's, with a Spark resource that can "kill" its step right
# after the Spark job wrote its staging output (a BaseException: none of the batch's clean-up runs).
cat >"$DEMO/demo_jobs.py" <<'PYEOF'
import os
from dagster import Definitions, in_process_executor
from streamledger.batch import InjectedCrash
from streamledger.dagster import StreamSparkResource, example

class KillableSpark(StreamSparkResource):
    def get_runner(self):
        real = super().get_runner()
        def runner(**kwargs):
            manifest = real(**kwargs)
            if os.environ.get("DEMO_KILL") == "1":
                raise InjectedCrash("demo: killed after the Spark job wrote its staging output")
            return manifest
        return runner

def stream_batch_job():
    defs = Definitions(
        assets=[example.stream_batch], jobs=[example.stream_batch_job], executor=in_process_executor,
        resources={**example.defs.resources, "spark": KillableSpark(quick_start=True)},
    )
    return defs.resolve_job_def("stream_batch_job")
PYEOF
PYTHONPATH="$DEMO${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'PYEOF' 2>"$LOGS/reexecute.log"
import os
from dagster import DagsterInstance, ReexecutionOptions, execute_job, reconstructable
import demo_jobs
from streamledger.dagster import example
from streamledger.ledger import Ledger

job = demo_jobs.stream_batch_job
instance = DagsterInstance.get()
os.environ["DEMO_KILL"] = "1"
with execute_job(reconstructable(job), instance=instance, raise_on_error=False) as killed:
    print(f"   run {killed.run_id[:8]}: success={killed.success} (Spark step died after writing, nothing committed)")
del os.environ["DEMO_KILL"]
if not instance.get_run_by_id(killed.run_id).is_finished:
    instance.report_run_failed(instance.get_run_by_id(killed.run_id))  # what run monitoring does
ledger = Ledger(os.environ["STREAMLEDGER_LEDGER_URL"])
held = [r for r in ledger.ranges(example.PIPELINE) if r.status.value == "claimed"]
print("   ledger: " + ", ".join(f"{r.source.stream} [{r.start}, {r.end}) claimed" for r in held))
with execute_job(reconstructable(job), instance=instance,
                 reexecution_options=ReexecutionOptions.from_failure(killed.run_id, instance)) as again:
    run = again.dagster_run
    print(f"   re-execution {run.run_id[:8]} (root {run.root_run_id[:8]}): success={again.success}")
done = {(r.source.stream, r.start, r.end) for r in ledger.ranges(example.PIPELINE) if r.status.value == "committed"}
assert all((r.source.stream, r.start, r.end) in done for r in held), "re-execution must commit the same ranges"
print("   the re-execution committed exactly the claimed ranges")
PYEOF

step "5. wave 3 + a second CLI materialization (the next ranges)"
publish $((2 * PER_WAVE)) "$PER_WAVE"
materialize run-3

step "6. ledger, audit and output"
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
files = sorted(root.glob("*/*/*.parquet"))
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
