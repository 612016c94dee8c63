"""The 3-node 4.3 cluster of ``scripts/rabbitmq.sh ... cluster``, started for this session and stopped
at its end (three extra Erlang nodes are too heavy to leave running on a shared machine).

These tests run with ``make cluster-test`` (``STREAMLEDGER_CLUSTER_TESTS=1``); the root conftest leaves
this directory out of ``make test`` so the default suite does not boot three more nodes.
"""

from __future__ import annotations

import fcntl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.rabbitmq import SCRIPT, streamledger_home

NODES = (1, 2, 3)


@dataclass(frozen=True)
class Cluster:
    def stream_port(self, n: int) -> int:
        return 5600 + n

    def amqp_port(self, n: int) -> int:
        return 5610 + n

    def node_of_port(self, port: int) -> int:
        return port - 5600

    def stream_url(self, n: int) -> str:
        return f"rabbitmq-stream://guest:guest@127.0.0.1:{self.stream_port(n)}/"

    def amqp_url(self, n: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port(n)}/"

    def script(self, *args: str) -> str:
        done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmq.sh {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
        return done.stdout

    def stop_node(self, n: int) -> None:
        self.script("stop-node", "cluster", str(n))

    def start_node(self, n: int) -> None:
        self.script("start-node", "cluster", str(n))


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    home = streamledger_home() / "rabbitmq"
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".pytest-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        c.script("provision", "cluster")
        c.script("start", "cluster")
        c.script("wait", "cluster")
    yield c
    c.script("stop", "cluster")
