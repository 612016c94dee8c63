"""The bounded read job: in-process ``run_job`` and ``python -m streamledger.spark.job``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger.offsets import DataLossError  # what the job raises for any log
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.spark.job import MANIFEST, run_job
from tests.integration.spark.helpers import body, create_stream, publish
from tests.integration.spark.test_datasource import retention_stream
from tests.support.spark import spark_env

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]


def written(path: Path) -> dict[str, list[int]]:
    table = pq.read_table(path, columns=["stream", "offset"])
    out: dict[str, list[int]] = {}
    for s, o in zip(table.column("stream").to_pylist(), table.column("offset").to_pylist(), strict=True):
        out.setdefault(s, []).append(o)
    return {k: sorted(v) for k, v in out.items()}


def test_run_job_manifest_and_idempotent_rerun(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    a, b = stream_name("a"), stream_name("b")
    create_stream(rabbitmq_url, a, 1000)
    create_stream(rabbitmq_url, b, 40)
    out = tmp_path / "run-1"
    ranges = {a: (100, 901), b: (40, 40)}
    manifest = run_job(spark, url=rabbitmq_url, ranges=ranges, output=str(out), splits=3)
    on_disk = json.loads((out / MANIFEST).read_text())
    assert on_disk == manifest
    manifest = json.loads(json.dumps(manifest))
    assert manifest["format"] == "parquet" and manifest["output"] == str(out)
    # one job for both streams, each in its own subdirectory (an empty one for a stream without records)
    paths = {s: Path(e.pop("path")) for s, e in manifest["streams"].items()}
    assert paths[a].parent == out and paths[b].parent == out and paths[a] != paths[b] and paths[b].is_dir()
    # the Arrow writer (the default for Parquet) lists the files that count: exactly what is there
    files = {s: e.pop("files") for s, e in manifest["streams"].items()}
    assert files[a] == sorted(p.name for p in paths[a].iterdir()) and len(files[a]) == 3 and files[b] == []
    assert written(paths[a]) == {a: list(range(100, 901))}
    assert manifest["streams"][a] == {
        "start": 100, "end": 901, "read_start": 100, "records": 801, "first_offset": 100, "last_offset": 900,
    }
    assert manifest["streams"][b] == {
        "start": 40, "end": 40, "read_start": 40, "records": 0, "first_offset": None, "last_offset": None,
    }
    assert written(out) == {a: list(range(100, 901))}
    bodies = pq.read_table(out, columns=["offset", "body"]).to_pylist()
    assert all(r["body"] == body(a, r["offset"]) for r in bodies)

    # Same run again (e.g. an Airflow retry): the directory is replaced, never appended to.
    publish(rabbitmq_url, a, 50, start=1000)
    again = run_job(spark, url=rabbitmq_url, ranges=ranges, output=str(out), splits=2)
    assert again["streams"][a]["records"] == 801
    assert written(out) == {a: list(range(100, 901))}


def test_run_job_all_ranges_empty(spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    s = stream_name("none")
    create_stream(rabbitmq_url, s, 3)
    out = tmp_path / "empty"
    manifest = run_job(spark, url=rabbitmq_url, ranges={s: (3, 3)}, output=str(out), fmt="json")
    assert manifest["streams"][s]["records"] == 0
    assert manifest["streams"][s]["first_offset"] is None


def test_run_job_records_loss_or_fails(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    s, first, tail = retention_stream(rabbitmq_url, stream_name)
    with pytest.raises(DataLossError, match=f"first available offset is {first}"):
        run_job(spark, url=rabbitmq_url, ranges={s: (0, tail)}, output=str(tmp_path / "strict"))
    assert not (tmp_path / "strict").exists()  # nothing written before the check

    manifest = run_job(
        spark, url=rabbitmq_url, ranges={s: (0, tail)}, output=str(tmp_path / "lossy"),
        fail_on_data_loss=False,
    )
    entry = manifest["streams"][s]
    assert entry["lost"] == [[0, first]]
    assert (entry["start"], entry["read_start"], entry["end"]) == (0, first, tail)
    assert (entry["records"], entry["first_offset"], entry["last_offset"]) == (tail - first, first, tail - 1)


def test_module_cli_on_a_super_stream(rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    """``python -m streamledger.spark.job`` in its own process (own local[2] Spark)."""
    sup = stream_name.super_stream("cli")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(sup, partitions=2)
        parts = client.partitions(sup)
    publish(rabbitmq_url, parts[0], 120)
    publish(rabbitmq_url, parts[1], 80)
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, "-m", "streamledger.spark.job", "--url", rabbitmq_url, "--super-stream", sup,
         "--start", "earliest", "--end", "latest", "--output", str(out), "--splits", "2"],
        env=spark_env(), capture_output=True, text=True, timeout=600, check=False, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads(proc.stdout)
    assert manifest == json.loads((out / MANIFEST).read_text())
    assert {s: e["records"] for s, e in manifest["streams"].items()} == {parts[0]: 120, parts[1]: 80}
    assert written(out) == {parts[0]: list(range(120)), parts[1]: list(range(80))}
    assert "guest:guest" not in proc.stderr + proc.stdout


def test_cli_errors_are_one_line(rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    s = stream_name("err")
    create_stream(rabbitmq_url, s, 5)
    proc = subprocess.run(
        [sys.executable, "-m", "streamledger.spark.job", "--url", rabbitmq_url,
         "--ranges", json.dumps({s: [0, 99]}), "--output", str(tmp_path / "x")],
        env={**os.environ, **spark_env()}, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: stream {s!r}: end offset 99 is past the committed tail 5; "
        "a bounded read can only cover committed records"
    )


def _observed_metrics(df: Any) -> list[str]:
    """The metric expressions of the ``CollectMetrics`` node(s) in ``df``'s optimized plan."""
    out: list[str] = []
    todo = [df._jdf.queryExecution().optimizedPlan()]
    while todo:
        node = todo.pop()
        if node.nodeName() == "CollectMetrics":
            metrics = node.metrics()
            out += [metrics.apply(i).sql() for i in range(metrics.size())]
        children = node.children()
        todo += [children.apply(i) for i in range(children.size())]
    return out


