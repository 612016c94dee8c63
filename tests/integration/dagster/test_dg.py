"""``StreamBatchComponent`` the way a Dagster user runs it: ``dg`` in fresh processes on a project
laid out as ``create-dagster`` lays it out, against the real broker and local Spark.

``dg list components`` finds the component through streamledger's entry point; ``dg scaffold defs``
writes its commented defs.yaml; ``dg check defs`` loads with the broker unreachable (discovery is
state, not a load-time call); ``dg utils refresh-defs-state`` discovers the partitions;
``dg launch`` runs the batch and its audit check. One launch only: each starts a JVM (30-75 s on
the shared 2-core machine); a second batch reading only new data is the factories' behaviour,
proven in test_assets.py."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient

pytestmark = [pytest.mark.dagster, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[3]
DG = str(Path(sys.executable).parent / "dg")
TYPE = "streamledger.dagster.components.StreamBatchComponent"
DOWN_URL = "rabbitmq-stream://guest:guest@127.0.0.1:9/"  # discard port: nothing listens


def project(root: Path) -> Path:
    """A dg project: pyproject, ``definitions.py`` loading the defs folder (in-process executor)."""
    (root / "src" / "sl_proj" / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "sl-proj"
        version = "0.1.0"
        requires-python = ">=3.11"
        dependencies = ["streamledger[dagster]"]

        [tool.dg]
        directory_type = "project"

        [tool.dg.project]
        root_module = "sl_proj"
        """))
    (root / "src" / "sl_proj" / "__init__.py").write_text("")
    (root / "src" / "sl_proj" / "defs" / "__init__.py").write_text("")
    (root / "src" / "sl_proj" / "definitions.py").write_text(textwrap.dedent("""\
        from pathlib import Path

        import dagster as dg


        @dg.definitions
        def defs() -> dg.Definitions:
            # one process per run: the Spark session of the batch step is started once
            return dg.Definitions.merge(
                dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
                dg.Definitions(executor=dg.in_process_executor),
            )
        """))
    return root


@pytest.fixture
def super_stream(rabbitmq_url: str, stream_name: Any) -> Iterator[tuple[str, list[str]]]:
    name = stream_name.super_stream("dgcli")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=2)
        partitions = client.partitions(name)
    yield name, partitions
    with StreamClient.connect(rabbitmq_url) as client:
        client.delete_super_stream(name, missing_ok=True)


def publish(url: str, partitions: list[str], ids: range) -> None:
    with StreamClient.connect(url) as client:
        for n, p in enumerate(partitions):
            bodies = [json.dumps({"id": i}).encode() for i in ids if i % len(partitions) == n]
            assert client.publish(p, bodies).confirmed == len(bodies)


def test_dg_scaffold_check_refresh_launch(rabbitmq_url: str, super_stream: tuple[str, list[str]],
                                          tmp_path: Path) -> None:
    registered = {e.value for e in importlib.metadata.entry_points(group="dagster_dg_cli.registry_modules")}
    assert "streamledger.dagster.components" in registered, (
        "streamledger's dagster_dg_cli.registry_modules entry point is not installed: reinstall the "
        "package (make venv / pip install -e .)"
    )
    name, partitions = super_stream
    root = project(tmp_path / "proj")
    out, ledger_url, pipeline = tmp_path / "out", f"sqlite:///{tmp_path / 'ledger.db'}", f"p-{name}"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "src"), str(root / "src"), os.environ.get("PYTHONPATH", "")]
        ),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "COLUMNS": "250",
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }
    (tmp_path / "home").mkdir()
    timings: dict[str, float] = {}

    def dg(*args: str, broker: str = rabbitmq_url, stdout_only: bool = False) -> str:
        began = time.monotonic()
        done = subprocess.run([DG, *args], cwd=root, env={**env, "SL_BROKER_URL": broker},
                              capture_output=True, text=True, timeout=240, check=False)
        timings[" ".join(args[:2])] = round(time.monotonic() - began, 1)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"dg {' '.join(args)}:\n{output[-4000:]}"
        assert "guest:guest" not in output, "the broker password must not reach dg's output"
        return done.stdout if stdout_only else output

    assert TYPE in dg("list", "components")

    dg("scaffold", "defs", TYPE, "events")
    defs_yaml = root / "src" / "sl_proj" / "defs" / "events" / "defs.yaml"
    scaffolded = defs_yaml.read_text()
    assert scaffolded.startswith(f"type: {TYPE}") and "# Consumer reference" in scaffolded
    defs_yaml.write_text(textwrap.dedent(f"""\
        type: {TYPE}
        attributes:
          pipeline: {pipeline}
          super_stream: {name}
          output_root: {out}
          broker_url_env: SL_BROKER_URL
          ledger_url: {ledger_url}
          spark_master: local[1]
          asset_attributes:
            key: "streams/{{{{ pipeline }}}}"
            owners: ["team:data"]
        """))
    key = f"streams/{pipeline}"

    # the broker is down: the location still loads (discovery is state, not a call at load time)
    assert "All definitions loaded successfully" in dg("check", "defs", broker=DOWN_URL)
    dg("utils", "refresh-defs-state")
    [state] = (root / "src" / "sl_proj" / "defs" / ".local_defs_state").glob("*/state")
    assert json.loads(state.read_text())["streams"] == partitions

    publish(rabbitmq_url, partitions, range(30))
    first = dg("launch", "--assets", key)
    assert "RUN_SUCCESS" in first and "Asset check 'ledger_audit' on 'streams/" in first and "passed" in first

    ledger = Ledger(ledger_url)
    committed = sorted((r.source.stream, r.start, r.end, r.records) for r in ledger.ranges(pipeline)
                       if str(r.status) == "committed")
    assert committed == [(p, 0, 15, 15) for p in partitions]
    ids = [json.loads(b)["id"] for f in sorted((out / pipeline).glob("*/*/*/*.parquet"))
           for b in pq.read_table(f, columns=["body"]).column("body").to_pylist()]
    assert sorted(ids) == list(range(30))
    print("dg timings (s):", timings)
