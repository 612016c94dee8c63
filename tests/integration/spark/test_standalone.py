"""The job on a real Spark standalone cluster (master + worker on loopback) through spark-submit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import streamledger.spark.job as job_module
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.spark.helpers import body, publish

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.slow]


def test_spark_submit_job_on_standalone_cluster(
    spark_standalone: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    sup = stream_name.super_stream("cluster")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(sup, partitions=2)
        parts = client.partitions(sup)
    publish(rabbitmq_url, parts[0], 1500)
    publish(rabbitmq_url, parts[1], 700)
    out = tmp_path / "out"
    ranges = {parts[0]: [250, 1499], parts[1]: [0, 700]}
    app = Path(job_module.__file__).resolve()  # the module's file itself, as a user would submit it
    proc = spark_standalone.submit(
        app,
        ["--url", rabbitmq_url, "--ranges", json.dumps(ranges), "--output", str(out), "--splits", "2"],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert f"Connecting to master {spark_standalone.master_url}" in proc.stderr or (
        spark_standalone.master_url in proc.stderr
    )
    manifest = json.loads((out / "_manifest.json").read_text())
    streams = manifest["streams"]
    assert {s: (e["records"], e["first_offset"], e["last_offset"]) for s, e in streams.items()} == {
        parts[0]: (1249, 250, 1498),
        parts[1]: (700, 0, 699),
    }
    table = pq.read_table(out, columns=["stream", "offset", "body"]).to_pylist()
    assert len(table) == 1949
    assert all(r["body"] == body(r["stream"], r["offset"]) for r in table)
    # The executors ran on the worker: its work dir holds this application's executor logs.
    apps = list((spark_standalone.root / "work").glob("app-*"))
    assert apps, "no application ran on the standalone worker"
