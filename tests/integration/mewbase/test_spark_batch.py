"""The ``mewbase`` Spark format and a ledger-recorded batch from a mewbase channel (TEST DOUBLE server).

The emulator (tests/support/mewbase_emulator.py) listens on a real TCP port of 127.0.0.1 in this test
process, so Spark's Python workers (separate processes) and the job's subprocess reach it like a server.
Everything else is the product: ``run_batch`` with ``MewbaseLog`` as its broker and ``LocalSparkRunner``,
the ``mewbase`` data source, the SQLite ledger, Parquet, the audit (Python and CLI).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bson
import pyarrow.parquet as pq
import pytest

from streamledger.batch import BatchConfig, LocalSparkRunner, RunId, run_batch
from streamledger.ledger import Ledger
from streamledger.paths import broker_component
from streamledger.protocol.mewbase import MewbaseLog, OffsetOutOfRange
from streamledger.sources import UnsupportedSource
from streamledger.spark import job
from streamledger.spark.mewbase_source import ChannelSlice, MewbaseReadOptions, read_slice
from tests.support.mewbase_emulator import MewbaseServerEmulator
from tests.support.spark import spark_env

pytestmark = pytest.mark.spark
CLI_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def seed(emulator: MewbaseServerEmulator, channel: str, first: int, count: int) -> list[int]:
    """``count`` events ``{"n": i}``; positions are byte offsets (gaps), with one wide jump midway."""
    out = []
    for i in range(first, first + count):
        pos = None
        if i == first + count // 2:
            pos = emulator.positions(channel)[-1] + 10_000 if emulator.positions(channel) else 5_000
        out.append(emulator.append(channel, {"n": i, "pad": "x" * (i % 7)}, pos=pos))
    return out


def parquet_events(path: Path) -> dict[int, int]:
    """``{position: n}`` of every event written under ``path`` (from the BSON bodies)."""
    table = pq.read_table(path, columns=["stream", "offset", "body"])
    return {o: bson.decode(b)["n"] for o, b in zip(table.column("offset").to_pylist(),
                                                    table.column("body").to_pylist(), strict=True)}


def test_format_reads_exact_ranges_over_gaps(spark: Any, emulator: MewbaseServerEmulator) -> None:
    positions = seed(emulator, "orders", 0, 40)
    seed(emulator, "audit", 100, 5)
    assert all(b - a > 1 for a, b in itertools.pairwise(positions))  # gaps everywhere
    start, end = positions[5] + 1, positions[30]  # both ends inside gaps / on an event
    df = (
        spark.read.format("mewbase").option("url", emulator.url())
        .option("ranges", json.dumps({"orders": [start, end]}))
        .option("splitsPerStream", 3).option("batchRows", 7).load()
    )
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    assert sorted(r["offset"] for r in rows) == positions[6:30]
    for r in rows:
        event = bson.decode(r["body"])
        assert r["stream"] == "orders" and json.loads(r["event_json"]) == event
        assert r["timestamp"] is not None
    assert sorted(bson.decode(r["body"])["n"] for r in rows) == list(range(6, 30))

    # channel list, default bounds (earliest .. latest), raw decode: every event once, event_json null
    both = (
        spark.read.format("mewbase").option("url", emulator.url()).option("channel", "orders,audit")
        .option("decode", "raw").option("maxRecordsPerPartition", 500).load()
        .select("stream", "offset", "event_json").collect()
    )
    assert sorted(r["offset"] for r in both if r["stream"] == "orders") == positions
    assert sorted(r["offset"] for r in both if r["stream"] == "audit") == emulator.positions("audit")
    assert {r["event_json"] for r in both} == {None}

    # a timestamp bound: the first event persisted at or after it
    stamps = {pos: ts for pos, ts, _ in emulator.events("orders")}
    since = stamps[positions[17]]
    first = min(p for p in positions if stamps[p] >= since)
    timed = (
        spark.read.format("mewbase").option("url", emulator.url()).option("channel", "orders")
        .option("startingOffsets", json.dumps({"timestamp": since})).load().select("offset").collect()
    )
    assert sorted(r["offset"] for r in timed) == [p for p in positions if p >= first]

    # a range whose end the channel does not hold is refused at planning, naming channel and offsets
    tail = positions[-1] + 1
    past = rf"'orders': end offset {tail + 5} is past the committed tail {tail}"
    with pytest.raises(Exception, match=past):
        spark.read.format("mewbase").option("url", emulator.url()).option(
            "ranges", json.dumps({"orders": [0, tail + 5]})).load().collect()


def test_read_past_what_the_server_holds_fails_after_the_timeout(emulator: MewbaseServerEmulator) -> None:
    positions = seed(emulator, "orders", 0, 3)
    options = MewbaseReadOptions.parse({"url": emulator.url(), "channel": "orders", "timeout": "0.5"})
    began = time.monotonic()
    with pytest.raises(OffsetOutOfRange, match="'orders': end 100000 lies beyond what the server holds"):
        list(read_slice(options, ChannelSlice("orders", positions[1], 100_000)))
    assert 0.4 < time.monotonic() - began < 5


def test_batch_bytes_cuts_the_batches_at_the_servers_batches(emulator: MewbaseServerEmulator) -> None:
    """Option ``batchBytes`` (what the job's Arrow writer sets): a batch ends once it holds that many
    bytes of events, at the end of one of the server's batches (2,000 events at most); the same events."""
    positions = [emulator.append("sized", {"n": i}) for i in range(4_500)]
    whole = MewbaseReadOptions.parse({"url": emulator.url(), "channel": "sized"})
    cut = MewbaseReadOptions.parse({"url": emulator.url(), "channel": "sized", "batchBytes": "1000"})
    part = ChannelSlice("sized", positions[0], positions[-1] + 1)
    one = list(read_slice(whole, part))
    pieces = list(read_slice(cut, part))
    assert [b.num_rows for b in one] == [4_500]
    assert len(pieces) == 3 and all(b.num_rows <= 2_000 for b in pieces)
    assert [o for b in pieces for o in b.column("offset").to_pylist()] == positions


def test_batch_into_ledger_and_parquet_idempotent_and_audited(
    spark: Any, emulator: MewbaseServerEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMLEDGER_HOME", str(tmp_path))
    positions = seed(emulator, "orders", 0, 60)
    db = f"sqlite:///{tmp_path}/ledger.sqlite"
    ledger = Ledger(db, create=True)
    cfg = BatchConfig(pipeline="billing", url=emulator.url(), output_root=str(tmp_path / "out"),
                      stream="orders", initial_position="first", splits=2)
    runner = LocalSparkRunner()
    with MewbaseLog.connect(emulator.url(), timeout=5) as log:
        first = run_batch(cfg, run=RunId("dag", "run-1", "task"), ledger=ledger, broker=log, runner=runner)
        tail = positions[-1] + 1
        assert first.broker == f"mewbase://127.0.0.1:{emulator.port}"
        assert (first.records, first.to_dict()["ranges"]) == (60, {"orders": [0, tail]})
        part = first.partitions[0]
        assert (part.first_offset, part.last_offset) == (positions[0], positions[-1])
        assert part.status == "committed"
        assert parquet_events(Path(part.output)) == {p: i for i, p in enumerate(positions)}
        # the stored position is the durable subscription's acknowledged one: the last processed event
        assert emulator.durable["orders/billing"]["lastAcked"] == positions[-1]
        assert log.query_offset("orders", "billing") == positions[-1]

        # the same run again (a retry): nothing new is claimed or read, the published range stays
        again = run_batch(cfg, run=RunId("dag", "run-1", "task"), ledger=ledger, broker=log, runner=runner)
        assert again.to_dict()["ranges"] == {"orders": [0, tail]}
        assert again.partitions[0].output == part.output
        assert len(ledger.ranges("billing")) == 1

        # new events: the next run reads exactly the new tail (gaps included)
        more = seed(emulator, "orders", 60, 9)
        second = run_batch(cfg, run=RunId("dag", "run-2", "task"), ledger=ledger, broker=log, runner=runner)
        assert second.to_dict()["ranges"] == {"orders": [tail, more[-1] + 1]} and second.records == 9
        assert parquet_events(Path(second.partitions[0].output)) == {p: 60 + i for i, p in enumerate(more)}
        assert emulator.durable["orders/billing"]["lastAcked"] == more[-1]

        # nothing new: an empty range, no job, nothing stored
        acks = len(emulator.frames_of("ACKEV"))
        third = run_batch(cfg, run=RunId("dag", "run-3", "task"), ledger=ledger, broker=log, runner=runner)
        assert third.records == 0 and len(emulator.frames_of("ACKEV")) == acks

        report = ledger.audit("billing", broker=log)
        assert report.clean, report.to_text()
    assert parquet_events(tmp_path / "out" / "billing" / broker_component(first.broker) / "orders") == {
        p: i for i, p in enumerate(positions + more)
    }
    assert {r.source.broker for r in ledger.ranges("billing")} == {first.broker}

    # the audit CLI, unchanged, against the mewbase server
    proc = subprocess.run(
        [sys.executable, "-m", "streamledger.cli", "ledger", "audit", "--db", db, "--pipeline", "billing",
         "--broker-url", emulator.url(), "--json"],
        capture_output=True, text=True, timeout=120, env=CLI_ENV,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["clean"] is True

    # the broker behind the ledger is caught: the audit fails (exit 1) naming the channel
    with MewbaseLog.connect(emulator.url(), timeout=5) as log:
        log.store_offset_verified("orders", "billing", positions[3])
    proc = subprocess.run(
        [sys.executable, "-m", "streamledger.cli", "ledger", "audit", "--db", db, "--pipeline", "billing",
         "--broker-url", emulator.url()],
        capture_output=True, text=True, timeout=120, env=CLI_ENV,
    )
    assert proc.returncode == 1 and "orders" in proc.stdout, proc.stdout + proc.stderr


def test_job_module_reads_a_channel(emulator: MewbaseServerEmulator, tmp_path: Path) -> None:
    positions = seed(emulator, "orders", 0, 25)
    url = emulator.url()
    # planning helpers, without Spark
    assert job.resolve_ranges(url, streams=["orders"], super_stream=None, start="earliest", end="latest") == {
        "orders": (positions[0], positions[-1] + 1)
    }
    with pytest.raises(UnsupportedSource, match="--super-stream is only available for rabbitmq sources"):
        job.resolve_ranges(url, streams=[], super_stream="orders", start="earliest", end="latest")
    assert job.main(["--url", url, "--super-stream", "orders", "--output", str(tmp_path / "x")]) == 2

    out = tmp_path / "job"
    ranges = {"orders": [positions[2], positions[20]]}
    proc = subprocess.run(
        [sys.executable, "-m", "streamledger.spark.job", "--url", url, "--ranges", json.dumps(ranges),
         "--output", str(out), "--splits", "2", "--quick-start"],
        capture_output=True, text=True, timeout=400,
        env=spark_env(PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads(proc.stdout)
    assert manifest["decode"] == "bson" and manifest["format"] == "parquet"
    entry = manifest["streams"]["orders"]
    assert (entry["start"], entry["end"], entry["records"]) == (positions[2], positions[20], 18)
    assert (entry["first_offset"], entry["last_offset"]) == (positions[2], positions[19])
    assert parquet_events(out) == {p: i for i, p in enumerate(positions) if 2 <= i < 20}
    assert json.loads((out / job.MANIFEST).read_text()) == manifest


def test_run_job_in_every_format(spark: Any, emulator: MewbaseServerEmulator, tmp_path: Path) -> None:
    """The job's verification reads a mewbase output back in each format (log-neutral columns)."""
    positions = seed(emulator, "orders", 0, 12)
    seed(emulator, "audit", 0, 3)
    ranges = {"orders": (positions[1], positions[-1] + 1), "audit": (0, 0)}
    for fmt in job.FORMATS:
        manifest = job.run_job(spark, url=emulator.url(), ranges=ranges, output=str(tmp_path / fmt), fmt=fmt,
                               decode="raw")
        entry = manifest["streams"]["orders"]
        assert (entry["records"], entry["first_offset"], entry["last_offset"]) == (11, positions[1],
                                                                                   positions[-1]), fmt
        assert manifest["streams"]["audit"]["records"] == 0 and manifest["decode"] == "raw"
    with pytest.raises(Exception, match="decode must be bson or raw for a mewbase source"):
        job.run_job(spark, url=emulator.url(), ranges=ranges, output=str(tmp_path / "x"), decode="amqp")


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_a_mewbase_pipeline_with_a_table_sink_takes_its_second_batch(
    sink: str, spark: Any, emulator: MewbaseServerEmulator, tmp_path: Path,
) -> None:
    """Issue 30 defect 7 / issue 31: the table's schema is checked against the schema of the files the
    pipeline's own source writes (mewbase: ``stream, offset, timestamp, body, event_json``), not
    RabbitMQ's; so the second batch into the table the first one created is not refused."""
    from streamledger.batch.proof import audit

    seed(emulator, "orders", 0, 20)
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.sqlite", create=True)
    cfg = BatchConfig(pipeline="billing", url=emulator.url(), output_root=str(tmp_path / "out"),
                      stream="orders", initial_position="first", sink=sink)
    runner = LocalSparkRunner()
    runner._spark = spark
    with MewbaseLog.connect(emulator.url(), timeout=5) as log:
        first = run_batch(cfg, run=RunId("dag", "run-1", "task"), ledger=ledger, broker=log, runner=runner)
        seed(emulator, "orders", 20, 5)
        second = run_batch(cfg, run=RunId("dag", "run-2", "task"), ledger=ledger, broker=log, runner=runner)
    assert (first.records, second.records) == (20, 5)
    assert all(r.sink_commit is not None for r in ledger.ranges("billing") if r.records)
    report = audit(ledger, "billing")
    assert report.clean, report.to_text()
