"""The provider inside a real Airflow home: listed, and its db-manager migrates the ledger tables
into Airflow's own database during ``airflow db migrate``."""

from __future__ import annotations

import sqlite3

import pytest

from tests.support.airflow import AirflowHome

pytestmark = [pytest.mark.airflow]


def test_airflow_lists_the_provider_and_its_hooks(airflow_home: AirflowHome) -> None:
    providers = airflow_home.airflow("providers", "list").stdout
    assert "streamledger" in providers
    hooks = airflow_home.airflow("providers", "hooks").stdout
    for conn_type in ("rabbitmq_stream", "streamledger_ledger", "tubemq"):
        assert conn_type in hooks


def test_db_migrate_installed_the_ledger_at_head(airflow_home: AirflowHome) -> None:
    from streamledger.ledger.migrate import head

    with sqlite3.connect(airflow_home.home / "airflow.db") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        (version,) = db.execute("SELECT version_num FROM streamledger_ledger_version").fetchone()
        triggers = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    assert {"streamledger_pipeline", "streamledger_source", "streamledger_range"} <= tables
    assert "alembic_version" in tables  # Airflow's own history is untouched and separate
    assert version == head()
    assert any(t.startswith("streamledger_range") for t in triggers), triggers
    assert airflow_home.airflow("db", "check-migrations", "-t", "5", check=False).returncode == 0
