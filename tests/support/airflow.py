"""An isolated Airflow 3 home for end-to-end tests: SQLite metadata DB, the repo's ``dags/`` folder,
connections from environment variables, and helpers that run the real ``airflow`` CLI.

Why subprocesses: ``airflow dags test`` is what users run, it configures Airflow's ORM and logging
for its own process, and the failure-injection tests kill it outright (``os._exit``), which must not
take pytest down with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_BIN = Path(sys.executable).with_name("airflow")


@dataclass
class AirflowHome:
    """One AIRFLOW_HOME; ``env`` is the base environment every command gets."""

    home: Path
    env: dict[str, str] = field(default_factory=dict)
    timings: list[tuple[str, float]] = field(default_factory=list)

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        merged = dict(os.environ)
        merged.update(self.env)
        merged.update(extra or {})
        return merged

    def airflow(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 600,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``airflow ARGS``; on failure with ``check`` the assertion shows the output's tail."""
        proc = subprocess.run(
            [str(AIRFLOW_BIN), *args], env=self.environ(env), cwd=self.home, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-6000:]}")
        return proc

    def dags_test(self, dag_id: str, logical_date: str, *, env: Mapping[str, str] | None = None,
                  check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        began = time.monotonic()
        try:
            return self.airflow("dags", "test", dag_id, logical_date, env=env, check=check, timeout=timeout)
        finally:
            self.timings.append((dag_id, time.monotonic() - began))

    def python(self, code: str, *, env: Mapping[str, str] | None = None) -> str:
        """Run Python with this home's environment (for reading Airflow state after a run)."""
        proc = subprocess.run(
            [sys.executable, "-c", code], env=self.environ(env), cwd=self.home, text=True,
            capture_output=True, timeout=120, check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(f"python helper failed:\n{proc.stderr[-4000:]}")
        return proc.stdout

    def task_states(self, dag_id: str, logical_date: str) -> dict[str, dict[str, object]]:
        """``{task_id: {"state": ..., "try_number": ...}}`` of the run ``dags test`` made for the date."""
        code = f"""
import json
from airflow.utils.session import create_session
from airflow.models.taskinstance import TaskInstance
from airflow.models.dagrun import DagRun
from airflow.sdk import timezone
from sqlalchemy import select
with create_session() as s:
    when = timezone.parse({logical_date!r})
    dr = s.scalars(select(DagRun).where(DagRun.dag_id == {dag_id!r}, DagRun.logical_date == when)).one()
    tis = s.scalars(select(TaskInstance).where(TaskInstance.dag_id == dr.dag_id,
                                               TaskInstance.run_id == dr.run_id)).all()
    print(json.dumps({{ti.task_id: {{"state": str(ti.state), "try_number": ti.try_number}} for ti in tis}}))
"""
        result: dict[str, dict[str, object]] = json.loads(self.python(code).strip().splitlines()[-1])
        return result

    def fail_running_tasks(self, dag_id: str) -> int:
        """What the scheduler does to a task whose process died (missed heartbeats): mark it failed.

        ``dags test`` has no scheduler, so after a killed run the test performs this one step itself.
        """
        code = f"""
from airflow.utils.session import create_session
from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import TaskInstanceState
from sqlalchemy import select
with create_session() as s:
    tis = s.scalars(select(TaskInstance).where(TaskInstance.dag_id == {dag_id!r},
                                               TaskInstance.state == TaskInstanceState.RUNNING)).all()
    for ti in tis:
        ti.state = TaskInstanceState.FAILED
    print(len(tis))
"""
        return int(self.python(code).strip().splitlines()[-1])


def make_airflow_home(home: Path, *, extra_env: Mapping[str, str] | None = None) -> AirflowHome:
    """Create (idempotently) an Airflow home whose DAG folder is the repo's ``dags/``."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
    }
    env.update(extra_env or {})
    # The tests' cluster policy (a kill switch for the batch operator) lives in $AIRFLOW_HOME/config.
    (home / "config").mkdir(exist_ok=True)
    policy = Path(__file__).parent / "airflow_policy" / "airflow_local_settings.py"
    (home / "config" / "airflow_local_settings.py").write_text(policy.read_text())
    af = AirflowHome(home=home, env=env)
    if not (home / "airflow.db").exists():
        af.airflow("db", "migrate", timeout=300)
    return af


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowHome]:
    """A fresh, migrated Airflow home for this test session."""
    yield make_airflow_home(tmp_path_factory.mktemp("airflow-home"))
