#!/usr/bin/env bash
# The main job (`make demo`): a data-interval backfill from a RabbitMQ super stream, run by Airflow.
#
#  1. provision + start the local RabbitMQ 4.3 broker (idempotent; the first time takes ~1 min)
#  2. set up an Airflow home under $STREAMLEDGER_HOME/airflow-demo (SQLite metadata DB)
#  3. create the super stream with the example DAG `streamledger_create_super_stream`
#  4. publish JSON order events (order id, customer, amount as a decimal string, currency, time,
#     status; one in 25 malformed on purpose) in WAVES waves, one wave per data interval of
#     INTERVAL_S seconds (chunk timestamps are the broker's clock at publish time, so honest data
#     intervals need the events to be published inside them: short intervals keep the demo short)
#  5. run the example DAG `streamledger_backfill` with `airflow dags test` once per interval:
#     each run reads [ledger end, first offset at/after the interval end) per partition with
#     local Spark, decodes the JSON bodies into typed columns and runs dags/sql/orders.sql on each
#     range inside the batch (malformed bodies to the range's dead letter), commits the ledger
#     (SQLite) with the records read and rows written, appends the typed rows to the Iceberg table
#     streamledger.demo_backfill in one table commit (STREAMLEDGER_SINK=iceberg: a pyiceberg SQL
#     catalog in the ledger's database), stores the broker offset
#  6. run the audit DAG and print the ranges, the three-way audit (broker, ledger, table: clean),
#     a few rows of the typed Iceberg table (read with pyiceberg) and the dead letters
#
# Rerunnable: every run starts from a clean demo state (super stream, ledger and output reset).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
VENV=${VENV:-.venv}
PY=$REPO/$VENV/bin/python
AIRFLOW=$REPO/$VENV/bin/airflow

export STREAMLEDGER_HOME=${STREAMLEDGER_HOME:-/var/tmp/streamledger}
DEMO=$STREAMLEDGER_HOME/airflow-demo
WAVES=${WAVES:-3}
PER_WAVE=${PER_WAVE:-300}
INTERVAL_S=${INTERVAL_S:-5}
URL=${STREAMLEDGER_DEMO_URL:-rabbitmq-stream://guest:guest@127.0.0.1:5552/}

export AIRFLOW_HOME=$DEMO/airflow
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_FOLDER=$REPO/dags
export AIRFLOW__LOGGING__LOGGING_LEVEL=INFO
export AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT='{"conn_type": "rabbitmq_stream", "host": "127.0.0.1", "port": 5552, "login": "guest", "password": "guest", "schema": "/"}'
export STREAMLEDGER_SUPER_STREAM=demo-events
export STREAMLEDGER_PARTITIONS=3
export STREAMLEDGER_PIPELINE=demo-backfill
export STREAMLEDGER_INTERVAL=${INTERVAL_S}s
export STREAMLEDGER_LEDGER_URL=sqlite:///$DEMO/ledger.sqlite
export STREAMLEDGER_OUTPUT_ROOT=$DEMO/output
export STREAMLEDGER_SINK=${STREAMLEDGER_SINK:-iceberg}
export STREAMLEDGER_SQL_FILE=sql/orders.sql
export STREAMLEDGER_BODY_FORMAT=json
export STREAMLEDGER_BODY_SCHEMA="order_id STRING, customer STRING, amount DECIMAL(12,2), currency STRING, ordered_at TIMESTAMP, status STRING"
export STREAMLEDGER_ON_BAD_RECORD=dead_letter
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$PY}
LOGS=$DEMO/logs

step() { printf '\n== %s\n' "$*"; }
t0=$(date +%s)

step "1. RabbitMQ 4.3 broker"
scripts/rabbitmq.sh provision 4.3 && scripts/rabbitmq.sh start 4.3 && scripts/rabbitmq.sh wait 4.3

step "2. Airflow home $AIRFLOW_HOME"
mkdir -p "$AIRFLOW_HOME" "$LOGS"
# Idempotent; also brings the ledger tables the provider's db-manager owns up to date after upgrades.
"$AIRFLOW" db migrate >"$LOGS/db-migrate.log" 2>&1 || { tail -30 "$LOGS/db-migrate.log"; exit 1; }
"$AIRFLOW" providers list 2>/dev/null | grep -E '^streamledger ' || { echo "streamledger provider not registered" >&2; exit 1; }

