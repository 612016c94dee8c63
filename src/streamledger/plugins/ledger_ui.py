"""The "Stream ledger" page in Airflow's UI: a read-only JSON API over the ledger and one HTML page.

The plugin mounts a FastAPI app on the API server at :data:`URL_PREFIX` and adds an entry to the
UI's navigation (an external view whose ``url_route`` frames the page inside Airflow). Every route,
the page included, depends on Airflow's own authentication: the caller needs read access to DAG
runs, checked by the configured auth manager from the ``Authorization: Bearer`` token or the UI's
session cookie, so an anonymous request is refused with 401.

Which ledger: the Airflow setting ``[streamledger] ui_ledger_conn_id`` (a ``streamledger_ledger``
connection, resolved like :class:`~streamledger.hooks.ledger.OffsetLedgerHook` does), else
``STREAMLEDGER_LEDGER_URL``, else the SQLite file under ``$STREAMLEDGER_HOME``: the same default
the example DAGs and the CLI use. The ledger is opened read-only (never migrated).

Aggregation happens in the database (:mod:`streamledger.ledger.coverage`): a timeline is a list of
merged spans, and the rows behind a span are read a page at a time, so 100,000 ranges load as fast
as a hundred.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from datetime import datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import quote

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from streamledger.hooks.ledger import default_ledger_url, ledger_url_from_connection, polling_ledger
from streamledger.ledger import Ledger, LedgerError
from streamledger.ledger.coverage import RangeRow, coverage, ranges_in, sources

URL_PREFIX = "/streamledger"
SECTION = "streamledger"
AUDIT_OPERATOR = "LedgerAuditOperator"
MAX_SPANS = 2000
MAX_RANGES_PAGE = 1000


def ledger_url() -> tuple[str, str]:
    """The ledger URL and where it came from (``connection <id>``, the variable, or the default)."""
    conn_id = conf.get(SECTION, "ui_ledger_conn_id", fallback="") or ""
    if conn_id:
        from airflow.models.connection import Connection

        try:
            conn = Connection.get_connection_from_secrets(conn_id)
        except Exception as exc:  # AirflowNotFoundException, a secrets backend's error
            raise HTTPException(503, f"[{SECTION}] ui_ledger_conn_id {conn_id!r}: {exc}") from None
        return ledger_url_from_connection(
            host=conn.host, port=conn.port, login=conn.login, password=conn.password, schema=conn.schema,
            extra=conn.extra_dejson,
        ), f"connection {conn_id}"
    from_env = bool(os.environ.get("STREAMLEDGER_LEDGER_URL"))
    where = "STREAMLEDGER_LEDGER_URL" if from_env else "default (STREAMLEDGER_HOME)"
    return default_ledger_url(), where


def _ledger() -> Ledger | None:
    url, where = ledger_url()
    try:
        return polling_ledger(url)
    except LedgerError as exc:
        raise HTTPException(503, f"ledger from {where}: {exc}") from None


def _stale_after() -> timedelta:
    return timedelta(seconds=conf.getfloat(SECTION, "ui_stale_after", fallback=3600.0))


def airflow_root(request: Request) -> str:
    """Airflow's own root path as this request sees it (the app is mounted under it)."""
    root = str(request.scope.get("root_path", ""))
    return root[: -len(URL_PREFIX)] if root.endswith(URL_PREFIX) else root


def run_links(root: str, dag_id: str, run_id: str, task_id: str, map_index: int) -> dict[str, str]:
    """The UI addresses of a ledger row's DAG run and task instance (mapped ones by index)."""
    run = f"{root}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
    ti = f"{run}/tasks/{quote(task_id, safe='')}" + (f"/mapped/{map_index}" if map_index >= 0 else "")
    return {"run_url": run, "ti_url": ti}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _range(root: str, row: RangeRow) -> dict[str, Any]:
    data = asdict(row)
    for key in ("claimed_at", "committed_at", "heartbeat_at", "interval_start", "interval_end"):
        data[key] = _iso(data[key])
    data["pinned"] = bool(row.pinned)
    return {**data, **run_links(root, row.dag_id, row.run_id, row.task_id, row.map_index)}


