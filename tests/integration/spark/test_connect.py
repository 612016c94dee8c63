"""Spark Connect as the warm data plane: the server CLI, the job over Connect, the Connect runner."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger.batch import BatchConfig, RunId, run_batch
from streamledger.batch.spec import SpecError
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.spark.job import MANIFEST, run_job
from streamledger.spark.runners import SparkConnectRunner
from tests.integration.spark.helpers import body, create_stream, publish
from tests.support.spark import spark_env

pytestmark = [
    pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.timeout(600),
    pytest.mark.usefixtures("leave_connect_mode"),
]


def cli(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamledger.cli", "spark-server", *args],
        env=spark_env(STREAMLEDGER_HOME=str(home)), capture_output=True, text=True, timeout=timeout,
        check=False,
    )


def test_spark_server_cli_start_is_idempotent_and_stop_stops_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert cli("status", home=home).returncode == 3
    first = cli("start", home=home)
    try:
        assert first.returncode == 0, first.stderr[-3000:]
        url = first.stdout.strip().splitlines()[-1]
        assert url.startswith("sc://127.0.0.1:")
        state = json.loads((home / "spark-connect" / "server.json").read_text())
        assert state["url"] == url and Path(state["log"]).exists()
        again = cli("start", home=home)
        assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == url
        assert "running" in again.stdout
        status = cli("status", home=home)
        assert status.returncode == 0 and status.stdout.strip().splitlines()[-1] == url
        from pyspark.sql import SparkSession

        session = SparkSession.builder.remote(url).create()
        try:
            assert session.range(5).count() == 5
        finally:
            session.stop()
    finally:
        stopped = cli("stop", home=home)
    assert stopped.returncode == 0 and f"stopped pid {state['pid']}" in stopped.stdout
    assert not Path(f"/proc/{state['pid']}").exists() or "Z" in Path(f"/proc/{state['pid']}/stat").read_text()
    assert cli("status", home=home).returncode == 3


def test_run_job_over_connect_writes_each_stream_and_a_manifest(
    spark_remote: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    a, b = stream_name("ca"), stream_name("cb")
    create_stream(rabbitmq_url, a, 500)
    create_stream(rabbitmq_url, b, 30)
    out = tmp_path / "connect"
    manifest = run_job(spark_remote, url=rabbitmq_url, ranges={a: (10, 410), b: (0, 30)}, output=str(out),
                       splits=2)
    assert json.loads((out / MANIFEST).read_text()) == manifest
    assert {s: e["records"] for s, e in manifest["streams"].items()} == {a: 400, b: 30}
    for s, lo, hi in ((a, 10, 410), (b, 0, 30)):
        table = pq.read_table(manifest["streams"][s]["path"], columns=["stream", "offset", "body"])
        assert sorted(table.column("offset").to_pylist()) == list(range(lo, hi))
        assert set(table.column("stream").to_pylist()) == {s}
        assert sorted(table.column("body").to_pylist()) == sorted(body(s, i) for i in range(lo, hi))


@pytest.mark.parametrize("how", ["--remote", "SPARK_REMOTE"])
def test_job_module_against_the_warm_server(
    how: str, spark_connect: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    s = stream_name("cm")
    create_stream(rabbitmq_url, s, 77)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "streamledger.spark.job", "--url", rabbitmq_url, "--stream", s,
            "--output", str(out)]
    env = spark_env()
    if how == "--remote":
        args += ["--remote", spark_connect]
    else:
        env["SPARK_REMOTE"] = spark_connect
    t0 = time.monotonic()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads(proc.stdout)
    assert manifest["streams"][s]["records"] == 77
    assert sorted(pq.read_table(out, columns=["offset"]).column("offset").to_pylist()) == list(range(77))
    assert "guest:guest" not in proc.stderr + proc.stdout
    print(f"job process over Connect ({how}): {took:.1f}s")



def test_the_job_process_over_connect_imports_only_what_it_runs(
    spark_connect: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """The whole job process (as ``python -m``) on the warm server: no ledger, orchestrator, table
    library or tenacity in its ``sys.modules`` at exit (pandas is there: pyspark's Connect client
    imports it unconditionally), and it still exits 0 with its manifest on stdout after its exit
    handlers ran (it skips only the interpreter's teardown)."""
    from tests.unit.spark.test_job_imports import NOT_FOR_THE_JOB

    s = stream_name("ci")
    create_stream(rabbitmq_url, s, 20)
    out, seen = tmp_path / "out", tmp_path / "modules.json"
    argv = ["streamledger.spark.job", "--remote", spark_connect, "--stream", s, "--output", str(out)]
    code = (
        "import atexit, json, runpy, sys\n"
        f"atexit.register(lambda: open({str(seen)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n"
        f"sys.argv = {argv!r}\n"
        "runpy.run_module('streamledger.spark.job', run_name='__main__', alter_sys=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=spark_env(STREAMLEDGER_RABBITMQ_URL=rabbitmq_url),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout)["streams"][s]["records"] == 20
    modules = set(json.loads(seen.read_text()))
    assert "pyspark.sql.connect.session" in modules  # the probe saw a Connect job
    assert [m for m in NOT_FOR_THE_JOB if m in modules] == []


def test_the_arrow_writer_job_asks_a_connect_server_one_action_and_no_analysis(
    spark_remote: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """Round trips of a job on Connect: the file summaries' schema and the task ids' columns are
    given, not asked (a DDL string and ``mapInArrow``'s input columns were an analysis each), and
    the parallelism is one conf request. Counted on pyspark's Connect client, whose methods these are."""
    s = stream_name("cr")
    create_stream(rabbitmq_url, s, 30)
    client = spark_remote.client
    calls: list[str] = []
    for name in ("_analyze", "config", "_execute_and_fetch", "_execute"):
        real = getattr(client, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            what = _name
            if _name == "config":
                op = args[0]
                what = f"config {op.WhichOneof('op_type')}"
                if "planCompression" in str(op):
                    what = "pyspark's own plan-compression lookup"  # once per client, cached
            elif _name == "_analyze":
                what = f"analyze {args[0] if args else kwargs.get('method')}"
            calls.append(what)
            return _real(*args, **kwargs)

        setattr(client, name, counted)
    manifest = run_job(spark_remote, url=rabbitmq_url, ranges={s: (0, 30)}, output=str(tmp_path / "o"),
                       writer="arrow")
    assert manifest["streams"][s]["records"] == 30
    ours = [c for c in calls if c != "pyspark's own plan-compression lookup"]
    assert ours == ["config get_all", "_execute_and_fetch"], calls

def test_run_batch_with_the_connect_runner_over_a_super_stream(
    spark_connect: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    sup = stream_name.super_stream("cb")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(sup, partitions=2)
        parts = client.partitions(sup)
    publish(rabbitmq_url, parts[0], 60)
    publish(rabbitmq_url, parts[1], 40)
    runner = SparkConnectRunner(spark_connect)
    cfg = BatchConfig(pipeline="p-connect", url=rabbitmq_url, output_root=str(tmp_path / "out"),
                      super_stream=sup)
    try:
        with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", create=True) as ledger, \
                StreamClient.connect(rabbitmq_url) as client:
            result = run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
            assert {p.stream: (p.status, p.records) for p in result.partitions} == {
                parts[0]: ("committed", 60), parts[1]: ("committed", 40)
            }
            committed = [r for r in ledger.ranges("p-connect") if r.status == RangeStatus.COMMITTED]
            assert sorted((r.source.stream, r.records) for r in committed) == [(parts[0], 60), (parts[1], 40)]
            for r in committed:
                assert r.output is not None
                offsets = pq.read_table(r.output, columns=["offset"]).column("offset").to_pylist()
                assert sorted(offsets) == list(range(r.records))
    finally:
        runner.close()


def test_a_transform_runs_per_range_over_connect_and_is_refused_before_the_claim_when_it_cannot(
    spark_connect: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """A super stream's two ranges each get the SQL over their own records (an aggregate per range)
    on the Connect server; SQL naming an unknown column is refused by the server's analysis before
    anything is claimed."""
    sup = stream_name.super_stream("ct")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(sup, partitions=2)
        parts = client.partitions(sup)
    publish(rabbitmq_url, parts[0], 30)
    publish(rabbitmq_url, parts[1], 20)
    runner = SparkConnectRunner(spark_connect)
    sql = "SELECT count(*) AS n, min(offset) AS low, max(offset) AS high FROM records"
    cfg = BatchConfig(pipeline="p-connect-t", url=rabbitmq_url, output_root=str(tmp_path / "out"),
                      super_stream=sup, sql=sql)
    try:
        with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", create=True) as ledger, \
                StreamClient.connect(rabbitmq_url) as client:
            bad = BatchConfig(pipeline="p-connect-bad", url=rabbitmq_url, output_root=str(tmp_path / "out"),
                              super_stream=sup, sql="SELECT no_such FROM records")
            with pytest.raises(SpecError, match="no_such"):
                run_batch(bad, run=RunId("dag", "r0", "t"), ledger=ledger, broker=client, runner=runner)
            assert ledger.ranges("p-connect-bad") == []
            run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
            committed = [r for r in ledger.ranges("p-connect-t") if r.status == RangeStatus.COMMITTED]
            got = {r.source.stream: pq.read_table(r.output).to_pylist() for r in committed if r.output}
            assert {s: [(row["n"], row["low"], row["high"]) for row in rows] for s, rows in got.items()} == {
                parts[0]: [(30, 0, 29)], parts[1]: [(20, 0, 19)]}
            assert all(r.rows_out == 1 for r in committed)
    finally:
        runner.close()


@pytest.mark.parametrize("after", [2.0, 0.0], ids=["job-running", "at-once"])
def test_connect_runner_cancel_interrupts_the_running_batch(
    spark_connect: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path, after: float
) -> None:
    """``after`` seconds after the batch took its tag: while the job runs, or at once, before (or
    between) the operations that carry it: on a busy machine the job's first operation can start
    seconds after the tag is set, and one ``interruptTag`` then interrupts nothing."""
    s = stream_name("cc")
    create_stream(rabbitmq_url, s, 20000)
    runner = SparkConnectRunner(spark_connect)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            # Many splits of a small range keep the job busy long enough to be interrupted.
            runner(url=rabbitmq_url, ranges={s: (0, 20000)}, output=str(tmp_path / "x"), fmt="json",
                   splits=400)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    try:
        thread.start()
        deadline = time.monotonic() + 120
        while runner._tag is None and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(after)
        runner.cancel()
        thread.join(120)
        assert not thread.is_alive()
        assert errors, "the job finished although it was cancelled"
        assert "interrupt" in str(errors[0]).lower() or "cancel" in str(errors[0]).lower(), errors[0]
        assert runner._tag is None
    finally:
        runner.close()


def test_run_batch_over_connect_into_a_file_uri_root_survives_a_crash_after_commit(
    spark_connect: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """Issue 11 item 6 over Connect: the server writes the data to a ``file://`` URI, the client
    reaches it through ``pyarrow.fs`` (no JVM here); killed after the commit, the retry publishes
    the recorded staging copy without a second job."""
    from streamledger import fs

    class Killed(BaseException):
        pass

    sup = stream_name.super_stream("fs11c")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(sup, partitions=2)
        parts = client.partitions(sup)
    publish(rabbitmq_url, parts[0], 45)  # the other partition stays empty: its directory still exists
    root = (tmp_path / "out").as_uri()

    class Counting(SparkConnectRunner):
        calls = 0

        def __call__(self, **kwargs: Any) -> Any:
            self.calls += 1
            return super().__call__(**kwargs)

    runner = Counting(spark_connect)

    def crash(step: str, batch: Any) -> None:
        if step == "committed":
            assert isinstance(batch.fs, fs.ArrowFS)
            raise Killed("killed after the commit")

    cfg = BatchConfig(pipeline="p-connect-uri", url=rabbitmq_url, output_root=root, super_stream=sup)
    try:
        with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", create=True) as ledger, \
                StreamClient.connect(rabbitmq_url) as client:
            with pytest.raises(Killed):
                run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner,
                          on_step=crash)
            (done,) = [r for r in ledger.ranges("p-connect-uri") if r.records]
            assert done.status == RangeStatus.COMMITTED and done.staging and done.staging.startswith(root)
            result = run_batch(cfg, run=RunId("dag", "r1", "t", try_number=2), ledger=ledger, broker=client,
                               runner=runner)
            assert runner.calls == 1, "the retry read the stream again"
            assert {p.stream: p.records for p in result.partitions} == {parts[0]: 45, parts[1]: 0}
            (done,) = [r for r in ledger.ranges("p-connect-uri") if r.records]
            assert done.output is not None and done.output.startswith(root + "/p-connect-uri/")
            local = Path(done.output.removeprefix("file://"))
            assert json.loads((local / MANIFEST).read_text())["range_id"] == done.id
            table = pq.read_table(str(local), columns=["body"])
            assert sorted(table.column("body").to_pylist()) == sorted(body(parts[0], i) for i in range(45))
            assert client.query_offset(parts[0], "p-connect-uri") == 44
    finally:
        runner.close()


def test_streaming_available_now_over_connect(
    spark_remote: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """Issue 23 over Spark Connect: the Python streaming source runs in the server's driver-side Python
    process; availableNow with maxOffsetsPerTrigger reads exactly the tail at start into a file sink,
    and the ledger records one range per micro-batch."""
    s = stream_name("cstream")
    create_stream(rabbitmq_url, s, 120)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    q = (spark_remote.readStream.format("rabbitmq_stream").option("url", rabbitmq_url).option("stream", s)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 50)
         .option("ledger", ledger_url).option("pipeline", "connect-stream")
         .option("ledgerOutput", str(tmp_path / "ranges")).load()
         .writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    assert q.awaitTermination(180)
    assert q.exception() is None
    sizes = [p.numInputRows for p in q.recentProgress if p.numInputRows]
    assert sizes == [50, 50, 20]
    rows = spark_remote.read.parquet(str(tmp_path / "out")).select("offset", "body").collect()
    assert sorted(r["offset"] for r in rows) == list(range(120))
    assert all(r["body"] == body(s, r["offset"]) for r in rows)
    with Ledger(ledger_url) as ledger:
        ranges = sorted(ledger.ranges("connect-stream"), key=lambda r: r.start)
        assert [(r.start, r.end, r.status, r.records) for r in ranges] == [
            (0, 50, RangeStatus.COMMITTED, 50), (50, 100, RangeStatus.COMMITTED, 50),
            (100, 120, RangeStatus.COMMITTED, 20)]
