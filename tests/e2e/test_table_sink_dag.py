"""Issue 21 item 7: the example backfill DAG into an Iceberg table under ``airflow dags test``.

``STREAMLEDGER_SINK=iceberg`` picks the sink; the catalog is not the default one but a pyiceberg SQL
catalog in its own PostgreSQL database, given as an Airflow connection whose extra JSON holds the
properties, a password in its URI and a secret key among them. The run lands one interval in the
table (every record once, the ranges recorded against the table), the DAG's audit task checks the
table through the same connection, and neither secret appears in the task output, the task log
files or Airflow's metadata database (rendered fields, XComs).
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import Scenario
from tests.support.postgres import create_database, drop_database

pytestmark = [pytest.mark.airflow, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.postgres,
              pytest.mark.slow]


@pytest.mark.timeout(900)
@pytest.mark.warm_spark
def test_backfill_dag_lands_in_iceberg_catalog_from_connection(scenario: Scenario, postgres_server: str,
                                                               tmp_path: Path) -> None:
    password, key = f"pw-{secrets.token_hex(8)}", f"sk-{secrets.token_hex(8)}"
    db = f"sl_catalog_{uuid.uuid4().hex[:10]}"
    plain = create_database(postgres_server, db)  # trust auth on loopback: the password is carried, unused
    uri = plain.replace("postgresql+psycopg://postgres@", f"postgresql+psycopg://postgres:{password}@", 1)
    assert password in uri
    props = {"type": "sql", "uri": uri, "warehouse": (tmp_path / "warehouse").as_uri(),
             "s3.secret-access-key": key}
    table = f"lake.{scenario.pipeline.replace('-', '_')}"
    env = {
        "STREAMLEDGER_SINK": "iceberg", "STREAMLEDGER_TABLE": table,
        "STREAMLEDGER_CATALOG_CONN_ID": "lake_catalog",
        "AIRFLOW_CONN_LAKE_CATALOG": json.dumps({"conn_type": "generic", "extra": props}),
    }
    try:
        scenario.create_super_stream()
        (end,) = scenario.publish_waves(waves=1, per_wave=30)
        out = scenario.dags_test("streamledger_backfill", end, extra=env)
        states = scenario.af.task_states("streamledger_backfill", end.isoformat())
        assert {t: s["state"] for t, s in states.items()} == {"read_interval": "success", "audit": "success"}

        from streamledger.batch.sinks.iceberg import load_catalog

        rows = load_catalog(props).load_table(table).scan(selected_fields=("stream", "offset")).to_arrow()
        seen = Counter(zip(rows.column("stream").to_pylist(), rows.column("offset").to_pylist(), strict=True))
        assert len(seen) == len(scenario.published) == rows.num_rows  # every record once
        ranges = [r for r in scenario.ledger().ranges(scenario.pipeline) if r.records]
        assert ranges and all(r.sink_table == f"iceberg:{table}" and r.published_at for r in ranges)

        logs = [out] + [p.read_text(errors="replace") for p in (scenario.af.home / "logs").rglob("*")
                        if p.is_file()]
        metadata_db = (scenario.af.home / "airflow.db").read_bytes()
        for secret in (password, key):
            assert not any(secret in text for text in logs), f"{secret[:3]}… reached a log"
            assert secret.encode() not in metadata_db, f"{secret[:3]}… reached Airflow's metadata DB"
    finally:
        drop_database(postgres_server, db)