def _last_audit(root: str, pipeline: str | None) -> dict[str, Any] | None:
    """The newest finished run of the audit operator (covering ``pipeline``) and its verdict."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance)
            .where(TaskInstance.operator == AUDIT_OPERATOR, TaskInstance.end_date.is_not(None))
            .order_by(TaskInstance.end_date.desc())
            .limit(50)
        ).all()
        for ti in tis:
            xcom = session.scalars(
                select(XComModel).where(
                    XComModel.dag_id == ti.dag_id, XComModel.run_id == ti.run_id,
                    XComModel.task_id == ti.task_id, XComModel.map_index == ti.map_index,
                    XComModel.key.in_(("return_value", "audit")),
                ).order_by(XComModel.timestamp.desc())
            ).first()
            report = XComModel.deserialize_value(xcom) if xcom is not None else None
            if isinstance(report, str):
                report = json.loads(report)
            if not isinstance(report, dict):
                report = {}
            covered = report.get("pipelines") or []
            if pipeline is not None and covered and pipeline not in covered:
                continue
            return {
                "dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "map_index": ti.map_index,
                "state": str(ti.state), "end_date": _iso(ti.end_date), "clean": report.get("clean"),
                "checked_at": report.get("checked_at"),
                "violation_counts": report.get("violation_counts", {}),
                "broker_checked": report.get("broker_checked"),
                "outputs_checked": report.get("outputs_checked"),
                **run_links(root, ti.dag_id, ti.run_id, ti.task_id, ti.map_index),
            }
    return None


def create_app() -> FastAPI:
    """The plugin's FastAPI app; every route needs an Airflow user allowed to read DAG runs."""
    app = FastAPI(
        title="streamledger ledger", description="Read-only view of the streamledger offset ledger.",
        dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))],
    )

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        body = resources.files("streamledger.plugins").joinpath("ledger_page.html").read_text("utf-8")
        return HTMLResponse(body, headers={"Cache-Control": "no-store"})

    @app.get("/api/pipelines")
    def pipelines() -> dict[str, Any]:
        """Each pipeline's sources: counts, extent, watermark and the stored offset on record."""
        url, where = ledger_url()
        ledger = _ledger()
        found: dict[str, list[dict[str, Any]]] = {}
        for s in sources(ledger) if ledger is not None else []:
            data = asdict(s)
            data["source"] = asdict(s.source)
            found.setdefault(s.pipeline, []).append(data)
        return {
            "ledger": {"from": where, "dialect": url.split(":", 1)[0], "exists": ledger is not None},
            "pipelines": [{"name": name, "sources": srcs} for name, srcs in found.items()],
        }

    @app.get("/api/pipelines/{pipeline}/coverage")
    def pipeline_coverage(
        pipeline: str, source_id: int | None = None, low: int | None = Query(None, ge=0),
        high: int | None = Query(None, ge=0), max_spans: int = Query(MAX_SPANS, ge=1, le=20000),
    ) -> dict[str, Any]:
        """Merged coverage spans per source with the audit's gaps, unretried failures and stuck claims."""
        ledger = _ledger()
        if ledger is None:
            raise HTTPException(404, f"pipeline {pipeline!r}: the ledger does not exist yet")
        report = ledger.audit(pipeline, stale_after=_stale_after())
        if pipeline not in report.pipelines:
            raise HTTPException(404, f"pipeline {pipeline!r} is not in the ledger")
        spans = coverage(ledger, report, pipeline=pipeline, source_id=source_id, low=low, high=high,
                         max_spans=max_spans)
        return {
            "pipeline": pipeline,
            "audit": {k: v for k, v in report.to_dict().items() if k not in ("violations", "notes")}
            | {"violations": [v.to_dict() for v in report.violations[:200]]},
            "sources": [asdict(c) for c in spans],
        }

    @app.get("/api/sources/{source_id}/ranges")
    def source_ranges(
        request: Request, source_id: int, low: int = Query(0, ge=0), high: int = Query(2**63 - 1, ge=0),
        limit: int = Query(200, ge=1, le=MAX_RANGES_PAGE), after_start: int = -1, after_id: int = -1,
    ) -> dict[str, Any]:
        """The ledger rows of one source in ``[low, high)``, a page at a time, linked to their runs."""
        ledger = _ledger()
        rows = [] if ledger is None else ranges_in(ledger, source_id, low, high, limit=limit,
                                                   after=(after_start, after_id))
        root = airflow_root(request)
        more = {"after_start": rows[-1].start, "after_id": rows[-1].id} if len(rows) == limit else None
        return {"ranges": [_range(root, r) for r in rows], "next": more}

    @app.get("/api/audit/last")
    def last_audit(request: Request, pipeline: str | None = None) -> dict[str, Any]:
        """The verdict of the newest ``LedgerAuditOperator`` task that audited ``pipeline``."""
        return {"last_audit": _last_audit(airflow_root(request), pipeline)}

    return app


class StreamLedgerPlugin(AirflowPlugin):
    """Registered through the ``airflow.plugins`` entry point and the provider's ``plugins``."""

    name = "streamledger"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Stream ledger"}]
    external_views = [{
        "name": "Stream ledger",
        "href": URL_PREFIX.lstrip("/") + "/",
        "url_route": "streamledger",
        "destination": "nav",
        "category": "browse",
    }]
