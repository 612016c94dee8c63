"""The servers a chaos run owns: a private PostgreSQL cluster, a private RabbitMQ node and Airflow 3.

Why private: a chaos run restarts its broker and its database on purpose. Doing that to the shared
4.3 broker or the test suite's PostgreSQL cluster would break whatever else runs on the machine, so
each run starts its own PostgreSQL cluster (``scripts/postgres.sh`` with its own home and port) and
its own node of the provisioned 4.3 broker (``scripts/rabbitmq.sh`` with
``STREAMLEDGER_RABBITMQ_INSTANCE``), and throws both away at the end.

Airflow runs as its real components (api-server, scheduler with the LocalExecutor, dag-processor,
triggerer), each a subprocess in its own session with its log in the run's directory, talking to
each other through an SQLite metadata database and the execution API on a free loopback port.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_BIN = Path(sys.executable).with_name("airflow")
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


class ServerError(RuntimeError):
    """A server of the chaos run could not be started, stopped or asked something."""


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run(cmd: list[str], env: Mapping[str, str], timeout: float, what: str) -> str:
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        raise ServerError(f"{what} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}")
    return proc.stdout


# ---------------------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------------------


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster under ``home`` on ``port`` (``scripts/postgres.sh`` does the work)."""

    home: Path
    port: int = field(default_factory=free_port)
    restarts: int = 0

    @property
    def _env(self) -> dict[str, str]:
        return {"STREAMLEDGER_HOME": str(self.home), "STREAMLEDGER_PG_PORT": str(self.port)}

    def start(self) -> str:
        """Start (initialising on first use) and return the admin URL (database ``postgres``)."""
        self.home.mkdir(parents=True, exist_ok=True)
        out = _run([str(REPO / "scripts" / "postgres.sh"), "start"], self._env, 600, "postgres.sh start")
        return out.strip().splitlines()[-1]

    def stop(self) -> None:
        _run([str(REPO / "scripts" / "postgres.sh"), "stop"], self._env, 120, "postgres.sh stop")

    def restart(self, down_for: float = 2.0) -> float:
        """Stop (fast mode: open transactions are rolled back, clients see errors), wait, start."""
        began = time.monotonic()
        self.stop()
        time.sleep(down_for)
        self.start()
        self.restarts += 1
        return time.monotonic() - began

    def create_database(self, name: str) -> str:
        import psycopg

        admin = self.start()
        dsn = admin.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{name}"')
        return admin.rsplit("/", 1)[0] + f"/{name}"

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.home / "pg", ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# RabbitMQ
# ---------------------------------------------------------------------------------------------

# Must match select_version() in scripts/rabbitmq.sh (4.3): stream, amqp, mgmt, dist, epmd.
_BASE_PORTS_43 = (5552, 5672, 15672, 25672, 4369)


@dataclass
class PrivateBroker:
    """A private node of the provisioned RabbitMQ 4.3 (own node name, ports, config and data).

    ``broker_home`` is the ``STREAMLEDGER_HOME`` where 4.3 is (or gets) provisioned; the node's
    state lives there under ``rabbitmq/4.3/instances/<instance>`` and inside the chroot.
    """

    broker_home: Path
    instance: str = field(default_factory=lambda: f"chaos{os.getpid()}")
    offset: int = 0
    restarts: int = 0

    @staticmethod
    def _free_offset() -> int:
        for offset in range(1000, 3000, 17):
            if not any(port_open(p + offset) for p in _BASE_PORTS_43):
                return offset
        raise ServerError("no free port block for a private RabbitMQ node (tried offsets 1000-3000)")

    @property
    def stream_port(self) -> int:
        return _BASE_PORTS_43[0] + self.offset

    @property
    def url(self) -> str:
        return f"rabbitmq-stream://guest:guest@127.0.0.1:{self.stream_port}/"

    @property
    def _env(self) -> dict[str, str]:
        return {
            "STREAMLEDGER_HOME": str(self.broker_home),
            "STREAMLEDGER_RABBITMQ_INSTANCE": self.instance,
            "STREAMLEDGER_RABBITMQ_PORT_OFFSET": str(self.offset),
        }

    def _script(self, *args: str, timeout: float = 300, instance: bool = True) -> str:
        env = self._env if instance else {"STREAMLEDGER_HOME": str(self.broker_home)}
        return _run([str(REPO / "scripts" / "rabbitmq.sh"), *args], env, timeout,
                    f"rabbitmq.sh {' '.join(args)} (instance {self.instance})")

    def start(self) -> None:
        """Provision if needed, pick a free port block and start, under a lock: two chaos runs
        starting at once must not pick the same block."""
        import fcntl

        self._script("provision", "4.3", timeout=900, instance=False)  # the shared installation
        lock_path = self.broker_home / "rabbitmq" / ".chaos-instances.lock"
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            if not self.offset:
                self.offset = self._free_offset()
            self._script("start", "4.3")
            self._script("wait", "4.3", "180", timeout=240)

    def stop(self) -> None:
        self._script("stop", "4.3", timeout=120)

    def restart(self, down_for: float = 2.0) -> float:
        began = time.monotonic()
        self.stop()
        time.sleep(down_for)
        self._script("start", "4.3")
        self._script("wait", "4.3", "180", timeout=240)
        self.restarts += 1
        return time.monotonic() - began

    def destroy(self) -> None:
        try:
            if self.offset:  # never started: nothing to stop (and no other node's epmd to hit)
                self.stop()
        finally:
            base = self.broker_home / "rabbitmq" / "4.3"
            shutil.rmtree(base / "instances" / self.instance, ignore_errors=True)
            shutil.rmtree(base / "rootfs" / "etc" / "rabbitmq-instances" / self.instance, ignore_errors=True)
            shutil.rmtree(base / "rootfs" / "var" / "lib" / "rabbitmq" / "instances" / self.instance,
                          ignore_errors=True)


