"""The "Stream ledger" page (streamledger.plugins.ledger_ui) in a real ``airflow api-server``.

One api-server (the plugin loaded from the provider) over a SQLite ledger of 3,000 ranges with a
planted gap, failed range, lost span and stuck claim per partition; a simple-auth-manager user with
the read-only *viewer* role. Checked over HTTP (auth refused / granted, the JSON) and in headless
Chromium (the page renders, a range links to its DAG run and task instance, the gap shows as a gap).
"""

from __future__ import annotations

import json
import os
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.e2e.conftest import connection_json
from tests.support import ledger_fill
from tests.support.airflow import AirflowHome, airflow_components, ui_plugin_env
from tests.support.browser import headless_chromium

pytestmark = pytest.mark.airflow

PARTITIONS, PER_PARTITION = 3, 1000


@dataclass
class Server:
    url: str
    password: str
    filled: ledger_fill.Filled

    def token(self) -> str:
        body = json.dumps({"username": "ledger", "password": self.password}).encode()
        request = urllib.request.Request(f"{self.url}/auth/token", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(json.loads(response.read())["access_token"])


def get(url: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
            raw = response.read()
            kind = response.headers.get("Content-Type", "")
            return response.status, json.loads(raw) if "json" in kind else raw.decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


@pytest.fixture(scope="module")
def ui_server(airflow_home: AirflowHome, rabbitmq_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("ledger-ui")
    ledger_url = f"sqlite:///{work / 'ledger.sqlite'}"
    filled = ledger_fill.fill(ledger_url, partitions=PARTITIONS, per_partition=PER_PARTITION)
    password = secrets.token_urlsafe(12)
    passwords = work / "passwords.json"
    passwords.write_text(json.dumps({"ledger": password}))
    env = {
        "STREAMLEDGER_LEDGER_URL": ledger_url,
        "STREAMLEDGER_PIPELINE": filled.pipeline,
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": connection_json(rabbitmq_url),
        **ui_plugin_env(),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "ledger:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }
    # The last audit's verdict comes from Airflow: one real run of the example audit DAG (it fails:
    # the ledger has the planted findings), made while the api-server starts.
    with ThreadPoolExecutor(1) as pool:
        audit = pool.submit(airflow_home.dags_test, "streamledger_audit", "2026-02-01T06:00:00+00:00",
                            env=env, check=False)
        with airflow_components(airflow_home, components=("api-server",), env=env) as url:
            assert "LedgerAuditFailed" in audit.result().stdout
            yield Server(url, password, filled)


def test_anonymous_requests_are_refused(ui_server: Server) -> None:
    for path in ("/streamledger/api/pipelines", "/streamledger/", "/streamledger/api/sources/1/ranges"):
        status, body = get(ui_server.url + path)
        assert status == 401, (path, status, body)
    status, _ = get(ui_server.url + "/streamledger/api/pipelines", token="not-a-token")
    assert status in (401, 403)


def test_viewer_token_reads_the_ledger(ui_server: Server) -> None:
    token = ui_server.token()
    status, data = get(ui_server.url + "/streamledger/api/pipelines", token)
    assert status == 200, data
    (pipeline,) = data["pipelines"]
    assert pipeline["name"] == ui_server.filled.pipeline
    assert data["ledger"] == {"from": "STREAMLEDGER_LEDGER_URL", "dialect": "sqlite", "exists": True}
    for src, planted in zip(pipeline["sources"], ui_server.filled.planted, strict=True):
        assert src["source"]["stream"] == planted.stream
        assert src["by_status"] == {"committed": PER_PARTITION - 4, "failed": 1, "lost": 1, "claimed": 1}
        assert src["watermark_end"] == planted.failed[0]  # the failed hole stops the watermark
        assert src["stored_offset"] == planted.failed[0] - 1 and src["stored_agrees"] is True

    status, cov = get(f"{ui_server.url}/streamledger/api/pipelines/{quote(pipeline['name'])}/coverage", token)
    assert status == 200, cov
    assert not cov["audit"]["clean"]
    for src, planted in zip(cov["sources"], ui_server.filled.planted, strict=True):
        spans = {(s["kind"], s["start"], s["end"]) for s in src["spans"]}
        assert ("gap", *planted.gap) in spans
        assert ("failed", *planted.failed) in spans
        assert ("lost", *planted.lost) in spans
        assert ("stuck", *planted.stuck) in spans
        # 1,000 ranges arrive as a handful of merged spans
        assert len(src["spans"]) < 12

    sid = pipeline["sources"][0]["id"]
    status, page = get(f"{ui_server.url}/streamledger/api/sources/{sid}/ranges?low=0&high=1000&limit=5",
                       token)
    assert status == 200, page
    first = page["ranges"][0]
    run = ledger_fill.run_id(0)
    assert (first["start"], first["end"], first["run_id"]) == (0, 100, run)
    assert first["run_url"] == f"/dags/{ledger_fill.DAG_ID}/runs/{quote(run, safe='')}"
    assert first["ti_url"] == first["run_url"] + f"/tasks/{ledger_fill.TASK_ID}/mapped/0"
    assert page["next"] == {"after_start": 400, "after_id": page["ranges"][-1]["id"]}

    status, last = get(f"{ui_server.url}/streamledger/api/audit/last?pipeline={pipeline['name']}", token)
    assert status == 200, last
    audit = last["last_audit"]
    assert audit is not None and audit["dag_id"] == "streamledger_audit"
    assert audit["clean"] is False and audit["violation_counts"]["gap"] == PARTITIONS

    # the UI knows the plugin: its navigation entry and its app
    status, plugins = get(f"{ui_server.url}/api/v2/plugins", token)
    assert status == 200, plugins
    (ours,) = [p for p in plugins["plugins"] if p["name"] == "streamledger"]
    assert ours["external_views"][0]["url_route"] == "streamledger"
    assert ours["fastapi_apps"][0]["url_prefix"] == "/streamledger"


def test_page_in_headless_chromium(ui_server: Server, tmp_path: Path) -> None:
    token = ui_server.token()
    with headless_chromium() as browser:
        browser.get(f"{ui_server.url}/api/v2/monitor/health")  # a page of the origin, for its cookie
        browser.add_cookie("_token", token)  # what Airflow's login leaves in the browser
        browser.get(f"{ui_server.url}/streamledger/")
        rows = browser.wait_for("tr.source-row", count=PARTITIONS)
        assert len(rows) == PARTITIONS
        browser.wait_for("tr.source-row .seg", count=PARTITIONS * 5)
        browser.wait_for(".last-audit a.audit-ti")

        for planted in ui_server.filled.planted:
            row = f'tr.source-row[data-stream="{planted.stream}"]'
            start, end = planted.gap
            gaps = browser.find_all(f'{row} .seg.gap[data-start="{start}"][data-end="{end}"]')
            assert len(gaps) == 1, f"no gap drawn for {planted.stream}"
            assert browser.find_all(f'{row} .seg.stuck[data-start="{planted.stuck[0]}"]')
        findings = browser.script('return document.querySelector("tr.source-row .findings").textContent;')
        assert "1 gap" in findings and "1 failed" in findings and "1 stuck" in findings

        # a committed span opens its ranges, each linked to its DAG run and task instance
        (first,) = browser.find_all('tr.source-row[data-stream="events-0"] .seg.committed[data-start="0"]')
        browser.click(first)
        links = browser.wait_for("#ranges a.run", count=5)
        run = ledger_fill.run_id(0)
        expected = f"{ui_server.url}/dags/{ledger_fill.DAG_ID}/runs/{quote(run, safe='')}"
        assert browser.prop(links[0], "href") == expected
        ti = browser.find_all("#ranges a.ti")[0]
        assert browser.prop(ti, "href") == expected + f"/tasks/{ledger_fill.TASK_ID}/mapped/0"
        assert browser.attribute(links[0], "target") == "_top"  # leaves Airflow's frame for the run

        # the gap: no rows of its own, the ranges on either side of it
        gap = ui_server.filled.planted[0].gap
        (seg,) = browser.find_all(f'tr.source-row[data-stream="events-0"] .seg.gap[data-start="{gap[0]}"]')
        browser.click(seg)
        browser.wait_for("#ranges tr.range", count=2)
        title = browser.script('return document.getElementById("detail-title").textContent;')
        assert "gap" in title and "no range covers" in title
        spans = browser.script(
            'return [...document.querySelectorAll("#ranges tr.range td:nth-child(2)")]'
            '.map(td => td.textContent);')
        assert spans == [f"[{gap[0] - 100}, {gap[0]})", f"[{gap[1]}, {gap[1] + 100})"]

        shot = Path(os.environ.get("STREAMLEDGER_UI_SCREENSHOT") or tmp_path / "ledger-ui.png")
        browser.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
