"""The example code location through the ``dagster`` CLI in fresh processes, as a user runs it:
``dagster definitions validate`` and ``dagster asset materialize --select stream_batch``, configured
only by environment variables, against the real broker and local Spark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamledger.ledger import Ledger
from tests.integration.dagster.conftest import Setup

pytestmark = [pytest.mark.dagster, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parents[3]
DAGSTER = str(Path(sys.executable).parent / "dagster")


def dagster(args: list[str], setup: Setup, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **setup.env(),
        "DAGSTER_HOME": str(home),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    return subprocess.run(
        [DAGSTER, *args, "-m", "streamledger.dagster.example"], env=env, cwd=str(home),
        capture_output=True, text=True, timeout=200, check=False,
    )


def test_cli_validates_and_materializes_the_example(setup: Setup, tmp_path: Path) -> None:
    home = tmp_path / "dagster-home"
    home.mkdir()
    setup.publish(range(30))

    validate = dagster(["definitions", "validate"], setup, home)
    assert validate.returncode == 0, validate.stderr[-3000:]
    assert "Validation successful" in validate.stderr + validate.stdout

    run = dagster(["asset", "materialize", "--select", "stream_batch"], setup, home)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "RUN_SUCCESS" in output
    assert "guest:guest" not in output, "the broker password must not reach the logs"

    committed = [r for r in Ledger(setup.ledger_url).ranges(setup.pipeline) if str(r.status) == "committed"]
    assert {(r.source.stream, r.start, r.end, r.records) for r in committed} == {
        (p, 0, 15, 15) for p in setup.partitions
    }
    assert sorted(setup.written_ids()) == list(range(30))
