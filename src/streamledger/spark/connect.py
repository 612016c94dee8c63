"""A local Spark Connect server from the pyspark wheel, and sessions on any Connect server.

Why: a fresh ``local[N]`` session pays a JVM start and a Python-worker start (~20 s on a small host)
before the first record; a warm Connect server pays them once, and each job then only opens a gRPC
session. The server runs ``SparkConnectServer`` through the wheel's ``spark-submit`` on 127.0.0.1 with
its Python workers on this interpreter (``spark.pyspark.python``), so they import streamledger.

State lives in ``$STREAMLEDGER_HOME/spark-connect/``: ``server.json`` (pid, port, url, log) and
``server.log``. ``start`` is idempotent: a live server recorded there is reused.

A remote Connect server needs streamledger and pyarrow installed on the Python of its workers (the
data source class is pickled by reference) and network reach from its executors to the brokers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from streamledger import home
from streamledger.errors import StreamledgerError
from streamledger.processes import alive, process_start, same_process

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STARTED_LINE = "Spark Connect server started at"
DEFAULT_PORT = 15002


class ConnectServerError(StreamledgerError):
    """The local Spark Connect server could not be started, found or stopped."""


@dataclass(frozen=True)
class ServerState:
    pid: int
    port: int
    url: str
    log: str
    master: str
    #: the process's start time (clock ticks since boot): a pid alone may name another process
    #: once the server died and the pid was reused; ``None`` in a record written before it existed
    started: int | None = None


def state_dir(root: Path | None = None) -> Path:
    """Where the server's record and log live: ``root`` or ``$STREAMLEDGER_HOME/spark-connect``."""
    return root or home.state_dir() / "spark-connect"


def _state_file(root: Path | None = None) -> Path:
    return state_dir(root) / "server.json"


def _is_the_server(state: ServerState) -> bool:
    """The recorded process still runs and is the one recorded: same start time, or for a record
    without one, a process running the Connect server class."""
    if state.started is not None:
        return same_process(state.pid, state.started)
    if not alive(state.pid):
        return False
    try:
        return SERVER_CLASS.encode() in Path(f"/proc/{state.pid}/cmdline").read_bytes()
    except OSError:
        return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def status(root: Path | None = None) -> ServerState | None:
    """The recorded server if its process is alive, else ``None`` (a stale record is removed)."""
    path = _state_file(root)
    try:
        state = ServerState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not _is_the_server(state):
        path.unlink(missing_ok=True)
        return None
    return state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(port: int, master: str, conf: dict[str, str] | None = None, *,
                   root: Path | None = None) -> list[str]:
    """The ``spark-submit`` command line of a Connect server on 127.0.0.1:port.

    Secret settings (S3 keys, tokens: the one rule of :mod:`streamledger.redaction`) go into a
    properties file only the owner can read, under ``root``, never onto the command line, which every
    process on the machine can read."""
    import pyspark

    from streamledger.redaction import is_secret_key

    home = Path(pyspark.__file__).resolve().parent
    cmd = [
        str(home / "bin" / "spark-submit"),
        "--class", SERVER_CLASS,
        "--name", "streamledger-connect",
        "--master", master,
    ]
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
        **(conf or {}),
    }
    secret = {key: value for key, value in settings.items() if is_secret_key(key)}
    for key, value in settings.items():
        if key not in secret:
            cmd += ["--conf", f"{key}={value}"]
    if secret:
        props = state_dir(root) / "secret.properties"
        props.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(props, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.writelines(f"{key}={value}\n" for key, value in secret.items())
        cmd += ["--properties-file", str(props)]
    return [*cmd, "spark-internal"]


def start(
    *, port: int | None = None, master: str = "local[2]", conf: dict[str, str] | None = None,
    timeout: float = 180.0, root: Path | None = None,
) -> ServerState:
    """Start the server (or return the live one already recorded) and wait until it accepts sessions."""
    current = status(root)
    if current is not None:
        return current
    import pyspark

    root = state_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    port = port or _free_port()
    if _listening(port):
        raise ConnectServerError(f"port {port} on 127.0.0.1 is already in use; pick another with --port")
    log = root / "server.log"
    env = dict(os.environ)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["SPARK_HOME"] = str(Path(pyspark.__file__).resolve().parent)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            server_command(port, master, conf, root=root), env=env, cwd=str(root), stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    state = ServerState(proc.pid, port, f"sc://127.0.0.1:{port}", str(log), master, process_start(proc.pid))
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        if STARTED_LINE in text and _listening(port):
            break
        if proc.poll() is not None:
            raise ConnectServerError(
                f"Spark Connect server exited with status {proc.returncode} before listening on "
                f"port {port}; see {log}"
            )
        if time.monotonic() > deadline:
            _kill_group(proc.pid)
            raise ConnectServerError(
                f"Spark Connect server not listening on port {port} after {timeout:.0f}s; see {log}"
            )
        time.sleep(0.5)
    tmp = _state_file(root).with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state)) + "\n")
    os.replace(tmp, _state_file(root))
    return state


