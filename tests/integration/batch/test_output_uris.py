"""Issue 11, item 6: output locations as URIs, written through Spark's Hadoop file-system layer.

``file://`` roots through a real ``local[2]`` session against the RabbitMQ 4.3 broker, with a real
SQLite ledger: the job writes data and manifests through the session's Hadoop FS, the batch
verifies, commits and publishes through it, crashes between the steps are ``BaseException`` kills
(no clean-up of the batch runs, as with SIGKILL), and the published output reads back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest

from streamledger import fs
from streamledger.batch import BatchConfig, LocalSparkRunner, RunId, run_batch
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.spark.fs import HadoopFS
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.timeout(300)]


class Killed(BaseException):
    """SIGKILL, as far as the batch can tell."""


class Runner(LocalSparkRunner):
    """The real local runner on the shared session, counting jobs; ``fs_wrap`` wraps its file system."""

    def __init__(self, spark: Any) -> None:
        super().__init__()
        self._spark = spark
        self.calls = 0
        self.fs_wrap: Any = None

    def __call__(self, **kwargs: Any) -> Mapping[str, Any]:
        self.calls += 1
        return super().__call__(**kwargs)

    def filesystem(self, location: str) -> fs.OutputFS:
        inner = super().filesystem(location)
        return inner if self.fs_wrap is None else self.fs_wrap(inner)


class DiesMidCopy:
    """Spark's Hadoop FS, without atomic rename (as on an object store), killed after ``n`` copies."""

    def __init__(self, inner: fs.OutputFS, n: int) -> None:
        self.inner, self.left = inner, n
        self.copies: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def renames_atomically(self, uri: str) -> bool:
        return False

    def copy_file(self, src: str, dst: str) -> None:
        if self.left == 0:
            raise Killed(f"killed while copying {src}")
        self.left -= 1
        self.inner.copy_file(src, dst)
        self.copies.append(fs.name(dst))

    def create_file(self, uri: str, data: bytes) -> None:  # the manifest's create-only write, a copy too
        if self.left == 0:
            raise Killed(f"killed while writing {uri}")
        self.left -= 1
        self.inner.create_file(uri, data)
        self.copies.append(fs.name(uri))


@pytest.fixture
def client(rabbitmq_url: str) -> Iterator[StreamClient]:
    with StreamClient.connect(rabbitmq_url) as c:
        yield c


def local(uri: str) -> Path:
    assert uri.startswith("file://"), uri
    return Path(urlsplit(uri).path)


def crash_after(step: str) -> Any:
    def hook(name: str, batch: Any) -> None:
        if name == step:
            raise Killed(f"killed after {step}")
    return hook


def read_back(spark: Any, ledger: Ledger, pipeline: str) -> dict[str, list[bytes]]:
    """What a downstream reader sees: every committed range's published directory, by URI."""
    out: dict[str, list[bytes]] = {}
    for r in ledger.ranges(pipeline):
        if r.status != RangeStatus.COMMITTED or not r.records:
            continue
        assert r.output is not None and r.output.startswith("file:///"), r.output
        manifest = json.loads((local(r.output) / "_manifest.json").read_text())
        assert manifest["range_id"] == r.id and manifest["output"] == r.output
        assert manifest["streams"][r.source.stream]["records"] == r.records
        rows = spark.read.parquet(r.output).select("offset", "body").collect()  # through Spark, by URI
        assert len(rows) == r.records
        table = pq.read_table(str(local(r.output)), columns=["body"])  # and as plain files
        assert sorted(table.column("body").to_pylist()) == sorted(bytes(x["body"]) for x in rows)
        out.setdefault(r.source.stream, []).extend(bytes(x["body"]) for x in rows)
    return {s: sorted(v) for s, v in out.items()}