step "3. clean demo state + create the super stream (DAG streamledger_create_super_stream)"
"$PY" - "$URL" <<'EOF'
import sys
from streamledger.protocol.rabbitmq import StreamClient
with StreamClient.connect(sys.argv[1]) as c:
    c.delete_super_stream("demo-events", missing_ok=True)
EOF
rm -rf "$DEMO/output" "$DEMO/ledger.sqlite"
dags_test() { # dag_id logical_date log_name
  if ! "$AIRFLOW" dags test "$1" "$2" >"$LOGS/$3.log" 2>&1; then
    tail -40 "$LOGS/$3.log"; echo "demo: airflow dags test $1 $2 failed (log: $LOGS/$3.log)" >&2; exit 1
  fi
  echo "   airflow dags test $1 $2  ok  (log: $LOGS/$3.log)"
}
dags_test streamledger_create_super_stream "$(date -u +%Y-%m-%dT%H:%M:%S+00:00)" create-super-stream

step "4. publish $WAVES waves of $PER_WAVE JSON orders (1 in 25 malformed), one per ${INTERVAL_S}s data interval"
mapfile -t ENDS < <("$PY" - "$URL" "$WAVES" "$PER_WAVE" "$INTERVAL_S" <<'EOF'
import json, math, sys, time
from datetime import UTC, datetime
from streamledger.protocol.rabbitmq import StreamClient
url, waves, per_wave, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = math.ceil(time.time()) + 1
with StreamClient.connect(url) as c:
    parts = c.partitions("demo-events")
    for k in range(waves):
        begin = t0 + k * n
        time.sleep(max(0.0, begin + 0.5 - time.time()))
        by_part = {p: [] for p in parts}
        for i in range(per_wave):
            event = k * per_wave + i
            if event % 25 == 7:  # malformed on purpose: cut short
                body = b'{"order_id": "o-%06d", "amount": ' % event
            else:
                body = json.dumps({
                    "order_id": f"o-{event:06d}", "customer": f"c-{event % 17:02d}",
                    "amount": f"{(event * 37) % 1000}.{event % 100:02d}", "currency": ("EUR", "USD", "GBP")[event % 3],
                    "ordered_at": datetime.fromtimestamp(begin + i * n / per_wave, UTC).isoformat(),
                    "status": ("paid", "paid", "open", "cancelled")[event % 4]}).encode()
            by_part[parts[event % len(parts)]].append(body)
        for p, bodies in by_part.items():
            r = c.publish(p, bodies)
            assert r.confirmed == len(bodies), r
        end = datetime.fromtimestamp(begin + n, UTC)
        print(f"   wave {k}: {per_wave} events in [{datetime.fromtimestamp(begin, UTC):%H:%M:%S}, {end:%H:%M:%S})",
              file=sys.stderr)
        print(end.isoformat())
time.sleep(max(0.0, t0 + waves * n - time.time()))
EOF
)

step "5. backfill: one DAG run of streamledger_backfill per data interval (local Spark, SQLite ledger, $STREAMLEDGER_SINK sink)"
i=0
for end in "${ENDS[@]}"; do
  dags_test streamledger_backfill "$end" "backfill-$i"
  i=$((i + 1))
done

step "6. audit (DAG streamledger_audit) and results"
dags_test streamledger_audit "$(date -u +%Y-%m-%dT%H:%M:%S+00:00)" audit
"$PY" - "$URL" <<'EOF'
import json, os, sys
from pathlib import Path
import pyarrow.parquet as pq
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
ledger = Ledger(os.environ["STREAMLEDGER_LEDGER_URL"])
pipeline = os.environ["STREAMLEDGER_PIPELINE"]
print(f"ledger {os.environ['STREAMLEDGER_LEDGER_URL']}, pipeline {pipeline}:")
print(f"   {'stream':<16} {'range':>14} {'records':>8}  {'status':<10} {'offset stored':<13} run")
for r in sorted(ledger.ranges(pipeline), key=lambda r: (r.source.stream, r.start)):
    rng = f"[{r.start}, {r.end})"
    stored = "verified" if r.offset_verified else ("stored" if r.offset_stored else "-")
    print(f"   {r.source.stream:<16} {rng:>14} {r.records:>8}  {r.status.value:<10} {stored:<13} {r.run.run_id}")
