"""Spark fixtures: one shared ``local[2]`` session, and a real standalone cluster on loopback.

* ``spark`` (session scope): the JVM and the Python worker daemon cost ~10-20 s to start here, so every
  test shares one session (UI off, ``SPARK_LOCAL_IP``/``PYSPARK_PYTHON`` set, data source registered).
* ``spark_standalone`` (session scope): a Master and one Worker started from the pyspark installation
  with ``spark-class`` (pip's pyspark ships no ``start-master.sh``), bound to 127.0.0.1 on free ports,
  logs and work dirs under ``$STREAMLEDGER_HOME/spark/``. Tests run jobs on it with
  :meth:`StandaloneCluster.submit` (a real ``spark-submit --master spark://...``). Both processes are
  stopped at the end of the session, by the ids this fixture started.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from streamledger.spark.session import QUICK_START_JAVA_OPTIONS

SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}

#: The suite's JVMs (the shared session, an Airflow task's local Spark, the job module's CLI,
#: spark-submit, the Connect server) read a few hundred records each, so the JIT's top tier (C2) only
#: burns CPU the two lanes need: C1 only and the serial collector (the product's quick start).
#: The JDK's launcher reads this variable (so does Spark's own launcher JVM). Measured on the 2-core VM,
#: load ~5: a cold session plus a first small job 19.5 s -> 11.2 s; test_job.py + test_fault_matrix.py
#: 172 s -> 117 s. Set for a pytest run and its children (:func:`pytest_configure`), unless already
#: set; not on import, so the benches that reuse these helpers keep the JVM's defaults.
SHORT_JVM_ENV = {"JDK_JAVA_OPTIONS": QUICK_START_JAVA_OPTIONS}


def pytest_configure(config: pytest.Config) -> None:
    for key, value in SHORT_JVM_ENV.items():
        os.environ.setdefault(key, value)


def _home() -> Path:
    return Path(os.environ.get("STREAMLEDGER_HOME", "/var/tmp/streamledger"))


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_env(**extra: str) -> dict[str, str]:
    """The process environment for Spark commands: loopback, this interpreter for the workers."""
    env = dict(os.environ)
    for key, value in SPARK_ENV.items():
        env.setdefault(key, value)
    env["SPARK_HOME"] = str(spark_home())
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_session() -> Any:
    """The suite's local[2] SparkSession with the ``rabbitmq_stream`` source registered (outside pytest
    too: the model checker's soak)."""
    for key, value in SPARK_ENV.items():
        os.environ.setdefault(key, value)
    from streamledger.spark.session import build_session

    session = build_session(
        master="local[2]",
        app_name="streamledger-tests",
        conf={
            "spark.driver.memory": "2g",
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.showConsoleProgress": "false",
            # Python workers must connect back within this (default 15 s); the suite runs two lanes on
            # two cores, where a streaming query's driver-side worker can take longer to start.
            "spark.python.authenticate.socketTimeout": "120s",
        },
    )
    session.sparkContext.setLogLevel("WARN")
    return session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A shared local[2] SparkSession with the ``rabbitmq_stream`` source registered."""
    session = local_session()
    try:
        yield session
    finally:
        session.stop()
        # py4j logs "Closing down clientserver connection" at INFO from __del__ at interpreter exit, when
        # the streams a test's logging handler wrote to are already closed: keep that noise out of the run.
        logging.getLogger("py4j").setLevel(logging.WARNING)


@dataclass
class StandaloneCluster:
    """A running standalone master + worker; ``submit`` runs spark-submit against it."""

    master_url: str
    root: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def submit(
        self,
        app: str | Path,
        args: Sequence[str] = (),
        *,
        conf: dict[str, str] | None = None,
        timeout: float = 300.0,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``spark-submit --master <this cluster> app args...``; returns the finished process."""
        cmd = [
            str(spark_home() / "bin" / "spark-submit"),
            "--master", self.master_url,
            "--driver-memory", "1g",
            "--executor-memory", "1g",
            "--total-executor-cores", "2",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.ui.showConsoleProgress=false",
            "--conf", f"spark.pyspark.python={sys.executable}",
        ]
        for key, value in (conf or {}).items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += [str(app), *args]
        return subprocess.run(
            cmd, env=spark_env(), cwd=str(cwd or self.root), capture_output=True, text=True,
            timeout=timeout, check=False,
        )

    def stop(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)  # its own group: also its executor JVMs
                except ProcessLookupError:
                    continue
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _wait_for_line(log: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if needle in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: process exited with {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    raise RuntimeError(f"{log.name}: {needle!r} not seen within {timeout:.0f}s:\n{tail}")


def start_standalone(root: Path, *, cores: int = 2, memory: str = "2g") -> StandaloneCluster:
    """Start a Master and one Worker with ``spark-class`` on loopback; wait until the worker registered."""
    root.mkdir(parents=True, exist_ok=True)
    work = root / "work"
    work.mkdir(exist_ok=True)
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, ui = _free_port(), _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    env = spark_env(SPARK_LOG_DIR=str(root), SPARK_WORKER_DIR=str(work))
    cluster = StandaloneCluster(master_url, root)

    def launch(name: str, cmd: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = root / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, env=env, cwd=str(root), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        cluster.processes.append(proc)
        return proc, log

    try:
        master, master_log = launch(
            "master",
            [spark_class, "org.apache.spark.deploy.master.Master",
             "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
        )
        _wait_for_line(master_log, "I have been elected leader", master, 120)
        worker, worker_log = launch(
            "worker",
            [spark_class, "org.apache.spark.deploy.worker.Worker",
             "--host", "127.0.0.1", "--webui-port", str(_free_port()),
             "--cores", str(cores), "--memory", memory, "--work-dir", str(work), master_url],
        )
        _wait_for_line(worker_log, "Successfully registered with master", worker, 120)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def spark_standalone() -> Iterator[StandaloneCluster]:
    """A real Spark standalone cluster (master + one worker) for spark-submit tests."""
    base = _home() / "spark"
    for old in base.glob("standalone-*"):  # left by earlier sessions whose process is gone
        pid = old.name.removeprefix("standalone-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    root = base / f"standalone-{os.getpid()}"
    cluster = start_standalone(root)
    try:
        yield cluster
    finally:
        cluster.stop()


def _connect_root() -> Path:
    """This process's Connect server directory (``connect-<pid>``), after removing those of earlier
    sessions whose process is gone."""
    from streamledger.spark import connect

    base = _home() / "spark"
    for old in base.glob("connect-*"):  # left by earlier sessions whose process is gone
        pid = old.name.removeprefix("connect-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            connect.stop(old)
            shutil.rmtree(old, ignore_errors=True)
    return base / f"connect-{os.getpid()}"


def _start_connect(root: Path) -> str:
    from streamledger.spark import connect

    return connect.start(root=root, conf={"spark.driver.memory": "1g"}).url


@dataclass
class _EarlyConnect:
    """The session's Connect server, started in a thread as soon as collection shows a test asks for it
    (:func:`pytest_collection_finish`), so its JVM boots while the tests before that one run instead of
    that test waiting for it (15-25 s on a loaded 2-core machine)."""

    root: Path | None = None
    thread: threading.Thread | None = None
    url: str | None = None
    error: BaseException | None = None

    def run(self) -> None:
        assert self.root is not None
        try:
            self.url = _start_connect(self.root)
        except BaseException as exc:  # handed to the fixture, which raises it in the test that asked
            self.error = exc


_EARLY = _EarlyConnect()


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or _EARLY.thread is not None:
        return
    if not any("spark_connect" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    for key, value in SPARK_ENV.items():  # here, not in the thread: the tests' own thread reads os.environ
        os.environ.setdefault(key, value)
    _EARLY.root = _connect_root()
    _EARLY.thread = threading.Thread(target=_EARLY.run, name="spark-connect-start", daemon=True)
    _EARLY.thread.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop an early-started server no test took (the run stopped first); stopping twice is harmless."""
    if _EARLY.thread is not None and _EARLY.root is not None:
        _EARLY.thread.join(timeout=240)
        from streamledger.spark import connect

        connect.stop(_EARLY.root)


@pytest.fixture(scope="session")
def spark_connect() -> Iterator[str]:
    """A local Spark Connect server (started by ``streamledger.spark.connect``); yields its sc:// URL.

    It runs in its own state directory under ``$STREAMLEDGER_HOME/spark/`` so it never reuses (or
    stops) a server a developer started by hand, and it is stopped at the end of the session. Started
    early, beside the first tests, when collection shows a test needs it (:class:`_EarlyConnect`).
    """
    from streamledger.spark import connect

    if _EARLY.thread is not None and _EARLY.root is not None:
        _EARLY.thread.join()
        if _EARLY.error is not None:
            raise _EARLY.error
        assert _EARLY.url is not None
        root, url = _EARLY.root, _EARLY.url
    else:
        for key, value in SPARK_ENV.items():
            os.environ.setdefault(key, value)
        root = _connect_root()
        url = _start_connect(root)
    try:
        yield url
    finally:
        connect.stop(root)


@pytest.fixture
def leave_connect_mode() -> Iterator[None]:
    """Undo pyspark's process-wide Connect switch after a test.

    ``SparkSession.builder.remote(...)`` sets ``SPARK_CONNECT_MODE_ENABLED`` in ``os.environ``, which
    turns every later ``pyspark.sql.functions`` call of the process into a Connect expression and
    breaks the shared classic ``spark`` session of the other tests.
    """
    yield
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


@pytest.fixture
def spark_remote(spark_connect: str, leave_connect_mode: None) -> Iterator[Any]:
    """A Spark Connect session on the fixture server (data source registered), closed after the test."""
    from streamledger.spark.connect import connect_session

    session = connect_session(spark_connect)
    try:
        yield session
    finally:
        session.stop()