def test_file_uri_root_crash_after_commit_then_retry_publishes_from_staging(
    spark: Any, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
) -> None:
    """A super stream into ``file://``: killed after the commit, the retry publishes the recorded
    staging copies (no second job) through Spark's Hadoop FS, and the output reads back by URI."""
    sup = stream_name.super_stream("fs11uri")
    client.create_super_stream(sup, partitions=2)
    parts = client.partitions(sup)
    publish(rabbitmq_url, parts[0], 70)
    publish(rabbitmq_url, parts[1], 30)
    root = (tmp_path / "out").as_uri()
    cfg = BatchConfig(pipeline="p-uri", url=rabbitmq_url, output_root=root, super_stream=sup)
    runner = Runner(spark)
    seen: list[Any] = []
    with pytest.raises(Killed):
        run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner,
                  on_step=lambda step, b: (seen.append(b.fs), crash_after("committed")(step, b)))
    assert isinstance(seen[-1], HadoopFS)
    committed = [r for r in ledger.ranges("p-uri") if r.status == RangeStatus.COMMITTED]
    assert sorted(r.records for r in committed) == [30, 70]
    for r in committed:
        assert r.staging is not None and r.staging.startswith(root + "/_staging/"), r.staging
        assert (local(r.staging) / "_manifest.json").is_file()
        assert not local(str(r.output)).exists(), "published before the publish step"
    assert runner.calls == 1

    result = run_batch(cfg, run=RunId("dag", "r1", "t", try_number=2), ledger=ledger, broker=client,
                       runner=runner)
    assert runner.calls == 1, "the retry read the stream again instead of publishing the staging copy"
    assert {p.stream: (p.status, p.records) for p in result.partitions} == {
        parts[0]: ("committed", 70), parts[1]: ("committed", 30)
    }
    assert read_back(spark, ledger, "p-uri") == {
        s: sorted(body(s, i) for i in range(n)) for s, n in ((parts[0], 70), (parts[1], 30))
    }
    assert client.query_offset(parts[0], "p-uri") == 69 and client.query_offset(parts[1], "p-uri") == 29
    staging = tmp_path / "out" / "_staging" / "p-uri"
    assert not any(p.is_file() for p in staging.rglob("*")), list(staging.rglob("*"))

    # New data, one more batch on the same root: a fresh range, published straight away.
    publish(rabbitmq_url, parts[0], 5, start=70)
    run_batch(cfg, run=RunId("dag", "r2", "t"), ledger=ledger, broker=client, runner=runner)
    assert read_back(spark, ledger, "p-uri")[parts[0]] == sorted(body(parts[0], i) for i in range(75))
    assert ledger.audit("p-uri", broker=client).clean


def test_publish_without_atomic_rename_interrupted_mid_copy_is_finished_by_the_retry(
    spark: Any, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
) -> None:
    """As on an object store (rename = copy + delete): the publish copies data files, the manifest
    last, then deletes staging. Killed after one copied file, the destination has no manifest (not
    published, readers skip it) and staging is whole; the retry completes it without a job."""
    s = stream_name("fs11copy")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 120, batch_size=40)
    root = (tmp_path / "out").as_uri()
    # Several data files, so the kill lands between them.
    cfg = BatchConfig(pipeline="p-copy", url=rabbitmq_url, output_root=root, stream=s, splits=3)
    runner = Runner(spark)
    dying: list[DiesMidCopy] = []
    runner.fs_wrap = lambda inner: dying.append(DiesMidCopy(inner, 1)) or dying[-1]
    with pytest.raises(Killed):
        run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
    (r,) = ledger.ranges("p-copy")
    assert r.status == RangeStatus.COMMITTED and r.records == 120 and r.output and r.staging
    final, staging = local(r.output), local(r.staging)
    assert [p.name for p in final.iterdir() if not p.name.startswith(".")] == dying[0].copies
    assert not (final / "_manifest.json").exists()
    data_files = sorted(p.name for p in staging.iterdir() if p.name.endswith(".parquet"))
    assert len(data_files) >= 2, data_files

    runner.fs_wrap = lambda inner: dying.append(DiesMidCopy(inner, 100)) or dying[-1]
    run_batch(cfg, run=RunId("dag", "r1", "t", try_number=2), ledger=ledger, broker=client, runner=runner)
    assert runner.calls == 1
    assert dying[-1].copies[-1] == "_manifest.json", dying[-1].copies
    assert sorted(p.name for p in final.iterdir() if p.name.endswith(".parquet")) == data_files
    assert not staging.exists() and not list(final.parent.glob("*.superseded-*"))
    assert read_back(spark, ledger, "p-copy") == {s: sorted(body(s, i) for i in range(120))}
    assert client.query_offset(s, "p-copy") == 119
