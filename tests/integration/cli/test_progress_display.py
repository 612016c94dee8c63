"""Issue 33, progress: on a terminal, ``read``, ``batch run`` and ``ledger audit`` draw a live display
(records, rate, ETA from the planned range); without one, and in the logs of a batch run from any front
door (Airflow's task log, Dagster's), a progress line every ``$STREAMLEDGER_PROGRESS_SECONDS``. Run
against the real broker, local Spark and a SQLite ledger; the terminal is a pseudo-terminal."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, LocalSparkRunner, RunId, run_batch
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.cli.helpers import cli
from tests.integration.spark.helpers import create_stream

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(600)]

HIDE_CURSOR = "\x1b[?25l"  # a live display hides the cursor while it redraws
BAR = "\u2501"  # the bar's glyph


def on_a_terminal(*argv: str, env: dict[str, str], timeout: float = 300) -> tuple[int, str, str]:
    """The command with stderr on a pseudo-terminal (120 columns), stdout piped: (rc, terminal, stdout)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLEDGER_")}
    environ.update(env, TERM="xterm-256color", COLUMNS="120")
    environ.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "streamledger.cli", *argv], stdin=follower,
                            stdout=subprocess.PIPE, stderr=follower, env=environ)
    os.close(follower)
    seen = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError as exc:  # EIO: every writer closed the terminal
                if exc.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read().decode() if proc.stdout else ""
    rc = proc.wait(timeout=30)
    os.close(leader)
    return rc, seen.decode(errors="replace"), out


def test_read_draws_a_live_display_on_a_terminal_and_lines_without_one(
    rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    s = stream_name("live-read")
    create_stream(rabbitmq_url, s, 20000)
    env = {"STREAMLEDGER_BROKER_URL": rabbitmq_url}
    rc, terminal, out = on_a_terminal("read", s, "--start", "first", "--end", "next", "--output",
                                      str(tmp_path / "x.parquet"), env=env)
    assert rc == 0, terminal
    assert '"records": 20000' in out
    assert HIDE_CURSOR in terminal and BAR in terminal, terminal
    assert f"read {s} [0, 20000)" in terminal and "offsets/s" in terminal and "ETA" in terminal
    assert "20,000/20,000 offsets" in terminal, terminal

    r = cli("read", s, "--start", "first", "--end", "next", "--output", str(tmp_path / "y.parquet"),
            env={**env, "STREAMLEDGER_PROGRESS_SECONDS": "0"})
    assert r.rc == 0 and HIDE_CURSOR not in r.err and BAR not in r.err
    assert [line for line in r.err.splitlines() if line.startswith(f"streamledger: read {s} [0, 20000)")]


def test_batch_run_and_audit_draw_a_live_display_on_a_terminal(
    rabbitmq_url: str, stream_name: Any, tmp_path: Path, spark: Any
) -> None:
    s = stream_name("live-batch")
    create_stream(rabbitmq_url, s, 500)
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    env = {"STREAMLEDGER_BROKER_URL": rabbitmq_url, "STREAMLEDGER_LEDGER_URL": ledger}
    rc, terminal, out = on_a_terminal("batch", "run", "--stream", s, "--pipeline", "live", "--output-root",
                                      str(tmp_path / "out"), "--master", "local[1]", "--max-offsets", "250",
                                      env=env)
    assert rc == 0, terminal
    assert HIDE_CURSOR in terminal and BAR in terminal, terminal
    assert "batch live" in terminal and "250 offsets planned" in terminal, terminal
    assert "Spark tasks" in terminal, terminal
    assert f"{s} [0, 250) committed records=250" in out

    # The audit's second range: the same batch in this process, on the suite's shared session (a second
    # `batch run` process would only start another JVM; the display above is the one under test).
    runner = LocalSparkRunner()
    runner._spark = spark
    cfg = BatchConfig(pipeline="live", url=rabbitmq_url, output_root=str(tmp_path / "out"), stream=s,
                      max_offsets=250)
    with Ledger(ledger) as opened, \
            StreamClient.connect(rabbitmq_url) as client:
        second = run_batch(cfg, run=RunId("dag", "second", "t"), ledger=opened, broker=client, runner=runner)
    assert [(p.start, p.end, str(p.status)) for p in second.partitions] == [(250, 500, "committed")]
    rc, terminal, out = on_a_terminal("ledger", "audit", "--pipeline", "live", env=env)
    assert rc == 0, terminal + out
    assert HIDE_CURSOR in terminal and "audit live" in terminal and "2/2 ranges" in terminal, terminal

    r = cli("ledger", "audit", "--pipeline", "live", env={**env, "STREAMLEDGER_PROGRESS_SECONDS": "0"})
    assert r.rc == 0 and HIDE_CURSOR not in r.err
    assert "streamledger: audit live: 2 / 2 ranges" in r.err, r.err


def test_a_batch_from_any_front_door_logs_its_progress(
    rabbitmq_url: str, stream_name: Any, tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What Airflow's task log and Dagster's run log show: run_batch's own log lines, planned offsets,
    then the Spark job's tasks while it runs, then the records read."""
    monkeypatch.setenv("STREAMLEDGER_PROGRESS_SECONDS", "0.05")
    s = stream_name("logged-progress")
    create_stream(rabbitmq_url, s, 300)
    runner = LocalSparkRunner()
    runner._spark = spark
    # Many tasks keep the job running for several polls: a one-task job of 300 records could end
    # before Spark registered its tasks (one "running" line without them, in a run at load 10).
    cfg = BatchConfig(pipeline="logged", url=rabbitmq_url, output_root=str(tmp_path / "out"), stream=s,
                      splits=48)
    with Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}", create=True) as ledger, \
            StreamClient.connect(rabbitmq_url) as client, caplog.at_level(logging.INFO, "streamledger.batch"):
        run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("streamledger.batch")]
    assert "batch logged: reading 1 partition(s), 300 offsets planned" in lines, lines
    running = [line for line in lines if line.startswith("batch logged: Spark job running")]
    assert running and any("tasks" in line for line in running), lines
    assert any(line.startswith("batch logged: read 300 records in ") and "records/s" in line
               for line in lines), lines
