"""The example backfill DAG as ``make demo`` runs it: JSON order events decoded with a declared schema,
``dags/sql/orders.sql`` (rendered by Airflow as a template, the operator's ``sql_file``) run on each
range inside the batch, malformed bodies in the range's dead letter, the typed rows in an Iceberg
table, under ``airflow dags test``. The table's rows are what plain Python computes from the
published bodies; the ledger's rows and dead letters agree; the DAG's audit task passes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from tests.e2e.conftest import Scenario

pytestmark = [pytest.mark.airflow, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.slow]

SCHEMA = ("order_id STRING, customer STRING, amount DECIMAL(12,2), currency STRING, ordered_at TIMESTAMP, "
          "status STRING")
RATE = {"EUR": Decimal("1.08"), "GBP": Decimal("1.27"), "USD": Decimal("1.00")}


def order(event: int, _wave: int) -> bytes:
    if event % 9 == 4:
        return b'{"order_id": "broken", "amount": '
    return json.dumps({"order_id": f"o-{event:05d}", "customer": f"c-{event % 5}",
                       "amount": f"{event * 3}.{event % 100:02d}",
                       "currency": ("EUR", "USD", "GBP")[event % 3],
                       "ordered_at": datetime.fromtimestamp(1764400000 + event, UTC).isoformat(),
                       "status": ("paid", "cancelled", "open")[(event // 2) % 3]}).encode()


@pytest.mark.timeout(900)
@pytest.mark.warm_spark
def test_the_backfill_dag_lands_typed_orders_through_its_sql_file(scenario: Scenario, tmp_path: Path) -> None:
    env = {"STREAMLEDGER_SINK": "iceberg", "STREAMLEDGER_SQL_FILE": "sql/orders.sql",
           "STREAMLEDGER_BODY_FORMAT": "json", "STREAMLEDGER_BODY_SCHEMA": SCHEMA,
           "STREAMLEDGER_ON_BAD_RECORD": "dead_letter"}
    scenario.create_super_stream()
    (end,) = scenario.publish_waves(waves=1, per_wave=45, body=order)
    scenario.dags_test("streamledger_backfill", end, extra=env)
    states = scenario.af.task_states("streamledger_backfill", end.isoformat())
    assert {t: s["state"] for t, s in states.items()} == {"read_interval": "success", "audit": "success"}

    from streamledger.batch.sinks import default_iceberg_table
    from streamledger.batch.sinks.iceberg import catalog_properties, load_catalog

    ledger = scenario.ledger()
    catalog = load_catalog(catalog_properties(None, ledger_url=ledger.url,
                                              output_root=str(scenario.output_root)))
    rows = catalog.load_table(default_iceberg_table(scenario.pipeline)).scan().to_arrow().to_pylist()
    orders = [json.loads(order(e, 0)) for e in scenario.published if e % 9 != 4]
    want = sorted((o["order_id"], Decimal(o["amount"]) * RATE[o["currency"]]) for o in orders
                  if o["status"] != "cancelled")
    assert sorted((r["order_id"], r["amount_usd"]) for r in rows) == [(i, a.quantize(Decimal("0.01")))
                                                                      for i, a in want]
    done = [r for r in ledger.ranges(scenario.pipeline) if r.records]
    assert sum(r.rows_out or 0 for r in done) == len(rows)
    assert sum(r.dead_letter or 0 for r in done) == sum(1 for e in scenario.published if e % 9 == 4)
    assert len({r.transform for r in done}) == 1 and None not in {r.transform for r in done}