def test_the_written_records_metrics_do_not_grow_with_the_streams(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: the job's observed metrics were 3 aggregates per stream (301 at 100 partitions, all
    evaluated on every row and compiled into one class); they must be a fixed number."""
    from pyspark.sql.classic.dataframe import DataFrame  # what a local session's frames are

    names = [stream_name(f"m{i}") for i in range(20)]
    for i, name in enumerate(names):
        create_stream(rabbitmq_url, name, 2 + i % 3)
    plain_write = DataFrame.write
    written_frames: list[Any] = []

    def capture(self: Any) -> Any:
        written_frames.append(self)
        return plain_write.fget(self)  # type: ignore[attr-defined]

    monkeypatch.setattr(DataFrame, "write", property(capture))
    metrics: dict[int, list[str]] = {}
    for n in (3, 20):
        ranges = {s: (0, 2 + i % 3) for i, s in enumerate(names[:n])}
        # the JVM writer's metrics (the Arrow writer observes none: its tasks summarize their files)
        manifest = run_job(spark, url=rabbitmq_url, ranges=ranges, output=str(tmp_path / f"n{n}"),
                           writer="spark")
        assert {s: e["records"] for s, e in manifest["streams"].items()} == {
            s: 2 + i % 3 for i, s in enumerate(names[:n])}
        assert all(e["first_offset"] == 0 and e["last_offset"] == e["records"] - 1
                   for e in manifest["streams"].values())
        metrics[n] = _observed_metrics(written_frames[-1])
    assert len(metrics[20]) == len(metrics[3]) <= 4, (
        f"observed metrics: {len(metrics[3])} for 3 streams, {len(metrics[20])} for 20"
    )


def test_the_local_runner_hands_the_batch_a_typed_manifest(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """Issue 31: a runner's result crosses into the batch as a ``Manifest``, not JSON data to re-parse."""
    from streamledger.manifest import Manifest
    from streamledger.spark.runners import LocalSparkRunner

    s = stream_name("typed")
    create_stream(rabbitmq_url, s, 30)
    runner = LocalSparkRunner()
    runner._spark = spark
    out = tmp_path / "typed"
    manifest = runner(url=rabbitmq_url, ranges={s: (0, 30)}, output=str(out), fmt="parquet", splits=1)
    assert isinstance(manifest, Manifest)
    assert manifest.streams[s].counts == (30, 0, 29)
    assert manifest == Manifest.from_json((out / MANIFEST).read_bytes())
