"""The server scripts know whether their server runs, though pids are recycled.

CI stop 40 lost an hour to this: the 3.10 broker's pid file named a pid that, by the time the suite
asked for the broker, belonged to another process (``pid_max`` is 32768 on these machines and a suite
starts tens of thousands of processes). ``start`` said "already running", ``wait`` waited 180 s for a
port nobody would open, and every later test of 3.10 did the same. A broker's pid file now records the
process's start time too, and a pid file of the old format counts only for a RabbitMQ process.
PostgreSQL's own lock file (``postmaster.pid``) has the same weakness; ``scripts/postgres.sh`` now
believes it only for a process running postgres on the cluster's data directory.

The broker tests use a private node of the provisioned 3.10 installation
(``STREAMLEDGER_RABBITMQ_INSTANCE``, ports moved by an offset) and the PostgreSQL test a private
cluster, so the servers the rest of the suite shares are never touched.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.rabbitmq import PORTS, SCRIPT, Broker, port_open, streamledger_home

pytestmark = pytest.mark.rabbitmq


@dataclass(frozen=True)
class _Node:
    env: dict[str, str]
    pidfile: Path
    stream_port: int

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env})


def _free_offset() -> int:
    p = PORTS["3.10"]
    for _ in range(50):
        off = random.randrange(2000, 2900)
        ports = (p.stream, p.amqp, p.mgmt, 25692, 4389)  # dist and epmd as in scripts/rabbitmq.sh
        if not any(port_open("127.0.0.1", port + off, 0.2) for port in ports):
            return off
    raise RuntimeError("no free port block for a private 3.10 node")


@pytest.fixture
def private_310(broker_310: Broker) -> Iterator[_Node]:
    """A private 3.10 node's names and paths; stopped and removed afterwards."""
    name = f"pid{os.getpid() % 100000}{random.randrange(10**6)}"
    off = _free_offset()
    base = streamledger_home() / "rabbitmq" / "3.10" / "instances" / name
    node = _Node(
        env={"STREAMLEDGER_HOME": str(streamledger_home()), "STREAMLEDGER_RABBITMQ_INSTANCE": name,
             "STREAMLEDGER_RABBITMQ_PORT_OFFSET": str(off)},
        pidfile=base / "run" / "broker.pid",
        stream_port=PORTS["3.10"].stream + off,
    )
    node.pidfile.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield node
    finally:
        node.script("stop", "3.10")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not a broker: the pid a recycled pid file names."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("record", ["pid only (the old format)", "pid and another start time"])
def test_a_pid_file_naming_a_recycled_pid_is_a_stopped_broker(
        private_310: _Node, decoy: subprocess.Popen[bytes], record: str) -> None:
    content = f"{decoy.pid}\n" if record.startswith("pid only") else f"{decoy.pid} 1\n"
    private_310.pidfile.write_text(content)

    out = private_310.script("status", "3.10")

    assert out.returncode == 0, out.stderr
    assert ", stopped," in out.stdout + out.stderr, out.stdout + out.stderr


def test_start_over_a_recycled_pid_starts_the_broker_and_wait_sees_it_ready(
        private_310: _Node, decoy: subprocess.Popen[bytes]) -> None:
    private_310.pidfile.write_text(f"{decoy.pid}\n")  # what the script wrote before, for a broker now dead

    started = private_310.script("start", "3.10")
    ready = private_310.script("wait", "3.10", "60", timeout=120)

    assert started.returncode == 0, started.stderr
    assert "already running" not in started.stdout + started.stderr
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert port_open("127.0.0.1", private_310.stream_port)
    assert private_310.pidfile.read_text().split()[0] != str(decoy.pid)
    assert decoy.poll() is None  # stop must not have touched the other process either


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_postgres_starts_over_a_lock_file_whose_pid_another_process_reused() -> None:
    """The same on ``scripts/postgres.sh``: a cluster killed without a shutdown leaves
    ``postmaster.pid``; when its pid names another live process of the cluster's user (another
    cluster's backend: the suite runs several), ``pg_ctl status`` said "running", ``start`` skipped
    the start and gave up after 30 s on a server nobody ran."""
    # under the servers' home: the cluster runs as the postgres user, who cannot reach pytest's tmp
    home = streamledger_home() / "pidfile-tests" / f"pg{os.getpid()}{random.randrange(10**6)}"
    home.mkdir(parents=True, mode=0o755)
    env = {**os.environ, "STREAMLEDGER_HOME": str(home), "STREAMLEDGER_PG_PORT": str(_free_port())}
    script = str(SCRIPT.with_name("postgres.sh"))

    def pg(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([script, *args], capture_output=True, text=True, timeout=180, env=env)

    decoy: subprocess.Popen[bytes] | None = None
    try:
        first = pg("start")  # installs the server (and its user) on a fresh machine
        assert first.returncode == 0, first.stderr
        as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups"]
        decoy = subprocess.Popen([*as_postgres, "sleep", "600"], start_new_session=True)
        lock = home / "pg" / "data" / "postmaster.pid"
        postmaster = int(lock.read_text().split()[0])
        os.kill(postmaster, 9)  # no shutdown: the lock file stays behind
        while Path(f"/proc/{postmaster}").exists():
            time.sleep(0.05)
        assert decoy.poll() is None, "the decoy (a process of the postgres user) must run"
        lines = lock.read_text().splitlines()
        lock.write_text("\n".join([str(decoy.pid), *lines[1:]]) + "\n")

        again = pg("start")

        assert again.returncode == 0, again.stdout + again.stderr
        assert "running at" in pg("status").stdout
        assert decoy.poll() is None
    finally:
        pg("stop")
        shutil.rmtree(home, ignore_errors=True)
        if decoy is not None:
            os.killpg(decoy.pid, 9)
            decoy.wait()
