"""``batch run`` on the CLI's local Spark keeps Spark's own start-up noise off the terminal (issue 33):
log4j's profile lines, NativeCodeLoader, the data sources' re-registration and the JVM's incubator
warning; ``-v`` shows them again. Real local Spark, a real broker, a new SQLite ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli.helpers import cli
from tests.integration.spark.helpers import create_stream

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(900)]

NOISE = ("Using Spark's default log4j profile", "Setting default log level", "sc.setLogLevel",
         "NativeCodeLoader", "replaced a statically registered data source", "Using incubator modules")


def test_batch_run_verbose_shows_the_spark_noise_the_default_keeps_off(rabbitmq_url: str, stream_name: Any,
                                                                      tmp_path: Path) -> None:
    """The default (quiet) half is asserted on the first ``batch run`` of a new user
    (test_first_hour.py), the same command on the CLI's local Spark: one JVM start less."""
    s = stream_name("loud")
    create_stream(rabbitmq_url, s, 20)
    env = {"STREAMLEDGER_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
           "STREAMLEDGER_BROKER_URL": rabbitmq_url}
    r = cli("-v", "batch", "run", "--stream", s, "--output-root", str(tmp_path / "out"), "--json",
            "--master", "local[1]", "--pipeline", "loud", env=env)
    assert r.rc == 0, r.err
    assert json.loads(r.out)["records"] == 20
    assert "Using incubator modules" in r.err and "NativeCodeLoader" in r.err, r.err


def test_the_jvm_filter_drops_only_the_noise_line() -> None:
    """A child that writes like a JVM (the noise line, a real error, a partial line) through the filter."""
    import subprocess
    import sys

    code = ("import os,sys,time; w=sys.stderr.write;"
            "w('WARNING: Using incubator modules: jdk.incubator.vector\\n');"
            "w('Exception in thread main: boom\\n'); w('WARN'); sys.stderr.flush(); time.sleep(0.2);"
            "w('ING: a real JVM warning\\n'); w('partial')")
    runner = ("import subprocess,sys\nfrom streamledger.cli.quiet_spark import jvm_stderr_filtered\n"
              "with jvm_stderr_filtered():\n    p = subprocess.Popen([sys.executable, '-c', sys.argv[1]])\n"
              "p.wait()\nimport time; time.sleep(0.3)\n")
    done = subprocess.run([sys.executable, "-c", runner, code], capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stderr == "Exception in thread main: boom\nWARNING: a real JVM warning\npartial", done.stderr
