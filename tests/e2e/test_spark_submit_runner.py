"""Scaling out: the batch's Spark job submitted with the apache-spark provider's SparkSubmitHook to a
real Spark standalone cluster (master + worker on loopback), then verified, committed and stored
like an in-process run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest

from streamledger.batch import BatchConfig, RunId, run_batch
from streamledger.ledger import Ledger
from streamledger.operators.batch import SparkSubmitRunner
from streamledger.protocol.rabbitmq import StreamClient

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.slow]


def cluster_connection(spark_standalone: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow's connection ``spark_cluster`` to the standalone master, and spark-submit on the PATH."""
    master = urlsplit(spark_standalone.master_url)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", json.dumps(
        {"conn_type": "spark", "host": f"spark://{master.hostname}", "port": master.port}))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")


def stream_of_ids(url: str, stream: str, n: int) -> str:
    """A new stream holding ``{"id": i}`` for i in range(n)."""
    with StreamClient.connect(url) as client:
        client.create_stream(stream)
        client.publish(stream, [json.dumps({"id": i}).encode() for i in range(n)])
    return stream


def test_batch_through_spark_submit_on_a_standalone_cluster(
    spark_standalone: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster_connection(spark_standalone, monkeypatch)
    stream = stream_of_ids(rabbitmq_url, stream_name("submit"), 40)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=True)
    config = BatchConfig(pipeline="submit-p", url=rabbitmq_url, output_root=str(tmp_path / "out"),
                         stream=stream, splits=2)
    runner = SparkSubmitRunner("spark_cluster", conf={"spark.cores.max": "1"}, name="streamledger-test")
    with StreamClient.connect(rabbitmq_url) as broker:
        result = run_batch(config, run=RunId("dag", "run", "task"), ledger=ledger, broker=broker,
                           runner=runner)

    (part,) = result.partitions
    assert (part.start, part.end, part.records, part.status) == (0, 40, 40, "committed")
    assert part.output is not None
    ids = [json.loads(b)["id"] for f in sorted(Path(part.output).glob("*.parquet"))
           for b in pq.read_table(f, columns=["body"]).column("body").to_pylist()]
    assert sorted(ids) == list(range(40))
    (committed,) = ledger.ranges("submit-p")
    assert committed.offset_verified and committed.records == 40
    with StreamClient.connect(rabbitmq_url) as client:
        assert client.query_offset(stream, "submit-p") == 39


def test_a_transform_through_spark_submit_on_a_standalone_cluster(
    spark_standalone: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator's runner (``spark_conn_id``) takes the pipeline's transform to the submitted job
    (issue 42: docs/transforms.md, 'Where the transform runs'): JSON decoded and filtered by SQL on
    the cluster, the range's rows and ``rows_out`` what plain Python computes from the records."""
    cluster_connection(spark_standalone, monkeypatch)
    stream = stream_of_ids(rabbitmq_url, stream_name("submit-transform"), 30)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=True)
    config = BatchConfig(pipeline="submit-t", url=rabbitmq_url, output_root=str(tmp_path / "out"),
                         stream=stream, body_format="json", body_schema="id INT",
                         sql="SELECT id, id * 2 AS twice FROM records WHERE id % 3 = 0")
    runner = SparkSubmitRunner("spark_cluster", conf={"spark.cores.max": "1"}, name="streamledger-test")
    with StreamClient.connect(rabbitmq_url) as broker:
        run_batch(config, run=RunId("dag", "run", "task"), ledger=ledger, broker=broker, runner=runner)
    (committed,) = ledger.ranges("submit-t")
    assert committed.output is not None
    rows = [r for f in sorted(Path(committed.output).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert sorted((r["id"], r["twice"]) for r in rows) == [(i, 2 * i) for i in range(30) if i % 3 == 0]
    assert (committed.records, committed.rows_out) == (30, 10)
