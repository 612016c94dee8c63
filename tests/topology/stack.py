"""The production topology on one machine, sharing nothing but services (issue 35).

``scripts/topology.sh up|down|status`` drives this module. Everything is on loopback, on a fixed
port block (29xxx) that none of the test suite's servers use, below Linux's ephemeral range
(32768-60999: on the 57xxx block first used, a client's outgoing connection held the S3 server's
and the api-server's port at start, one failed run each), with its state under
``$STREAMLEDGER_TOPOLOGY_HOME`` (default ``/var/tmp/streamledger-topology``):

* Redis (Debian's ``redis-server``, installed with apt if absent): the Celery broker;
* PostgreSQL (``scripts/postgres.sh`` with its own home and port): Airflow's metadata database
  ``airflow`` and the ledger ``ledger`` (the Iceberg SQL catalog, when used, lives there too);
* the project's 3-node RabbitMQ 4.3 cluster (``scripts/rabbitmq.sh ... cluster``, stream ports
  5601-5603);
* a Spark standalone master and two workers from the pyspark installation (``spark-class``);
* Airflow 3 with the CeleryExecutor: api-server, scheduler, dag-processor, triggerer, and two
  Celery workers, each with its own working directory, ``AIRFLOW_HOME`` (logs),
  ``STREAMLEDGER_HOME`` and ``TMPDIR``;
* the object store: moto's S3-compatible server (the one ``tests/support/s3.py`` runs, here on its own
  port) with one bucket, the output root of the DAG; its credentials are random, kept in files
  under the topology home, and reach the workers in their environment (``AWS_*``) only, never on a
  command line;
* with ``--spark connect`` (the DAG setting ``STREAMLEDGER_SPARK_CONNECT_CONN_ID``): a Spark Connect
  server in front of that cluster (its driver is one more process here, its executors on the Spark
  workers); the batch's tasks are its gRPC clients instead of each running a spark-submit driver;
* Spark defaults for the jobs every worker submits (``spark/conf/spark-defaults.conf`` through
  ``SPARK_CONF_DIR``): one 1-core 512 MB executor per job, so four jobs share the cluster's four
  cores instead of the first one taking them all.

Each long-running process is started in its own session with its pid in ``run/<name>.pid`` and
its output in ``logs/<name>.log``; ``up`` skips what is already running, ``down`` stops by those
pids (process groups), then PostgreSQL and the RabbitMQ cluster through their scripts.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from streamledger.processes import process_start, same_process
from streamledger.spark.session import QUICK_START_JAVA_OPTIONS

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"

REDIS_PORT = 29379
PG_PORT = 29432
API_PORT = 29080
SPARK_MASTER_PORT = 29077
SPARK_MASTER_UI = 29078
SPARK_WORKER_UI = (29091, 29092)
WORKER_LOG_PORTS = (29093, 29094)
S3_PORT = 29960
SPARK_CONNECT_PORT = 29015
CLUSTER_STREAM_PORTS = (5601, 5602, 5603)  # scripts/rabbitmq.sh's cluster nodes rabbitc1..3
WORKERS = ("w1", "w2")
SPARK_WORKERS = ("spark-worker-1", "spark-worker-2")
AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
BUCKET = "streamledger-topology"
# What a job submitted from a worker asks of the standalone cluster (spark-defaults.conf). Without
# spark.cores.max a standalone application takes every free core: the first of four concurrent
# batches got both workers' cores and the other three waited for it (measured: 2-5 min a batch).
SPARK_DEFAULTS = {
    "spark.cores.max": "1",
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.driver.memory": "512m",
    "spark.ui.enabled": "false",
    # a batch reads a few thousand records: C1 only and the serial collector (the product's quick start)
    "spark.driver.extraJavaOptions": QUICK_START_JAVA_OPTIONS,
    "spark.executor.extraJavaOptions": QUICK_START_JAVA_OPTIONS,
}
# The Connect server is one long-lived application for every batch: it takes all four cores of the
# cluster (four 1-core executors) and shares them between concurrent batches (FAIR), and its driver
# holds up to four sessions' plans at once.
CONNECT_CONF = {
    "spark.cores.max": "4",
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.driver.memory": "1g",
    "spark.scheduler.mode": "FAIR",
}
SPARK_MODES = ("submit", "connect")


class TopologyError(RuntimeError):
    """A part of the topology could not be started, stopped or reached."""


def home() -> Path:
    return Path(os.environ.get("STREAMLEDGER_TOPOLOGY_HOME", "/var/tmp/streamledger-topology"))


def _log(msg: str) -> None:
    print(f"topology: {msg}", file=sys.stderr, flush=True)


def port_open(port: int, timeout: float = 0.5) -> bool:
    import socket

    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _run(cmd: list[str], env: Mapping[str, str], timeout: float, what: str) -> str:
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        raise TopologyError(f"{what} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}")
    return proc.stdout


# ---------------------------------------------------------------------------------------------
# Where things are (one place; the chaos harness and the docs read the same names)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def output_root(self) -> str:
        return f"s3://{BUCKET}/output"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{HOST}:{S3_PORT}"

    @property
    def spark_conf_dir(self) -> Path:
        return self.root / "spark" / "conf"

    @property
    def airflow_home(self) -> Path:
        return self.root / "airflow"

    def worker_dir(self, name: str) -> Path:
        return self.root / "workers" / name

    @property
    def pg_url(self) -> str:
        return f"postgresql+psycopg://postgres@{HOST}:{PG_PORT}"

    @property
    def ledger_url(self) -> str:
        return f"{self.pg_url}/ledger"

    @property
    def broker_url(self) -> str:
        return f"rabbitmq-stream://guest:guest@{HOST}:{CLUSTER_STREAM_PORTS[0]}/"

    @property
    def spark_master(self) -> str:
        return f"spark://{HOST}:{SPARK_MASTER_PORT}"

    def pidfile(self, name: str) -> Path:
        return self.run / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        """The recorded process of ``name`` while it runs: pid and start time (a bare pid of an
        older record is believed while it runs; see streamledger.processes)."""
        try:
            fields = self.pidfile(name).read_text().split()
            pid, started = int(fields[0]), (int(fields[1]) if len(fields) > 1 else None)
        except (OSError, ValueError, IndexError):
            return None
        return pid if same_process(pid, started) else None


def layout() -> Layout:
    return Layout(home())


def _secret(lay: Layout, name: str) -> str:
    path = lay.root / f".{name}"
    if not path.exists():
        lay.root.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    return path.read_text().strip()


def s3_env(lay: Layout) -> dict[str, str]:
    """How every worker (and the chaos run's checks) reaches the object store: the usual ``AWS_*``
    environment pyarrow reads. The secret is random per topology home and lives in a 0600 file."""
    return {
        "AWS_ACCESS_KEY_ID": "AKIA" + _secret(lay, "s3_access_key")[:16].upper(),
        "AWS_SECRET_ACCESS_KEY": _secret(lay, "s3_secret_key"),
        "AWS_ENDPOINT_URL": lay.s3_endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


# ---------------------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------------------


def dag_settings(lay: Layout) -> dict[str, str]:
    """The DAG's settings and connections: the same on every Airflow component and worker.

    The batch job goes through spark-submit in client mode to the standalone master: the driver
    runs on the Celery worker that runs the task, the executors on the Spark workers.
    """
    from urllib.parse import urlsplit

    broker = urlsplit(lay.broker_url)
    env = {
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": json.dumps({
            "conn_type": "rabbitmq_stream", "host": broker.hostname, "port": broker.port,
            "login": "guest", "password": "guest", "schema": "/",
            # the cluster's other nodes: a try starting while the first is stopped connects anyway
            "extra": {"nodes": ",".join(f"{HOST}:{p}" for p in CLUSTER_STREAM_PORTS[1:])}}),
        "AIRFLOW_CONN_SPARK_TOPOLOGY": json.dumps({
            "conn_type": "spark", "host": f"spark://{HOST}", "port": SPARK_MASTER_PORT,
            "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"}}),
        "AIRFLOW_CONN_SPARK_CONNECT_TOPOLOGY": json.dumps({
            "conn_type": "spark_connect", "host": HOST, "port": SPARK_CONNECT_PORT}),
        "STREAMLEDGER_LEDGER_URL": lay.ledger_url,
        "STREAMLEDGER_OUTPUT_ROOT": lay.output_root,
    }
    env.update(spark_settings("submit"))
    return env


def spark_settings(mode: str) -> dict[str, str]:
    """The DAG settings that pick where the batch's jobs run: ``submit`` (spark-submit to the
    standalone master, the driver on the Celery worker) or ``connect`` (the Connect server in front
    of the same cluster). The operator refuses both at once, so the other one is set empty."""
    if mode not in SPARK_MODES:
        raise TopologyError(f"spark mode {mode!r}: use one of {', '.join(SPARK_MODES)}")
    connect = mode == "connect"
    return {"STREAMLEDGER_SPARK_CONN_ID": "" if connect else "spark_topology",
            "STREAMLEDGER_SPARK_CONNECT_CONN_ID": "spark_connect_topology" if connect else ""}


def spark_mode(lay: Layout) -> str:
    """The mode the DAG settings of the next ``up`` pick."""
    return "connect" if airflow_env(lay).get("STREAMLEDGER_SPARK_CONNECT_CONN_ID") else "submit"


def airflow_env(lay: Layout, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Airflow's configuration for every component and worker (one place)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    paths = [str(REPO / "src"), str(REPO), base.get("PYTHONPATH", "")]
    db = f"{lay.pg_url}/airflow"
    api = f"http://{HOST}:{API_PORT}"
    env = {
        **base,
        "PATH": f"{BIN}{os.pathsep}{base.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "AIRFLOW_HOME": str(lay.airflow_home),
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db,
        # psycopg 3 for Airflow's async engine too (its default driver, asyncpg, is not installed)
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": db,
        "AIRFLOW__CELERY__BROKER_URL": f"redis://{HOST}:{REDIS_PORT}/0",
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{db}",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
        # a task whose worker died is redelivered by Redis after this (the default is 6 hours)
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "600",
        "AIRFLOW__CORE__PARALLELISM": "8",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
        "AIRFLOW__API__HOST": HOST,
        "AIRFLOW__API__PORT": str(API_PORT),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": api,
        "AIRFLOW__API_AUTH__JWT_SECRET": _secret(lay, "jwt_secret"),
        "AIRFLOW__API__SECRET_KEY": _secret(lay, "api_secret"),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
        # a task whose worker was SIGKILLed is noticed by missed heartbeats (default 5 minutes)
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "SPARK_LOCAL_IP": HOST,
        "SPARK_HOME": str(spark_home()),
        "SPARK_CONF_DIR": str(lay.spark_conf_dir),
        "PYSPARK_PYTHON": sys.executable,
        "STREAMLEDGER_HOME": str(lay.root / "home"),
        **dag_settings(lay),
        **_dag_overrides(lay),
    }
    env.update(extra or {})
    return env


def write_dag_settings(lay: Layout, settings: Mapping[str, str]) -> None:
    """DAG settings (``STREAMLEDGER_*``) every component and worker gets from the next ``up`` on."""
    lay.root.mkdir(parents=True, exist_ok=True)
    (lay.root / "dag-settings.json").write_text(json.dumps(dict(settings), indent=1))


def set_spark_mode(lay: Layout, mode: str) -> None:
    """Keep the other DAG settings; pick where the jobs run (``up --spark connect``)."""
    write_dag_settings(lay, {**_dag_overrides(lay), **spark_settings(mode)})


def _dag_overrides(lay: Layout) -> dict[str, str]:
    path = lay.root / "dag-settings.json"
    return json.loads(path.read_text()) if path.exists() else {}


def worker_env(lay: Layout, name: str) -> dict[str, str]:
    """A Celery worker's environment: its own AIRFLOW_HOME (logs), STREAMLEDGER_HOME and TMPDIR."""
    d = lay.worker_dir(name)
    return airflow_env(lay, {
        **s3_env(lay),
        "AIRFLOW_HOME": str(d / "airflow"),
        "STREAMLEDGER_HOME": str(d / "home"),
        "TMPDIR": str(d / "tmp"),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(WORKER_LOG_PORTS[WORKERS.index(name)]),
    })


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def _spawn(lay: Layout, name: str, cmd: list[str], env: Mapping[str, str], cwd: Path) -> int:
    existing = lay.pid(name)
    if existing:
        return existing
    lay.logs.mkdir(parents=True, exist_ok=True)
    lay.run.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with open(lay.logs / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(cmd, env=dict(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    lay.pidfile(name).write_text(f"{proc.pid} {process_start(proc.pid) or ''}\n")
    _log(f"started {name} (pid {proc.pid})")
    return proc.pid


def _wait_for(what: str, check: object, timeout: float, name: str | None = None,
              lay: Layout | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        if name and lay and not lay.pid(name):
            tail = (lay.logs / f"{name}.log").read_text(errors="replace")[-2000:]
            raise TopologyError(f"{name} exited while waiting for {what}:\n{tail}")
        time.sleep(1)
    raise TopologyError(f"{what}: not ready within {timeout:.0f}s")


def _log_has(lay: Layout, name: str, needle: str) -> bool:
    path = lay.logs / f"{name}.log"
    return path.exists() and needle in path.read_text(errors="replace")


def stop_process(lay: Layout, name: str, sig: int = signal.SIGTERM, grace: float = 30.0) -> None:
    """Signal the process group of ``name``; SIGKILL what is left after ``grace`` seconds."""
    pid = lay.pid(name)
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + grace
        while lay.pid(name) and time.monotonic() < deadline:
            time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    lay.pidfile(name).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# The services
# ---------------------------------------------------------------------------------------------


def start_redis(lay: Layout) -> None:
    if not shutil.which("redis-server"):
        _log("installing Debian's redis-server")
        _run(["apt-get", "update", "-q"], {}, 600, "apt-get update")
        _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "redis-server"],
             {"DEBIAN_FRONTEND": "noninteractive"}, 900, "apt-get install redis-server")
    d = lay.root / "redis"
    _spawn(lay, "redis", ["redis-server", "--bind", HOST, "--port", str(REDIS_PORT), "--dir", str(d),
                          "--save", "", "--appendonly", "no", "--daemonize", "no"], os.environ, d)
    _wait_for("redis", lambda: port_open(REDIS_PORT), 60, "redis", lay)


def _pg_env(lay: Layout) -> dict[str, str]:
    return {"STREAMLEDGER_HOME": str(lay.root), "STREAMLEDGER_PG_PORT": str(PG_PORT)}


def start_postgres(lay: Layout) -> None:
    lay.root.mkdir(parents=True, exist_ok=True)
    os.chmod(lay.root, 0o755)  # the server runs as the postgres user under it
    conf = lay.root / "pg" / "data" / "postgresql.conf"
    if conf.exists() and f"port = {PG_PORT}\n" not in conf.read_text():
        with conf.open("a") as f:  # a cluster made on the earlier port block: the last setting wins
            f.write(f"port = {PG_PORT}\n")
    _run([str(REPO / "scripts" / "postgres.sh"), "start"], _pg_env(lay), 600, "postgres.sh start")
    import psycopg

    with psycopg.connect(f"postgresql://postgres@{HOST}:{PG_PORT}/postgres", autocommit=True) as c:
        have = {r[0] for r in c.execute("SELECT datname FROM pg_database")}
        for db in ("airflow", "ledger"):
            if db not in have:
                c.execute(f'CREATE DATABASE "{db}"')
    from streamledger.ledger import Ledger

    Ledger(lay.ledger_url, create=True).close()


def reset_airflow(lay: Layout) -> None:
    """A fresh Airflow: its metadata database dropped (``up`` creates and migrates it again) and the
    task logs of every worker removed, so runs of an earlier pipeline are neither counted nor
    scheduled (an old ``running`` run would hold one of ``max_active_runs``). Airflow must be down."""
    import psycopg

    start_postgres(lay)
    with psycopg.connect(f"postgresql://postgres@{HOST}:{PG_PORT}/postgres", autocommit=True) as c:
        c.execute('DROP DATABASE IF EXISTS "airflow" WITH (FORCE)')
    for logs in (lay.airflow_home / "logs", *(lay.worker_dir(w) / "airflow" / "logs" for w in WORKERS)):
        shutil.rmtree(logs, ignore_errors=True)


def stop_postgres(lay: Layout) -> None:
    _run([str(REPO / "scripts" / "postgres.sh"), "stop"], _pg_env(lay), 120, "postgres.sh stop")


def restart_postgres(lay: Layout, down_for: float = 2.0) -> None:
    stop_postgres(lay)
    time.sleep(down_for)
    _run([str(REPO / "scripts" / "postgres.sh"), "start"], _pg_env(lay), 600, "postgres.sh start")


def rabbitmq(*args: str, timeout: float = 900) -> str:
    return _run([str(REPO / "scripts" / "rabbitmq.sh"), *args], {}, timeout, f"rabbitmq.sh {' '.join(args)}")


def start_rabbitmq() -> None:
    rabbitmq("provision", "cluster")
    rabbitmq("start", "cluster")
    rabbitmq("wait", "cluster", "240")


def start_s3(lay: Layout) -> None:
    """moto's S3 server (in memory: a restart forgets the bucket, so nothing here restarts it) and
    the bucket, created with the workers' own credentials."""
    import pyarrow.fs as pafs

    moto = BIN / "moto_server"
    if not moto.exists():
        raise TopologyError(f"{moto} is missing: install the dev extra (moto[server])")
    d = lay.root / "s3"
    _spawn(lay, "s3", [str(moto), "-H", HOST, "-p", str(S3_PORT)], os.environ, d)
    _wait_for("s3 server", lambda: port_open(S3_PORT), 120, "s3", lay)
    env = s3_env(lay)
    fs = pafs.S3FileSystem(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
                           scheme="http", endpoint_override=f"{HOST}:{S3_PORT}", region=env["AWS_REGION"],
                           allow_bucket_creation=True)
    fs.create_dir(BUCKET)


def write_spark_defaults(lay: Layout) -> None:
    lay.spark_conf_dir.mkdir(parents=True, exist_ok=True)
    (lay.spark_conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{k} {v}\n" for k, v in SPARK_DEFAULTS.items()))


def start_spark(lay: Layout) -> None:
    spark_class = str(spark_home() / "bin" / "spark-class")
    root = lay.root / "spark"
    write_spark_defaults(lay)
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": HOST,
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(root)}
    if not lay.pid("spark-master"):
        (lay.logs / "spark-master.log").unlink(missing_ok=True)
    _spawn(lay, "spark-master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                                 "--port", str(SPARK_MASTER_PORT), "--webui-port", str(SPARK_MASTER_UI)],
           env, root / "master")
    _wait_for("spark master", lambda: port_open(SPARK_MASTER_PORT), 180, "spark-master", lay)
    for name, ui in zip(SPARK_WORKERS, SPARK_WORKER_UI, strict=True):
        work = root / name
        if not lay.pid(name):
            (lay.logs / f"{name}.log").unlink(missing_ok=True)
        _spawn(lay, name, [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", HOST,
                           "--webui-port", str(ui), "--cores", "2", "--memory", "2g",
                           "--work-dir", str(work / "work"), lay.spark_master], env, work)
    for name in SPARK_WORKERS:
        _wait_for(f"{name} registered",
                  lambda n=name: _log_has(lay, n, "Successfully registered with master"), 180, name, lay)


def start_spark_connect(lay: Layout) -> None:
    """The Connect server in front of the standalone cluster: its driver here, its executors on the
    Spark workers, its Python workers on this interpreter (they import streamledger). It gets no
    object-store credentials: each batch hands its own to its tasks, as with spark-submit."""
    from streamledger.spark.connect import STARTED_LINE, server_command

    root = lay.root / "spark" / "connect"
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": HOST,
           "PYSPARK_PYTHON": sys.executable, "SPARK_CONF_DIR": str(lay.spark_conf_dir),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), str(REPO)) if p)}
    if not lay.pid("spark-connect") and (lay.logs / "spark-connect.log").exists():
        # the started line of a killed server must not pass for this one's (its log is kept)
        (lay.logs / "spark-connect.log").replace(lay.logs / "spark-connect.log.prev")
    command = server_command(SPARK_CONNECT_PORT, lay.spark_master, CONNECT_CONF, root=root)
    _spawn(lay, "spark-connect", command, env, root)
    _wait_for("spark connect server",
              lambda: _log_has(lay, "spark-connect", STARTED_LINE) and port_open(SPARK_CONNECT_PORT),
              300, "spark-connect", lay)


