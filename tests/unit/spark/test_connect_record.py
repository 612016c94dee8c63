"""The Connect server's record (``server.json``) names its process by pid *and* start time.

Pids are recycled (``pid_max`` is 32768 on small machines, and a test suite or a busy scheduler
starts tens of thousands of processes). A record naming only a pid made a process that reused it pass
for the server: ``status`` reported a server nobody ran and ``start`` returned it, and ``stop`` sent
SIGTERM then SIGKILL to the other process's group. The same defect cost CI stop 40 an hour in the
broker script.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamledger.processes import process_start
from streamledger.spark import connect


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen[bytes]]:
    """A live process in a session of its own (a group ``stop`` could kill) that is not a server."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _record(root: Path, pid: int, **extra: object) -> None:
    root.mkdir(parents=True, exist_ok=True)
    state = {"pid": pid, "port": 1, "url": "sc://127.0.0.1:1", "log": str(root / "server.log"),
             "master": "local[2]", **extra}
    (root / "server.json").write_text(json.dumps(state) + "\n")


@pytest.mark.parametrize("record", ["pid only (the old format)", "pid and another start time"])
def test_a_record_naming_a_recycled_pid_is_no_server_and_stop_leaves_that_process_alone(
        tmp_path: Path, decoy: subprocess.Popen[bytes], record: str) -> None:
    extra = {} if record.startswith("pid only") else {"started": 1}
    _record(tmp_path, decoy.pid, **extra)

    assert connect.status(tmp_path) is None
    _record(tmp_path, decoy.pid, **extra)
    assert connect.stop(tmp_path) is None

    assert decoy.poll() is None, "stop killed a process that is not the server"
    assert not (tmp_path / "server.json").exists()


def test_a_record_of_this_very_process_counts(tmp_path: Path) -> None:
    """The start time is what tells a live record from a recycled one, not the command line alone:
    a record with the right pid and start time is believed (here: a ``sleep`` standing in)."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        _record(tmp_path, proc.pid, started=process_start(proc.pid))
        state = connect.status(tmp_path)
        assert state is not None and state.pid == proc.pid
    finally:
        proc.kill()
        proc.wait()