def _kill_group(pid: int, timeout: float = 30.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:  # our own child: reap it
                    return
            except ChildProcessError:
                if not alive(pid):
                    return
            time.sleep(0.2)


def stop(root: Path | None = None) -> ServerState | None:
    """Stop the recorded server (its whole process group); ``None`` when none was running."""
    state = status(root)
    if state is not None:
        _kill_group(state.pid)
    _state_file(root).unlink(missing_ok=True)
    return state


def warm_up(url: str) -> None:
    """Boot the Python workers of the server-side session every batch attaches to
    (:data:`JOB_SESSION_ID`): the data sources' registration and one task per slot importing the read
    and write path. Without it the first batch after a start pays them (measured: 12.8 s against
    2.8 s for the next, 5,000 records at load 6). Switches this process to Connect mode (see
    :func:`connect_session`): for ``streamledger spark-server start``, not a process holding a
    classic session."""
    from pyspark.sql.types import LongType, StructField, StructType

    from streamledger.spark.arrow_writer import warm_task
    from streamledger.spark.session import parallelism

    spark = connect_session(url, session_id=JOB_SESSION_ID, keep_session=True)
    try:
        slots = parallelism(spark)
        schema = StructType([StructField("id", LongType(), False)])
        spark.range(0, slots, 1, slots).to(schema).mapInArrow(warm_task, schema).toArrow()
    finally:
        spark.stop()


#: A Connect server every ``streamledger batch run`` uses without a flag (``sc://host:port``); it
#: comes before the server recorded by ``streamledger spark-server start``.
REMOTE_ENV = "STREAMLEDGER_SPARK_REMOTE"


def shown_url(url: str) -> str:
    """``sc://host:port`` of a Connect URL, without its parameters (a ``token=`` is one) or user."""
    rest = url.removeprefix("sc://").split("/", 1)[0]
    return "sc://" + rest.split("@")[-1]


def warm_server(root: Path | None = None) -> tuple[str, str] | None:
    """The Connect server a batch uses when none is named: ``$STREAMLEDGER_SPARK_REMOTE``, else the
    live server recorded by ``streamledger spark-server start`` (under ``root``) if it accepts
    connections; ``(url, where it was found)``, or ``None`` (local Spark: a cold JVM)."""
    named = os.environ.get(REMOTE_ENV, "").strip()
    if named:
        if not named.startswith("sc://"):
            raise ConnectServerError(f"${REMOTE_ENV} must look like sc://host:port; it is set to "
                                     "something else (not shown: it may hold a secret)")
        return named, f"${REMOTE_ENV}"
    state = status(root)
    if state is None or not _listening(state.port):
        return None
    return state.url, "recorded by streamledger spark-server start"


#: The server-side session every ``python -m streamledger.spark.job --remote`` process attaches to (per
#: Connect user). Why: a fresh session gets its own Python daemons on the server (data-source creation,
#: planning, tasks: ~0.5 s each to boot, measured) that outlive it; attaching to one long-lived
#: session boots them once and a short job then costs ~1 s instead of ~3 s (docs/performance.md).
JOB_SESSION_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "streamledger:spark-job-session"))


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port[/;k=v...]``) naming the server-side session ``session_id``, unless it
    names one already."""
    if ";session_id=" in url:
        return url
    return f"{url};session_id={session_id}" if "/;" in url else f"{url.rstrip('/')}/;session_id={session_id}"


def connect_session(url: str, *, session_id: str | None = None, keep_session: bool = False,
                    register: bool = True) -> Any:
    """A Spark Connect session on ``url`` (``sc://host:port``) with the data source registered.

    Python data sources are registered per session; ``spark.dataSource.register`` works on a Connect
    session (the class is shipped pickled, the server's workers import streamledger to unpickle it).
    pyspark switches the whole process to Connect mode here (``SPARK_CONNECT_MODE_ENABLED``): do not
    mix a classic in-process session and a Connect session in one process.

    ``session_id`` attaches to that server-side session (several clients may use it at once);
    ``keep_session`` makes ``spark.stop()`` close only this client, leaving the session (and its warm
    Python workers) to the next client. ``register=False`` leaves the sources unregistered (each
    registration is a round trip in which the server runs Python; a job whose tasks read with the
    source's reader directly, as the Arrow writer's do, needs none).
    """
    from pyspark.sql import SparkSession

    from streamledger.spark.session import register_source

    spark = SparkSession.builder.remote(with_session_id(url, session_id) if session_id else url).getOrCreate()
    if keep_session:
        spark.release_session_on_close = False  # type: ignore[attr-defined]
    if register:
        register_source(spark)
    return spark
