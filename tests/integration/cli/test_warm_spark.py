"""``streamledger batch run`` finds a warm Spark Connect server without a flag (issue 44, item 2): the
one named by ``$STREAMLEDGER_SPARK_REMOTE``, else the one ``streamledger spark-server start`` recorded;
without either it runs local Spark and says once, in one line, how to keep Spark warm. Real broker,
the suite's real Connect server, a new SQLite ledger per test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from streamledger.cli.spark import COLD_START
from tests.integration.cli.helpers import cli
from tests.integration.spark.helpers import create_stream
from tests.support.spark import _home

pytestmark = [pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(600)]


def _env(tmp_path: Path, rabbitmq_url: str) -> dict[str, str]:
    return {"STREAMLEDGER_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
            "STREAMLEDGER_BROKER_URL": rabbitmq_url}


def test_batch_run_uses_the_server_spark_server_start_recorded(
        spark_connect: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    """The record ``spark-server start`` writes, in the home the command runs with: no flag needed,
    one line names the server, no cold-start notice; a relative output root is the caller's."""
    import os

    s = stream_name("warm-recorded")
    create_stream(rabbitmq_url, s, 30)
    home = tmp_path / "home"
    (home / "spark-connect").mkdir(parents=True)
    fixture_record = _home() / "spark" / f"connect-{os.getpid()}" / "server.json"
    shutil.copy(fixture_record, home / "spark-connect" / "server.json")
    r = cli("batch", "run", "--stream", s, "--pipeline", "warm", "--output-root", "out", "--json",
            env=_env(tmp_path, rabbitmq_url), home=home, cwd=tmp_path)
    assert r.rc == 0, r.err
    assert json.loads(r.out)["records"] == 30
    assert f"Spark Connect server {spark_connect} (recorded by streamledger spark-server start)" in r.err, \
        r.err
    assert COLD_START not in r.err, r.err
    published = list((tmp_path / "out").rglob("*.parquet"))
    assert published, sorted(str(p) for p in tmp_path.rglob("*"))


def test_batch_run_uses_the_server_named_in_the_environment_and_refuses_a_bad_name(
        spark_connect: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    s = stream_name("warm-env")
    create_stream(rabbitmq_url, s, 20)
    env = {**_env(tmp_path, rabbitmq_url), "STREAMLEDGER_SPARK_REMOTE": spark_connect}
    out = str(tmp_path / "out")
    r = cli("batch", "run", "--stream", s, "--pipeline", "env", "--output-root", out, "--json", env=env,
            home=tmp_path / "home")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["records"] == 20
    assert f"Spark Connect server {spark_connect} ($STREAMLEDGER_SPARK_REMOTE)" in r.err, r.err
    assert COLD_START not in r.err, r.err
    bad = cli("batch", "run", "--stream", s, "--pipeline", "env", "--output-root", out,
              env={**env, "STREAMLEDGER_SPARK_REMOTE": "http://user:hunter2@spark:15002"},
              home=tmp_path / "home")
    assert bad.rc == 2, bad.err
    line = bad.one_error_line()
    assert "STREAMLEDGER_SPARK_REMOTE must look like sc://host:port" in line and "hunter2" not in line


def test_a_cold_local_batch_says_once_how_to_keep_spark_warm_shows_noise_under_v_idle_starts_no_jvm(
        rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    """No server named or recorded: local Spark, and the notice once; with ``-v`` Spark's own start-up
    noise shows too (the default keeps it off: asserted on a new user's first batch in
    test_first_hour.py); the next batch of the same pipeline has nothing new and starts no JVM, so it
    says nothing of one. One cold JVM start for the three (the suite keeps its cold starts few)."""
    s = stream_name("cold")
    create_stream(rabbitmq_url, s, 20)
    env = _env(tmp_path, rabbitmq_url)
    args = ("batch", "run", "--stream", s, "--pipeline", "cold", "--output-root", str(tmp_path / "out"),
            "--json")
    r = cli("-v", *args, env=env, home=tmp_path / "home")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["records"] == 20
    assert r.err.splitlines().count(COLD_START) == 1, r.err
    assert "Using incubator modules" in r.err and "NativeCodeLoader" in r.err, r.err
    idle = cli(*args, env=env, home=tmp_path / "home")
    assert idle.rc == 0, idle.err
    assert COLD_START not in idle.err, idle.err
