"""``pip install "streamledger[airflow,spark]"`` in a fresh venv gives a working, consistent environment.

The apache-spark provider depends on pyspark-client, whose files are a subset of pyspark's and land in
the same ``site-packages/pyspark/``; pyproject.toml pins both to one release so nothing has to be
reinstalled afterwards. This installs the package the way a user does (plain ``pip install`` of this
source tree, the machine's own pip configuration, no extra step) and then uses it: ``pip check``, every
pyspark file as recorded, a real read job on local Spark and the same job over a Spark Connect server
started from the venv. A warm pip cache (``make venv`` fills it) keeps this to a couple of minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import tomllib
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from packaging.requirements import Requirement

from tests.integration.spark.helpers import body, create_stream

pytestmark = [pytest.mark.install, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = "airflow,spark"
# Variables of the developer's shell that would make the venv's processes use this checkout or
# another pyspark instead of what was installed.
LEAKY_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SPARK_HOME", "SPARK_REMOTE",
             "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS",
             "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")


def spark_requirements() -> list[tuple[str, Requirement]]:
    """Every (extra, requirement) of pyproject.toml that installs pyspark or pyspark-client."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [(extra, req) for extra, reqs in extras.items() for req in map(Requirement, reqs)
            if req.name in ("pyspark", "pyspark-client")]


def pinned_release() -> str:
    """The one release pyspark and pyspark-client are pinned to (checked by the first test)."""
    return str(next(iter(spark_requirements()[0][1].specifier)).version)


def test_pyspark_and_pyspark_client_are_pinned_to_one_release() -> None:
    """The rule of docs/install.md, checked without installing anything."""
    reqs = spark_requirements()
    assert {req.name for _, req in reqs} == {"pyspark", "pyspark-client"}, reqs
    release = pinned_release()
    for extra, req in reqs:
        assert str(req.specifier) == f"=={release}", f"[{extra}] {req}: pin both to =={release}"


@dataclass
class FreshVenv:
    path: Path
    home: Path  # STREAMLEDGER_HOME of the venv's processes (Connect server state, logs)
    install_seconds: float

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in LEAKY_ENV}
        env.update(
            PATH=f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            PYSPARK_PYTHON=self.python, SPARK_LOCAL_IP="127.0.0.1", STREAMLEDGER_HOME=str(self.home),
        )
        return env

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env(), cwd=self.home, capture_output=True, text=True,
                              timeout=timeout, check=False)


def _copy_source(dest: Path) -> Path:
    """What a source install needs, without build leftovers of the developer's editable install."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build"))
    return dest


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshVenv]:
    base = tmp_path_factory.mktemp("fresh-venv")
    source = _copy_source(base / "source")
    path = base / "venv"
    home = base / "home"
    home.mkdir()
    venv.EnvBuilder(with_pip=True).create(path)
    fresh = FreshVenv(path, home, 0.0)
    try:
        t0 = time.monotonic()
        proc = fresh.run(fresh.python, "-m", "pip", "install", "-q", f"{source}[{EXTRAS}]", timeout=900)
        fresh.install_seconds = time.monotonic() - t0
        assert proc.returncode == 0, proc.stderr[-4000:]
        print(f"pip install .[{EXTRAS}] into a fresh venv: {fresh.install_seconds:.1f}s")
        yield fresh
    finally:
        shutil.rmtree(base, ignore_errors=True)  # ~1 GB (pyspark's jars, Airflow)


def test_install_is_consistent_and_pip_check_clean(fresh_venv: FreshVenv) -> None:
    check = fresh_venv.run(fresh_venv.python, "-m", "pip", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    probe = fresh_venv.run(fresh_venv.python, "-c", (
        "import importlib.metadata as md, json, pyspark, streamledger\n"
        "print(json.dumps({'runtime': pyspark.__version__, 'pyspark': md.version('pyspark'),\n"
        "  'pyspark-client': md.version('pyspark-client'), 'streamledger': streamledger.__file__}))"
    ))
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout)
    release = pinned_release()
    assert found["runtime"] == found["pyspark"] == found["pyspark-client"] == release, (found, release)
    assert found["streamledger"].startswith(str(fresh_venv.path)), found  # not this checkout
    # every file pyspark and pyspark-client record is on disk with its recorded hash
    files = fresh_venv.run(fresh_venv.python, str(ROOT / "scripts" / "check_pyspark.py"))
    assert files.returncode == 0, files.stderr
    assert "files intact" in files.stdout


def test_airflow_side_imports(fresh_venv: FreshVenv) -> None:
    """What a worker imports: the operators and hooks, the provider's hooks, the Connect client."""
    proc = fresh_venv.run(fresh_venv.python, "-c", (
        "import streamledger.operators, streamledger.hooks, streamledger.operators.batch\n"
        "from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook\n"
        "from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook\n"
        "from pyspark.sql.connect.session import SparkSession\n"
        "import streamledger.provider as p\n"
        # the Stream ledger page: its plugin entry point and its HTML ship in the wheel
        "from importlib.metadata import entry_points\n"
        "from importlib.resources import files\n"
        "eps = [e.value for e in entry_points(group='airflow.plugins') if e.name == 'streamledger']\n"
        "assert eps == ['streamledger.plugins.ledger_ui:StreamLedgerPlugin'], eps\n"
        "assert files('streamledger.plugins').joinpath('ledger_page.html').is_file()\n"
        "print(p.get_provider_info()['package-name'])"
    ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "streamledger"


def _read_job(fresh: FreshVenv, url: str, stream: str, out: Path, *extra: str) -> dict[str, Any]:
    proc = fresh.run(fresh.python, "-m", "streamledger.spark.job", "--url", url, "--stream", stream,
                     "--output", str(out), *extra)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest: dict[str, Any] = json.loads(proc.stdout)
    return manifest


@pytest.mark.spark
@pytest.mark.rabbitmq
def test_local_spark_job_in_the_fresh_venv(
    fresh_venv: FreshVenv, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """The zero-setup default: in-process local Spark, its Python workers on the venv's interpreter."""
    s = stream_name("local")
    create_stream(rabbitmq_url, s, 250)
    manifest = _read_job(fresh_venv, rabbitmq_url, s, tmp_path / "out", "--splits", "2")
    assert manifest["streams"][s]["records"] == 250
    table = pq.read_table(manifest["streams"][s]["path"], columns=["offset", "body"])
    assert sorted(table.column("offset").to_pylist()) == list(range(250))
    assert sorted(table.column("body").to_pylist()) == sorted(body(s, i) for i in range(250))


@pytest.mark.spark
@pytest.mark.rabbitmq
def test_connect_server_and_job_from_the_fresh_venv(
    fresh_venv: FreshVenv, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """``streamledger spark-server start`` runs from the wheel's jars; the job reads over Connect."""
    s = stream_name("connect")
    create_stream(rabbitmq_url, s, 120)
    started = fresh_venv.run("streamledger", "spark-server", "start")
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        url = started.stdout.strip().splitlines()[-1]
        assert url.startswith("sc://127.0.0.1:")
        manifest = _read_job(fresh_venv, rabbitmq_url, s, tmp_path / "out", "--remote", url)
    finally:
        stopped = fresh_venv.run("streamledger", "spark-server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert manifest["streams"][s]["records"] == 120
    offsets = pq.read_table(manifest["streams"][s]["path"], columns=["offset"]).column("offset")
    assert sorted(offsets.to_pylist()) == list(range(120))
