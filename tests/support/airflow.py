"""An isolated Airflow 3 home for end-to-end tests: SQLite metadata DB, the repo's ``dags/`` folder,
connections from environment variables, and helpers that run the real ``airflow`` CLI.

Why subprocesses: ``airflow dags test`` is what users run, it configures Airflow's ORM and logging
for its own process, and the failure-injection tests kill it outright (``os._exit``), which must not
take pytest down with it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    # set by airflow_components while it runs: start a component again (see crash_and_restart)
    restart: Callable[[str, Mapping[str, str]], subprocess.Popen[bytes]] | None = field(
        default=None, repr=False)
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

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
        _copy_migrated(env, home)
    return af


_MIGRATED: dict[tuple[tuple[str, str], ...], Path] = {}


def _copy_migrated(env: Mapping[str, str], home: Path) -> None:
    """Give ``home`` the metadata database and ``airflow.cfg`` of a home ``airflow db migrate`` made once
    per process for these database and logging settings. Migrating each home again cost it 4 s of CPU
    (10-45 s on two busy cores); a fresh migration holds only what those settings decide (log
    templates, a pool), and the generated ``airflow.cfg`` names its home's paths, renamed here. The
    file also spares a home whose first command starts every component at once their race to write it.
    """
    key = tuple(sorted((k, v) for k, v in env.items()
                       if k.startswith(("AIRFLOW__DATABASE__", "AIRFLOW__LOGGING__"))))
    if key not in _MIGRATED:
        template = Path(tempfile.mkdtemp(prefix="airflow-migrated-"))
        atexit.register(shutil.rmtree, template, ignore_errors=True)
        AirflowHome(home=template, env={**env, "AIRFLOW_HOME": str(template)}).airflow(
            "db", "migrate", timeout=300)
        _MIGRATED[key] = template
    template = _MIGRATED[key]
    shutil.copyfile(template / "airflow.db", home / "airflow.db")
    config = (template / "airflow.cfg").read_text()
    (home / "airflow.cfg").write_text(config.replace(str(template), str(home)))
    (home / "airflow.cfg").chmod(0o600)  # as Airflow writes it: it holds the home's keys


COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _health(api_url: str) -> dict[str, dict[str, object]] | None:
    try:
        with urllib.request.urlopen(f"{api_url}/api/v2/monitor/health", timeout=5) as response:
            data: dict[str, dict[str, object]] = json.loads(response.read())
            return data
    except (OSError, ValueError):
        return None


def _stop(processes: Sequence[subprocess.Popen[bytes]], grace: float = 20.0) -> None:
    """SIGTERM each component's process group (LocalExecutor workers, task processes and uvicorn
    workers are in it), then SIGKILL what is left after ``grace`` seconds."""
    for proc in processes:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    for proc in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group may outlive its leader
        proc.wait()


@contextlib.contextmanager
def airflow_components(af: AirflowHome, *, dags_folder: Path | None = None,
                       env: Mapping[str, str] | None = None, components: Sequence[str] = COMPONENTS,
                       ready_timeout: float = 240.0) -> Iterator[str]:
    """Run the real Airflow components of ``af`` and yield the API server's URL.

    api-server (with the execution API on the same port), scheduler with the LocalExecutor,
    dag-processor and triggerer, each a subprocess in its own process group with its output in
    ``<home>/components/<name>.log``. Ready when ``/api/v2/monitor/health`` reports every started
    component healthy. Everything started here is stopped on exit, by process group. New DAGs are
    paused at creation: unpause the ones a test runs (``af.airflow("dags", "unpause", dag_id, ...)``).
    """
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}"
    logs = af.home / "components"
    logs.mkdir(exist_ok=True)
    settings = {
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": api_url,
        "AIRFLOW__API__WORKERS": "1",
        # every component must sign and check task tokens with the same secret
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__TRIGGERER__CAPACITY": "50",
        # the log servers' default ports (8793/8794) may be taken by another Airflow on the host
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
    }
    if dags_folder is not None:
        settings["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    environ = af.environ({**settings, **(env or {})})
    commands = {
        "api-server": ["api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        "scheduler": ["scheduler"],
        "dag-processor": ["dag-processor"],
        "triggerer": ["triggerer"],
    }
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, extra: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [str(AIRFLOW_BIN), *commands[name]], env={**environ, **(extra or {})}, cwd=af.home,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        processes.append(proc)
        af.running[name] = proc
        return proc

    try:
        for name in components:
            start(name)
        af.restart = start
        wanted = {"scheduler": "scheduler", "dag-processor": "dag_processor", "triggerer": "triggerer"}
        deadline = time.monotonic() + ready_timeout
        while True:
            dead = [(n, p.returncode) for n, p in zip(components, processes, strict=True)
                    if p.poll() is not None]
            if dead:
                name = dead[0][0]
                tail = (logs / f"{name}.log").read_text(errors="replace")[-4000:]
                raise AssertionError(f"airflow {name} exited with {dead[0][1]}:\n{tail}")
            health = _health(api_url)
            if health is not None and all(
                health.get(key, {}).get("status") == "healthy" for n, key in wanted.items() if n in components
            ):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"Airflow components not healthy after {ready_timeout:g}s: {health}")
            time.sleep(0.25)
        yield api_url
    finally:
        af.restart = None
        _stop(processes)


def crash_and_restart(af: AirflowHome, name: str, extra_env: Mapping[str, str] | None = None) -> None:
    """SIGKILL a running component's whole process group (a crash: no cleanup runs), then start it
    again with ``extra_env`` added; the new process is stopped with the others on exit."""
    assert af.restart is not None, "only inside airflow_components"
    proc = af.running[name]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    af.restart(name, extra_env or {})


def ui_plugin_env() -> dict[str, str]:
    """Settings that load the provider's UI plugin (streamledger.plugins.ledger_ui) in an api-server:
    none once the installed package declares its ``airflow.plugins`` entry point; before the venv
    was reinstalled, the provider info's ``plugins`` list, which Airflow reads only when providers
    are not discovered lazily."""
    from importlib.metadata import entry_points

    if any(e.name == "streamledger" for e in entry_points(group="airflow.plugins")):
        return {}
    return {"AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"}


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowHome]:
    """A fresh, migrated Airflow home for this test session."""
    yield make_airflow_home(tmp_path_factory.mktemp("airflow-home"))
