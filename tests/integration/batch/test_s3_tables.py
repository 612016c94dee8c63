"""Issue 32, item 2: the Iceberg and Delta sinks end to end on ``s3://``, against the S3-compatible
server on loopback (moto), the real RabbitMQ broker, local Spark and a real SQLite ledger.

The Iceberg sink's default catalog is the pyiceberg SQL catalog in the ledger's database, its
warehouse and the job's files in the bucket, reached through pyiceberg's ``PyArrowFileIO``; the Delta
sink is delta-rs, whose commits are conditional puts (``If-None-Match: *``) that moto honours, so no
``AWS_S3_ALLOW_UNSAFE_RENAME`` and no locking provider. Everything reaches the store with the
environment's ``AWS_*`` settings only (the ``s3_bucket`` fixture's, a random secret per test), and
the secret shows nowhere a test can look: logs, the bucket's every object (manifests, table
metadata, the Delta log), the ledger's database (the catalog lives there), the lineage of the
batch, the Spark session's configuration and the command lines of every process it started.

The crash table's rows are ``BaseException`` kills at each step (no clean-up runs, as with
SIGKILL), and one real SIGKILL per sink of a ``streamledger batch run`` process parked after its
table commit; the retry finishes exactly once, the audit is clean, and a deleted data file of a
committed range makes ``streamledger ledger audit`` exit 1. Tables are read back with pyiceberg and
deltalake, as a reader would.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streamledger import fs
from streamledger.batch import BatchConfig, BatchError, RunId, run_batch
from streamledger.batch.proof import audit
from streamledger.batch.sinks import KEY_PIPELINE, default_iceberg_table
from streamledger.cli import main as cli
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, Killed
from tests.integration.batch.test_table_faults import wait_for
from tests.integration.spark.helpers import body, create_stream, publish
from tests.support.ledgers import sqlite_ledger_url
from tests.support.s3 import Bucket
from tests.support.spark import spark_env

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.timeout(300)]

PIPE = "p-s3-tables"
ROOT = Path(__file__).resolve().parents[3]
SINKS = ["iceberg", "delta"]


@pytest.fixture
def ledger_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


@pytest.fixture
def ledger(ledger_url: str, sqlite_ledger_template: Path) -> Iterator[Ledger]:
    url = sqlite_ledger_url(sqlite_ledger_template, Path(ledger_url.removeprefix("sqlite:///")))
    with Ledger(url) as led:
        yield led


@pytest.fixture
def s3(s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """The bucket, and no way to an object store but the environment's (no shared AWS files)."""
    for name in ("AWS_S3_ALLOW_UNSAFE_RENAME", "AWS_ALLOW_HTTP", "AWS_S3_LOCKING_PROVIDER",
                 "AWS_CONDITIONAL_PUT", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    return s3_bucket


def cfg(bucket: Bucket, url: str, stream: str, sink: str, **kw: Any) -> BatchConfig:
    return BatchConfig(pipeline=PIPE, url=url, output_root=bucket.uri("out"), stream=stream, sink=sink,
                       splits=3, **kw)


# -- what a reader of the table sees (pyiceberg / deltalake, configured as a reader would) ---------

def reader_catalog(bucket: Bucket, ledger_url: str) -> Any:
    from pyiceberg.catalog import load_catalog

    from streamledger.batch.sinks.iceberg import CATALOG_NAME

    return load_catalog(CATALOG_NAME, type="sql", uri=ledger_url, **{
        "s3.endpoint": bucket.endpoint, "s3.region": "us-east-1"})


def delta_table(bucket: Bucket) -> Any:
    """The pipeline's Delta table where the sink puts it by default (``<output_root>/<pipeline>``)."""
    from deltalake import DeltaTable

    return DeltaTable(bucket.uri("out", PIPE), storage_options={"AWS_ALLOW_HTTP": "true"})


def table_rows(sink: str, bucket: Bucket, ledger: Ledger) -> pa.Table:
    if sink == "iceberg":
        tbl = reader_catalog(bucket, ledger.url).load_table(default_iceberg_table(PIPE))
        assert tbl.metadata_location.startswith(bucket.uri("out", "_iceberg")), tbl.metadata_location
        rows = tbl.scan().to_arrow()
    else:
        rows = delta_table(bucket).to_pyarrow_table()
    return rows.sort_by([("stream", "ascending"), ("offset", "ascending")])


def commits_of_pipeline(sink: str, bucket: Bucket, ledger: Ledger) -> list[int]:
    if sink == "iceberg":
        tbl = reader_catalog(bucket, ledger.url).load_table(default_iceberg_table(PIPE))
        return [s.snapshot_id for s in tbl.snapshots()
                if s.summary is not None and s.summary.additional_properties.get(KEY_PIPELINE) == PIPE]
    return [int(c["version"]) for c in delta_table(bucket).history() if c.get(KEY_PIPELINE) == PIPE]


def table_data_files(sink: str, bucket: Bucket, ledger: Ledger) -> list[str]:
    """The data files the table's current state references, as s3:// URIs."""
    if sink == "iceberg":
        tbl = reader_catalog(bucket, ledger.url).load_table(default_iceberg_table(PIPE))
        return sorted(t.file.file_path for t in tbl.scan().plan_files())
    return sorted(delta_table(bucket).file_uris())


def assert_exactly_once(sink: str, bucket: Bucket, ledger: Ledger, stream: str, n: int) -> None:
    rows = table_rows(sink, bucket, ledger)
    assert rows.column("offset").to_pylist() == list(range(n))  # every offset once, none twice
    assert rows.column("body").to_pylist() == [body(stream, i) for i in range(n)]
    committed = [r for r in ledger.ranges(PIPE) if r.records]
    assert committed and all(r.published_at is not None and r.sink_table and r.sink_table.startswith(sink)
                             for r in committed)
    if sink == "delta":
        assert {r.sink_table for r in committed} == {f"delta:{bucket.uri('out', PIPE)}"}
    assert sorted({r.sink_commit for r in committed}) == sorted(commits_of_pipeline(sink, bucket, ledger))
    assert all(f.startswith(bucket.uri("out")) for f in table_data_files(sink, bucket, ledger))


# -- where a secret could leak ----------------------------------------------------------------------

def process_tree(root: int) -> list[int]:
    """``root`` and every live process below it (``/proc``)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(p for p, pp in parent.items() if pp == pid)
    return tree


def command_lines(root: int) -> str:
    out = []
    for pid in process_tree(root):
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            out.append(raw.replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(out)


def stored_bytes(bucket: Bucket) -> bytes:
    """Every object in the bucket: data files, manifests, table metadata, the Delta log."""
    store = bucket.filesystem()
    blobs = []
    for key in bucket.keys(""):
        with store.open_input_stream(f"{bucket.name}/{key}") as f:  # type: ignore[attr-defined]
            blobs.append(f.read())
    return b"\n".join(blobs)


def assert_no_secret(bucket: Bucket, *texts: str, files: tuple[Path, ...] = ()) -> None:
    secret, key = bucket.secret_key, bucket.access_key
    for text in texts:
        assert secret not in text and key not in text
    stored = stored_bytes(bucket)
    assert secret.encode() not in stored and key.encode() not in stored
    for path in files:
        data = path.read_bytes()
        assert secret.encode() not in data and key.encode() not in data, path


# -- the batch end to end, and a deleted object --------------------------------------------------

@pytest.mark.parametrize("sink", SINKS)
def test_a_batch_into_a_table_on_s3_then_a_deleted_data_file_fails_the_audit(
    sink: str, spark: Any, s3: Bucket, ledger: Ledger, ledger_url: str, client: StreamClient,
    rabbitmq_url: str, stream_name: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two batches, two table commits on S3, read back with pyiceberg / deltalake; the audit (ledger,
    table, broker) is clean from ``run_batch`` and from ``streamledger ledger audit``; no secret
    anywhere; then one data file of a committed range deleted from the bucket: the audit exits 1."""
    caplog.set_level(logging.DEBUG, logger="streamledger")  # every line the batch logs is searched
    s = stream_name(f"s3{sink}")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 90, batch_size=30)
    config = cfg(s3, rabbitmq_url, s, sink)
    runner = CountingRunner(spark)
    first = run_batch(config, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
    publish(rabbitmq_url, s, 30, start=90)
    run_batch(config, run=RunId("dag", "r2", "t"), ledger=ledger, broker=client, runner=runner)
    assert [(p.status, p.records) for p in first.partitions] == [("committed", 90)]
    # (the second batch's records follow the tracking chunk the first StoreOffset wrote)
    rows = table_rows(sink, s3, ledger)
    assert rows.num_rows == 120 and rows.column("body").to_pylist() == [body(s, i) for i in range(120)]
    assert len(commits_of_pipeline(sink, s3, ledger)) == 2
    assert not [k for k in s3.keys("out/_staging") if not k.endswith("/")], "staging left behind"
    report = audit(ledger, PIPE, broker=client, deep=True)
    assert report.clean, report.to_text()
    assert cli(["ledger", "audit", "--db", ledger_url, "--pipeline", PIPE, "--deep"]) == 0

    from streamledger.operators.lineage import batch_lineage

    assert first.table is not None and first.table["format"] == sink
    lineage = batch_lineage(first, table=first.table, catalog=first.catalog)  # as the operator does
    out, err = capfd.readouterr()
    assert_no_secret(s3, out, err, caplog.text, repr(lineage), command_lines(os.getpid()),
                     repr(spark.sparkContext.getConf().getAll()), files=(tmp_path / "ledger.sqlite",))

    victim = table_data_files(sink, s3, ledger)[0]
    s3.filesystem().delete_file(victim.split("://", 1)[1])  # type: ignore[attr-defined]
    assert cli(["ledger", "audit", "--db", ledger_url, "--pipeline", PIPE]) == 1
    out, err = capfd.readouterr()
    assert victim.rsplit("/", 1)[1] in out, out
    assert_no_secret(s3, out, err, caplog.text)


# -- the crash table's rows ------------------------------------------------------------------------

def crash_after(step: str) -> Any:
    def hook(name: str, _batch: Any) -> None:
        if name == step:
            raise Killed(f"killed after {step}")
    return hook


# The suite runs each crash row once, the sinks taking turns; `make test-matrix` runs every cell.
IN_SUITE = {("iceberg", "read"), ("delta", "committed"), ("iceberg", "mid-publish"),
            ("delta", "table_committed"), ("iceberg", "published")}


@pytest.mark.parametrize(("sink", "step"), [
    pytest.param(sink, step, marks=() if (sink, step) in IN_SUITE else pytest.mark.matrix)
    for sink in SINKS for step in ("read", "committed", "mid-publish", "table_committed", "published")
])
def test_crash_rows_into_a_table_on_s3(
    sink: str, step: str, spark: Any, s3: Bucket, ledger: Ledger, client: StreamClient, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    """Killed after the write (``read``: files in staging, nothing committed), after the ledger
    commit, mid-publish (one data file copied to the range's prefix, no table commit), after the
    table commit (the ledger does not know it yet) and before the offset is stored (``published``):
    the retry reads nothing again unless nothing was committed, the table holds every record once in
    one commit, the audit is clean."""
    caplog.set_level(logging.DEBUG, logger="streamledger")  # every line the batch logs is searched
    s = stream_name(f"s3crash{sink}")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 90, batch_size=30)
    config = cfg(s3, rabbitmq_url, s, sink)
    runner = CountingRunner(spark)
    copies: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        hook = None
        if step == "mid-publish":
            real_copy = fs.ArrowFS.copy_file

            def dying_copy(self: fs.ArrowFS, src: str, dst: str) -> None:
                if copies:
                    raise Killed(f"killed while copying {src}")
                real_copy(self, src, dst)
                copies.append(dst)

            patch.setattr(fs.ArrowFS, "copy_file", dying_copy)
        else:
            hook = crash_after(step)
        with pytest.raises(Killed):
            run_batch(config, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner,
                      on_step=hook)
    (r,) = ledger.ranges(PIPE)
    assert r.status == (RangeStatus.CLAIMED if step == "read" else RangeStatus.COMMITTED)
    assert (r.published_at is not None) == (step == "published")
    in_table = step in ("table_committed", "published")
    assert len(commits_of_pipeline(sink, s3, ledger) if in_table else []) == int(in_table)
    if step == "mid-publish":
        assert len(copies) == 1
    between = audit(ledger, PIPE)  # a commit in the table always names a range the ledger committed
    assert not [v for v in between.violations if "did not commit" in v.detail], between.to_text()
    assert client.query_offset(s, PIPE) is None

    run_batch(config, run=RunId("dag", "r1", "t", try_number=2), ledger=ledger, broker=client, runner=runner)
    assert runner.calls == (2 if step == "read" else 1), "the retry read the stream again"
    assert_exactly_once(sink, s3, ledger, s, 90)
    assert len(commits_of_pipeline(sink, s3, ledger)) == 1  # a repeated commit was a no-op
    assert client.query_offset(s, PIPE) == 89
    report = audit(ledger, PIPE, broker=client, deep=True)
    assert report.clean, report.to_text()
    out, err = capfd.readouterr()
    assert_no_secret(s3, out, err, caplog.text, files=(tmp_path / "ledger.sqlite",))


# -- a real SIGKILL per sink -----------------------------------------------------------------------

@pytest.mark.timeout(600)  # alone, the Spark Connect server's start; in the suite it is shared
@pytest.mark.parametrize("sink", ["iceberg", pytest.param("delta", marks=pytest.mark.matrix)])
def test_a_batch_process_sigkilled_after_its_table_commit_on_s3_then_a_retry_lands_once(
    sink: str, s3: Bucket, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, spark_connect: str,
) -> None:
    """A ``streamledger batch run`` process into a table on S3, parked right after the table commit
    (the ledger has not recorded it) and SIGKILLed; its credentials came from its environment only
    (not on its command line); the retry of the same ``--run-id`` in a new process finds the commit
    and finishes: every record once, one commit, the audit clean, no secret in any output."""
    s = stream_name(f"s3kill{sink}")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 60, batch_size=30)
    argv = ["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", PIPE, "--ledger", ledger.url,
            "--output-root", s3.uri("out"), "--sink", sink, "--remote", spark_connect,
            "--run-id", "nightly-1"]
    marker, log = tmp_path / "parked", tmp_path / "child.log"
    env = {k: v for k, v in spark_env(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)])).items()
           if not k.startswith("PYSPARK_GATEWAY")}
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.batch.park", "table_committed", str(marker), "--",
             *argv],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(marker, child, log)
            lines = command_lines(child.pid)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    (r,) = ledger.ranges(PIPE)
    assert r.status == RangeStatus.COMMITTED and r.published_at is None and r.sink_commit is None
    assert len(commits_of_pipeline(sink, s3, ledger)) == 1
    assert client.query_offset(s, PIPE) is None

    done = subprocess.run([sys.executable, "-m", "streamledger.cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_exactly_once(sink, s3, ledger, s, 60)
    assert len(commits_of_pipeline(sink, s3, ledger)) == 1
    assert client.query_offset(s, PIPE) == 59
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
    assert_no_secret(s3, lines, log.read_text(), done.stdout, done.stderr,
                     files=(tmp_path / "ledger.sqlite",))


# -- bad input: refused in one line before anything is claimed ----------------------------------------

@pytest.mark.parametrize("sink", ["directory", *SINKS])
@pytest.mark.parametrize("fault", ["unreachable", "no-credentials", "half-credentials", "no-bucket",
                                   "unknown-scheme"])
def test_an_output_on_a_store_that_cannot_be_used_is_refused_before_any_claim(
    sink: str, fault: str, s3: Bucket, ledger: Ledger, client: StreamClient, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unreachable store, no credentials at all (no keys, no profile or shared files, no instance
    role), a key id without its secret, a bucket that does not exist, a scheme no file system here
    knows: one line naming the location and the reason, the job never runs, the ledger claims
    nothing, and no secret is in the line."""
    s = stream_name("s3bad")
    create_stream(rabbitmq_url, s, 5)
    root, reason = s3.uri("out"), ""
    if fault == "unreachable":
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        reason = "cannot be reached"
    elif fault == "no-credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws
        reason = "no credentials"
    elif fault == "half-credentials":
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        reason = "AWS_ACCESS_KEY_ID is set but not AWS_SECRET_ACCESS_KEY"
    elif fault == "no-bucket":
        root, reason = "s3://sl-no-such-bucket-32t/out", "bucket 'sl-no-such-bucket-32t' does not exist"
    else:
        root, reason = "nosuchscheme://somewhere/out", "no file system"
    config = BatchConfig(pipeline=PIPE, url=rabbitmq_url, output_root=root, stream=s, sink=sink)  # type: ignore[arg-type]
    with pytest.raises((fs.LocationError, BatchError)) as caught:
        run_batch(config, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client,
                  runner=lambda **kw: pytest.fail("the job ran"))
    said = str(caught.value)
    assert "\n" not in said and root in said and reason in said, said
    assert s3.secret_key not in said
    assert ledger.ranges(PIPE) == []


def test_a_delta_table_in_a_bucket_that_does_not_exist_is_refused_before_any_claim(
    s3: Bucket, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any,
) -> None:
    """The Delta table's own location (``table=``, another bucket than the output root's) is checked
    as the output root is: one line naming the table and the reason, before any claim."""
    s = stream_name("s3badtbl")
    create_stream(rabbitmq_url, s, 5)
    table = "s3://sl-no-such-bucket-32d/events"
    config = BatchConfig(pipeline=PIPE, url=rabbitmq_url, output_root=s3.uri("out"), stream=s, sink="delta",
                         table=table)
    with pytest.raises(BatchError) as caught:
        run_batch(config, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client,
                  runner=lambda **kw: pytest.fail("the job ran"))
    said = str(caught.value)
    assert "\n" not in said and said.startswith(f"delta table {table}: ") and "does not exist" in said, said
    assert ledger.ranges(PIPE) == []


# -- Delta's commits are conditional puts ------------------------------------------------------------

def test_the_delta_sinks_commits_on_s3_are_conditional_puts_the_store_enforces(
    spark: Any, s3: Bucket, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Every Delta log entry the batch writes is a PUT with ``If-None-Match: *`` (delta-rs's own
    commit protocol on S3, with nothing but the environment: no ``AWS_S3_ALLOW_UNSAFE_RENAME``, no
    locking provider), and the S3 server refuses a second such PUT of an existing entry (412), so a
    concurrent commit of the same version fails instead of overwriting."""
    import json

    seen = tmp_path / "requests.jsonl"
    proxy = subprocess.Popen([sys.executable, "-m", "tests.support.s3_proxy", s3.endpoint, str(seen)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout is not None
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.stdout.readline().strip())
        s = stream_name("s3cond")
        create_stream(rabbitmq_url, s, 0)
        publish(rabbitmq_url, s, 30)
        run_batch(cfg(s3, rabbitmq_url, s, "delta"), run=RunId("dag", "r1", "t"), ledger=ledger,
                  broker=client, runner=CountingRunner(spark))
    finally:
        proxy.kill()
        proxy.wait(timeout=30)
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    requests = [json.loads(line) for line in seen.read_text().splitlines()]
    entries = [(r["path"], r["if_none_match"]) for r in requests if r["method"] == "PUT"
               and "/_delta_log/" in r["path"] and r["path"].split("?")[0].endswith(".json")]
    assert len(entries) >= 2, requests  # the table's creation and the batch's commit
    assert all(cond == "*" for _path, cond in entries), entries
    assert_exactly_once("delta", s3, ledger, s, 30)

    import boto3
    from botocore.exceptions import ClientError

    store = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1",
                         aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key)
    first = entries[0][0].split("?")[0].split("/", 2)[2]  # /<bucket>/<key>
    with pytest.raises(ClientError) as refused:
        store.put_object(Bucket=s3.name, Key=first, Body=b"{}", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