def _airflow_health() -> dict[str, dict[str, object]] | None:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{API_PORT}/api/v2/monitor/health", timeout=5) as r:
            data: dict[str, dict[str, object]] = json.loads(r.read())
            return data
    except (OSError, ValueError):
        return None


def start_airflow(lay: Layout) -> None:
    env = airflow_env(lay)
    lay.airflow_home.mkdir(parents=True, exist_ok=True)
    _run([str(BIN / "airflow"), "db", "migrate"], env, 900, "airflow db migrate")
    for name in AIRFLOW_COMPONENTS:
        _spawn(lay, name, [str(BIN / "airflow"), name], env, lay.airflow_home)

    def healthy() -> bool:
        for name in AIRFLOW_COMPONENTS:
            if not lay.pid(name):
                tail = (lay.logs / f"{name}.log").read_text(errors="replace")[-2000:]
                raise TopologyError(f"airflow {name} exited:\n{tail}")
        h = _airflow_health()
        return bool(h) and all((h.get(k) or {}).get("status") == "healthy"  # type: ignore[union-attr]
                               for k in ("metadatabase", "scheduler", "dag_processor", "triggerer"))

    _wait_for("airflow health", healthy, 600)
    for name in WORKERS:
        start_worker(lay, name)


def start_worker(lay: Layout, name: str) -> int:
    d = lay.worker_dir(name)
    for sub in ("airflow", "home", "tmp"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    return _spawn(lay, f"celery-{name}",
                  [str(BIN / "airflow"), "celery", "worker", "--celery-hostname", f"{name}@topology",
                   "--concurrency", "2"], worker_env(lay, name), d)


def revive(lay: Layout) -> list[str]:
    """What a process supervisor (systemd ``Restart=always``, a container runtime) does: start
    again every Airflow component and Celery worker that exited, and the Connect server when the
    DAG uses one. Airflow's scheduler, dag-processor and triggerer exit when their metadata database
    restarts under them."""
    revived = []
    if spark_mode(lay) == "connect" and not lay.pid("spark-connect"):
        start_spark_connect(lay)
        revived.append("spark-connect")
    dead = [n for n in AIRFLOW_COMPONENTS if not lay.pid(n)]
    env = airflow_env(lay)
    for name in dead:
        _spawn(lay, name, [str(BIN / "airflow"), name], env, lay.airflow_home)
    revived += dead
    for w in WORKERS:
        if not lay.pid(f"celery-{w}"):
            start_worker(lay, w)
            revived.append(f"celery-{w}")
    return revived


# ---------------------------------------------------------------------------------------------
# up / down / status
# ---------------------------------------------------------------------------------------------

ORDERED = ("redis", "s3", *SPARK_WORKERS, "spark-master", "spark-connect", *AIRFLOW_COMPONENTS,
           *(f"celery-{w}" for w in WORKERS))


def up() -> Layout:
    lay = layout()
    lay.root.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    start_redis(lay)
    start_s3(lay)
    start_postgres(lay)
    start_rabbitmq()
    start_spark(lay)
    if spark_mode(lay) == "connect":
        start_spark_connect(lay)
    start_airflow(lay)
    _log(f"up in {time.monotonic() - began:.0f}s")
    return lay


def down() -> None:
    lay = layout()
    for name in reversed(ORDERED):
        stop_process(lay, name)
    with contextlib.suppress(TopologyError):
        stop_postgres(lay)
    with contextlib.suppress(TopologyError):
        rabbitmq("stop", "cluster", timeout=300)
    _log("down")


def status() -> dict[str, str]:
    lay = layout()
    out = {name: (f"running (pid {pid})" if (pid := lay.pid(name)) else "stopped") for name in ORDERED}
    out["postgres"] = "running" if port_open(PG_PORT) else "stopped"
    for i, port in enumerate(CLUSTER_STREAM_PORTS, 1):
        out[f"rabbitc{i}"] = "running" if port_open(port) else "stopped"
    health = _airflow_health()
    if health:
        out["airflow health"] = ", ".join(f"{k} {v.get('status')}" for k, v in sorted(health.items()))
    return out