def connection_json(url: str) -> str:
    """The ``rabbitmq_stream`` Airflow connection (JSON form) for a plain loopback URL."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    return json.dumps({
        "conn_type": "rabbitmq_stream", "host": parts.hostname, "port": parts.port or 5552,
        "login": unquote(parts.username or "guest"), "password": unquote(parts.password or "guest"),
        "schema": "/",
    })


# ---------------------------------------------------------------------------------------------
# Airflow
# ---------------------------------------------------------------------------------------------


@dataclass
class AirflowCluster:
    """Airflow 3's four components as subprocesses sharing one ``AIRFLOW_HOME``.

    ``env`` is added to every component's environment (the DAG settings, the broker connection,
    the ledger URL); tasks inherit it from the scheduler's LocalExecutor workers.
    """

    home: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _token: str | None = None

    def environ(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        paths = [str(REPO / "src"), str(REPO), base.get("PYTHONPATH", "")]
        pythonpath = os.pathsep.join(p for p in paths if p)
        return {
            **base,
            "PYTHONPATH": pythonpath,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{self.port}",
            "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret(),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            # A task whose whole process tree was killed is noticed by missed heartbeats; the
            # default (5 minutes) would stall a chaos run.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            **self.env,
        }

    def _jwt_secret(self) -> str:
        path = self.home / ".jwt_secret"
        if not path.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_hex(32))
        return path.read_text().strip()

    def cli(self, *args: str, timeout: float = 600) -> str:
        proc = subprocess.run([str(AIRFLOW_BIN), *args], env=self.environ(), cwd=self.home, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise ServerError(f"airflow {' '.join(args)} exited {proc.returncode}: {proc.stdout[-3000:]}")
        return proc.stdout

    def start(self, timeout: float = 300) -> None:
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        self.cli("db", "migrate", timeout=600)
        env = self.environ()
        for name in COMPONENTS:
            log = open(self.home / "logs" / f"{name}.out", "ab")  # noqa: SIM115 - owned by the child
            self.procs[name] = subprocess.Popen(
                [str(AIRFLOW_BIN), name], env=env, cwd=self.home, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            health = self._health()
            if health and all(
                (health.get(k) or {}).get("status") == "healthy"
                for k in ("metadatabase", "scheduler", "dag_processor", "triggerer")
            ):
                return
            time.sleep(0.5)
        raise ServerError(f"Airflow did not become healthy in {timeout:.0f}s; last health {self._health()}")

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.home / "logs" / f"{name}.out").read_text(errors="replace")[-3000:]
                raise ServerError(f"airflow {name} exited {proc.returncode}:\n{tail}")

    def _health(self) -> dict[str, Any] | None:
        import httpx

        try:
            r = httpx.get(f"http://127.0.0.1:{self.port}/api/v2/monitor/health", timeout=5)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self) -> None:
        """SIGTERM each component's session (its task processes too), SIGKILL what is left."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    # -- REST API (the public v2 API, as an operator's tooling would use it) -------------------

    def _headers(self) -> dict[str, str]:
        import httpx

        if self._token is None:
            r = httpx.get(f"http://127.0.0.1:{self.port}/auth/token", timeout=30)
            r.raise_for_status()
            self._token = r.json()["access_token"]
        return {"Authorization": f"Bearer {self._token}"}

    def api(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None,
            ok: tuple[int, ...] = (200,)) -> Any:
        import httpx

        url = f"http://127.0.0.1:{self.port}/api/v2/{path.lstrip('/')}"
        for attempt in range(5):
            try:
                r = httpx.request(method, url, json=body, params=params, headers=self._headers(), timeout=60)
            except httpx.HTTPError as exc:
                if attempt == 4:
                    raise ServerError(f"{method} {path}: {exc}") from exc
                time.sleep(2)
                continue
            if r.status_code == 401:
                self._token = None
                continue
            if r.status_code == 500 and "Database error" in r.text and attempt < 4:
                # Airflow's SQLite metadata database stayed locked past its 5 s busy timeout (a
                # loaded machine: the scheduler's writes); the request's transaction was rolled back
                # whole, so it is asked again, as an operator's tooling would
                time.sleep(2 * (attempt + 1))
                continue
            if r.status_code not in ok:
                raise ServerError(f"{method} {path}: HTTP {r.status_code} {r.text[:500]}")
            return r.json() if r.content else None
        raise ServerError(f"{method} {path}: not authorised")

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = self.api("GET", f"dags/{quote(dag_id)}/dagRuns",
                            params={"limit": 100, "offset": len(out), "order_by": "logical_date"})
            out.extend(page["dag_runs"])
            if len(out) >= page["total_entries"] or not page["dag_runs"]:
                return out

    def task_instances(self, dag_id: str, **params: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = self.api("GET", f"dags/{quote(dag_id)}/dagRuns/~/taskInstances",
                            params={"limit": 100, "offset": len(out), **params})
            out.extend(page["task_instances"])
            if len(out) >= page["total_entries"] or not page["task_instances"]:
                return out

