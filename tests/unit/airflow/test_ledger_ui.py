"""The Stream ledger plugin's settings and links (the page itself: tests/e2e/test_ledger_ui.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi import HTTPException

from streamledger.plugins import ledger_ui


def test_ledger_from_the_configured_connection_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "ui-ledger.sqlite"
    monkeypatch.setenv("STREAMLEDGER_LEDGER_URL", "sqlite:////elsewhere.sqlite")
    monkeypatch.setenv("AIRFLOW_CONN_UI_LEDGER", json.dumps({"conn_type": "streamledger_ledger",
                                                             "schema": str(path)}))
    monkeypatch.setenv("AIRFLOW__STREAMLEDGER__UI_LEDGER_CONN_ID", "ui_ledger")
    assert ledger_ui.ledger_url() == (f"sqlite:///{path}", "connection ui_ledger")
    monkeypatch.setenv("AIRFLOW__STREAMLEDGER__UI_LEDGER_CONN_ID", "no_such_conn")
    with pytest.raises(HTTPException) as refused:
        ledger_ui.ledger_url()
    assert refused.value.status_code == 503 and "no_such_conn" in str(refused.value.detail)


def test_ledger_from_the_variable_then_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AIRFLOW__STREAMLEDGER__UI_LEDGER_CONN_ID", raising=False)
    monkeypatch.setenv("STREAMLEDGER_LEDGER_URL", "sqlite:////var/tmp/x.sqlite")
    assert ledger_ui.ledger_url() == ("sqlite:////var/tmp/x.sqlite", "STREAMLEDGER_LEDGER_URL")
    monkeypatch.delenv("STREAMLEDGER_LEDGER_URL")
    monkeypatch.setenv("STREAMLEDGER_HOME", str(tmp_path))
    expected = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    assert ledger_ui.ledger_url() == (expected, "default (STREAMLEDGER_HOME)")


def test_run_links_quote_ids_and_name_mapped_instances() -> None:
    links = ledger_ui.run_links("/airflow", "dag a", "scheduled__2026-01-01T00:00:00+00:00", "batch", 2)
    run = "/airflow/dags/dag%20a/runs/scheduled__2026-01-01T00%3A00%3A00%2B00%3A00"
    assert links == {"run_url": run, "ti_url": f"{run}/tasks/batch/mapped/2"}
    assert ledger_ui.run_links("", "d", "r", "t", -1)["ti_url"] == "/dags/d/runs/r/tasks/t"


def test_plugin_declares_its_app_and_nav_entry() -> None:
    plugin = ledger_ui.StreamLedgerPlugin
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == ledger_ui.URL_PREFIX == "/streamledger"
    (view,) = plugin.external_views
    assert view["href"] == "streamledger/" and view["url_route"] == "streamledger"
    # every route carries Airflow's access check (the e2e test proves anonymous requests get 401)
    assert app["app"].router.dependencies