with StreamClient.connect(sys.argv[1]) as c:
    report = audit(ledger, pipeline, broker=c)  # ledger vs broker, published outputs, and the table
    stored = {p: c.query_offset(p, pipeline) for p in c.partitions("demo-events")}
print(f"broker stored offsets for {pipeline}: {stored}")
print("audit:", "CLEAN" if report.clean else "VIOLATIONS")
print("\n".join("   " + line for line in report.to_text().splitlines()))
from streamledger.transform import DEAD_LETTER_DIR
done = [r for r in ledger.ranges(pipeline) if r.status.value == "committed" and r.records]
read = sum(r.records for r in done)
written = sum(r.rows_out or 0 for r in done)
dead = sum(r.dead_letter or 0 for r in done)
print(f"ledger: {read} records read, {written} typed rows written, {dead} malformed records in dead letters "
      f"(transform {', '.join(sorted({r.transform or 'raw' for r in done}))})")
table_rows = None
if os.environ.get("STREAMLEDGER_SINK") == "iceberg":
    from streamledger.batch.sinks import default_iceberg_table
    from streamledger.batch.sinks.iceberg import catalog_properties, load_catalog
    catalog = load_catalog(catalog_properties(None, ledger_url=ledger.url,
                                              output_root=os.environ["STREAMLEDGER_OUTPUT_ROOT"]))
    name = default_iceberg_table(pipeline)
    table = catalog.load_table(name)
    rows = table.scan().to_arrow()
    snaps = [s for s in table.snapshots() if (s.summary.additional_properties if s.summary else {}).get(
        "streamledger.pipeline") == pipeline]
    print(f"Iceberg table {name} (pyiceberg, SQL catalog in the ledger; {table.location()}):")
    print(f"   {len(snaps)} commits by {pipeline}, current snapshot {table.current_snapshot().snapshot_id}")
    print(f"   schema: {', '.join(f'{f.name} {f.field_type}' for f in table.schema().fields)}")
    shown = ["order_id", "customer", "amount", "currency", "amount_usd", "ordered_at", "partition", "source_offset"]
    width = {"ordered_at": 19, "partition": 15}
    print("   " + "  ".join(f"{c:<{width.get(c, 10)}}" for c in shown))
    for row in sorted(rows.select(shown).to_pylist(), key=lambda r: r["order_id"])[:5]:
        row["ordered_at"] = f"{row['ordered_at']:%Y-%m-%d %H:%M:%S}"
        print("   " + "  ".join(f"{str(row[c]):<{width.get(c, 10)}}" for c in shown))
    per = rows.group_by("partition").aggregate([("order_id", "count"), ("amount_usd", "sum")])
    for p in sorted(per.to_pylist(), key=lambda r: r["partition"]):
        print(f"   {p['partition']:<16} {p['order_id_count']:>5} orders  {p['amount_usd_sum']:>12} USD")
    table_rows = rows.num_rows
    ids = rows.column("order_id").to_pylist()
    print(f"   total {table_rows} rows ({len(set(ids))} distinct order ids)")
    if len(ids) != len(set(ids)) or table_rows != written:
        sys.exit("demo: the Iceberg table holds an order twice, or disagrees with the ledger's rows written")
root = Path(os.environ["STREAMLEDGER_OUTPUT_ROOT"]) / pipeline
dead_files = sorted(root.glob(f"*/*/*/{DEAD_LETTER_DIR}/*.parquet"))
dead_rows = [b for f in dead_files for b in pq.read_table(f, columns=["body"]).column("body").to_pylist()]
print(f"dead letters under {root}/<broker>/<partition>/<range>/{DEAD_LETTER_DIR}: {len(dead_rows)} records, e.g. "
      f"{dead_rows[0][:40]!r}" if dead_rows else "dead letters: none")
if not report.clean or len(dead_rows) != dead:
    sys.exit("demo: audit not clean, or the dead letters disagree with the ledger")
EOF
echo
echo "demo finished in $(( $(date +%s) - t0 )) s; Airflow home $AIRFLOW_HOME, logs in $LOGS"
