"""Issue 32: the batch end to end on ``s3://``, against an S3-compatible server on loopback (moto).

Real broker, real local Spark (the Arrow writer's tasks write through ``pyarrow.fs``; the session has no
Hadoop S3 connector, so everything the batch does to the bucket goes through pyarrow too), a real
SQLite ledger. The crash table's rows are ``BaseException`` kills at each step (no clean-up runs, as
with SIGKILL); the retry finishes, the audit is clean, and a deleted object makes it exit 1. The
credentials come from the environment only and never show in any output.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger import fs
from streamledger.batch import BatchConfig, RunId, run_batch
from streamledger.batch.proof import audit
from streamledger.cli import main as cli
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, Killed
from tests.integration.spark.helpers import body, create_stream, publish
from tests.support.ledgers import sqlite_ledger_url
from tests.support.s3 import Bucket

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.timeout(300)]


@pytest.fixture
def ledger_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


@pytest.fixture
def ledger(ledger_url: str, sqlite_ledger_template: Path) -> Iterator[Ledger]:
    url = sqlite_ledger_url(sqlite_ledger_template, Path(ledger_url.removeprefix("sqlite:///")))
    with Ledger(url) as led:
        yield led


def read_back(bucket: Bucket, ledger: Ledger, pipeline: str) -> dict[str, list[bytes]]:
    """What a downstream reader of the directory layout sees: every committed range's published
    prefix, its manifest and the files it lists, read with pyarrow from the bucket."""
    store = bucket.filesystem()
    out: dict[str, list[bytes]] = {}
    for r in ledger.ranges(pipeline):
        if r.status != RangeStatus.COMMITTED or not r.records:
            continue
        assert r.output is not None and r.output.startswith(bucket.uri()), r.output
        prefix = r.output[len(bucket.uri()) + 1:]
        with store.open_input_stream(f"{bucket.name}/{prefix}/_manifest.json") as f:  # type: ignore[attr-defined]
            manifest = json.loads(f.read())
        assert manifest["range_id"] == r.id and manifest["streams"][r.source.stream]["records"] == r.records
        assert sorted(manifest["files"]) == [k[len(prefix) + 1:] for k in bucket.keys(prefix)
                                             if not k.endswith("/_manifest.json")]
        table = pq.read_table([f"{bucket.name}/{prefix}/{n}" for n in manifest["files"]], filesystem=store)
        assert table.num_rows == r.records
        out.setdefault(r.source.stream, []).extend(table.column("body").to_pylist())
    return {s: sorted(v) for s, v in out.items()}


def listing_reader(bucket: Bucket, prefix: str) -> int:
    """A reader that knows only the layout, not the ledger: it lists ``prefix`` and reads every range
    prefix whose ``_manifest.json`` is there, the files it lists. Returns the rows it sees."""
    store = bucket.filesystem()
    rows = 0
    for key in bucket.keys(prefix):
        if key.endswith("/_manifest.json") and "/_staging/" not in f"/{key}":
            with store.open_input_stream(f"{bucket.name}/{key}") as f:  # type: ignore[attr-defined]
                manifest = json.loads(f.read())
            where = key.rsplit("/", 1)[0]
            rows += pq.read_table([f"{bucket.name}/{where}/{n}" for n in manifest["files"]],
                                  filesystem=store).num_rows
    return rows


def crash_after(step: str) -> Any:
    def hook(name: str, batch: Any) -> None:
        if name == step:
            raise Killed(f"killed after {step}")
    return hook


def test_a_batch_on_s3_end_to_end_then_a_deleted_object_fails_the_audit(
    spark: Any, s3_bucket: Bucket, ledger: Ledger, ledger_url: str, client: StreamClient, rabbitmq_url: str,
    stream_name: Any, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="streamledger")  # every line the batch logs is searched
    s = stream_name("s3e2e")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 150, batch_size=50)
    cfg = BatchConfig(pipeline="p-s3", url=rabbitmq_url, output_root=s3_bucket.uri("out"), stream=s, splits=3)
    runner = CountingRunner(spark)
    seen: list[Any] = []
    result = run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner,
                       on_step=lambda step, b: seen.append(b.fs))
    assert isinstance(seen[-1], fs.ArrowFS)
    assert [(p.status, p.records) for p in result.partitions] == [("committed", 150)]
    assert read_back(s3_bucket, ledger, "p-s3") == {s: sorted(body(s, i) for i in range(150))}
    assert not [k for k in s3_bucket.keys("out/_staging") if not k.endswith("/")], "staging left behind"
    assert client.query_offset(s, "p-s3") == 149
    assert audit(ledger, "p-s3", broker=client, deep=True).clean

    assert cli(["ledger", "audit", "--db", ledger_url, "--pipeline", "p-s3", "--deep"]) == 0
    (r,) = [r for r in ledger.ranges("p-s3") if r.records]
    assert r.output is not None
    prefix = r.output[len(s3_bucket.uri()) + 1:]
    victim = next(k for k in s3_bucket.keys(prefix) if k.endswith(".parquet"))
    s3_bucket.filesystem().delete_file(f"{s3_bucket.name}/{victim}")  # type: ignore[attr-defined]
    assert cli(["ledger", "audit", "--db", ledger_url, "--pipeline", "p-s3"]) == 1
    out, err = capfd.readouterr()
    assert victim.rsplit("/", 1)[1] in out
    logged = out + err + caplog.text
    assert s3_bucket.secret_key not in logged and s3_bucket.access_key not in logged


@pytest.mark.parametrize("step", ["read", "committed", "mid-publish", "published"])
def test_crash_rows_on_s3(
    spark: Any, s3_bucket: Bucket, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any,
    step: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    """Killed after the write (``read``: files in staging, nothing committed), after the commit,
    mid-publish (one data file copied, no manifest at the destination) and before the offset is
    stored (``published``): the next try finishes exactly once, the audit is clean."""
    caplog.set_level(logging.DEBUG, logger="streamledger")  # every line the batch logs is searched
    s = stream_name("s3crash")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 90, batch_size=30)
    cfg = BatchConfig(pipeline="p-crash", url=rabbitmq_url, output_root=s3_bucket.uri("out"), stream=s,
                      splits=3)
    runner = CountingRunner(spark)
    copies: list[str] = []
    if step == "mid-publish":
        real_copy = fs.ArrowFS.copy_file

        def dying_copy(self: fs.ArrowFS, src: str, dst: str) -> None:
            if copies:
                raise Killed(f"killed while copying {src}")
            real_copy(self, src, dst)
            copies.append(dst)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fs.ArrowFS, "copy_file", dying_copy)
            with pytest.raises(Killed):
                run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
        (r,) = ledger.ranges("p-crash")
        assert r.status == RangeStatus.COMMITTED and r.output is not None and len(copies) == 1
        prefix = r.output[len(s3_bucket.uri()) + 1:]
        assert s3_bucket.keys(prefix) == [copies[0][len(s3_bucket.uri()) + 1:]], "a manifest before its files"
        assert listing_reader(s3_bucket, "out") == 0, "a reader listing mid-publish saw a partial range"
    else:
        with pytest.raises(Killed):
            run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner,
                      on_step=crash_after(step))
    (r,) = ledger.ranges("p-crash")
    if step == "read":
        assert r.status == RangeStatus.CLAIMED
    else:
        assert r.status == RangeStatus.COMMITTED and r.records == 90
    assert client.query_offset(s, "p-crash") is None

    run_batch(cfg, run=RunId("dag", "r1", "t", try_number=2), ledger=ledger, broker=client, runner=runner)
    assert runner.calls == (2 if step == "read" else 1), "the retry read the stream again"
    assert read_back(s3_bucket, ledger, "p-crash") == {s: sorted(body(s, i) for i in range(90))}
    assert client.query_offset(s, "p-crash") == 89
    assert listing_reader(s3_bucket, "out") == 90
    report = audit(ledger, "p-crash", broker=client, deep=True)
    assert report.clean, report.to_text()
    out, err = capfd.readouterr()
    logged = out + err + caplog.text
    assert s3_bucket.secret_key not in logged and s3_bucket.access_key not in logged


@pytest.mark.parametrize("root, reason", [
    ("s3://sl-no-such-bucket-32/out", "bucket 'sl-no-such-bucket-32' does not exist"),
    ("nosuchscheme://somewhere/out", "no file system for it here"),
])
def test_an_unreachable_output_is_refused_before_any_claim(
    s3_bucket: Bucket, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any,
    root: str, reason: str,
) -> None:
    s = stream_name("s3bad")
    create_stream(rabbitmq_url, s, 5)
    cfg = BatchConfig(pipeline="p-bad", url=rabbitmq_url, output_root=root, stream=s)
    with pytest.raises(fs.LocationError) as caught:
        run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client,
                  runner=lambda **kw: pytest.fail("the job ran"))
    assert str(caught.value).startswith(f"output {root}: ") and reason in str(caught.value)
    assert "\n" not in str(caught.value)
    assert ledger.ranges("p-bad") == []


def test_credentials_in_the_location_are_refused_without_showing_them(s3_bucket: Bucket) -> None:
    """``s3://key:secret@bucket/out`` (a form pyarrow's own URIs take) was split as bucket
    ``key:secret``: check_location let pyarrow's ArrowInvalid through, its message naming the
    "bucket", i.e. the secret key, in full. The location is now refused in one line, masked."""
    uri = f"s3://{s3_bucket.access_key}:{s3_bucket.secret_key}@{s3_bucket.name}/out"
    with pytest.raises(fs.LocationError) as refused:
        fs.check_location(uri)
    assert s3_bucket.secret_key not in str(refused.value)
    assert "credentials in the URI" in str(refused.value)


def test_a_reader_listing_while_the_publish_runs_never_counts_a_range_without_its_manifest(
    spark: Any, s3_bucket: Bucket, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any,
) -> None:
    """The reader contract of docs/ledger.md on a store without rename: a thread lists the layout
    over and over while the batch publishes (each copy slowed so the copy is seen half done). Every
    look sees the range whole or not at all, and never a manifest naming a file not there yet, while
    a reader globbing data files would have seen part of it."""
    import threading
    import time

    s = stream_name("s3list")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 90, batch_size=30)
    cfg = BatchConfig(pipeline="p-list", url=rabbitmq_url, output_root=s3_bucket.uri("out"), stream=s,
                      splits=3)
    copying = threading.Event()
    real_copy = fs.ArrowFS.copy_file

    def slow_copy(self: fs.ArrowFS, src: str, dst: str) -> None:
        copying.set()
        real_copy(self, src, dst)
        time.sleep(0.4)

    looks: list[tuple[bool, int, int]] = []  # (during the copy, rows the reader counts, data objects)
    failures: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            during = copying.is_set()
            try:
                data = [k for k in s3_bucket.keys("out/p-list") if k.endswith(".parquet")]
                looks.append((during, listing_reader(s3_bucket, "out/p-list"), len(data)))
            except BaseException as exc:  # a manifest naming a file not there yet, say
                failures.append(exc)
                return

    thread = threading.Thread(target=reader, daemon=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fs.ArrowFS, "copy_file", slow_copy)
        thread.start()
        try:
            run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client,
                      runner=CountingRunner(spark))
        finally:
            done.set()
            thread.join(timeout=60)
    assert not failures, failures
    assert {rows for _during, rows, _n in looks} <= {0, 90}, looks
    partial = [n for during, rows, n in looks if during and rows == 0 and n > 0]
    assert partial, f"no look saw the publish half done (looks: {looks})"
    assert listing_reader(s3_bucket, "out/p-list") == 90
