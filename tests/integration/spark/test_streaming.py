"""``spark.readStream.format("rabbitmq_stream")`` on local[2] against the real RabbitMQ 4.3 broker.

Every test reads the file sink back through Spark (which honours the sink's ``_spark_metadata`` log)
and compares the offsets with what was published: each record exactly once, nothing past the tail
the query was bounded by. The ledger tests compare the ledger's ranges with Spark's own progress
reports (one range per stream per micro-batch) and run the whole proof (``batch.proof.audit``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.spark.streaming import (
    RabbitMQStreamMicroBatchReader,
    SourceOffset,
    StreamingOptions,
)
from tests.integration.spark.helpers import body, create_stream, publish
from tests.support.spark import spark_env

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]


def start_query(spark: Any, url: str, root: Path, *, available_now: bool = True, **options: Any) -> Any:
    reader = spark.readStream.format("rabbitmq_stream").option("url", url)
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (reader.load().writeStream.format("parquet").option("path", str(root / "out"))
              .option("checkpointLocation", str(root / "checkpoint")))
    writer = (writer.trigger(availableNow=True) if available_now
              else writer.trigger(processingTime="0 seconds"))
    return writer.start()


def sink_offsets(spark: Any, root: Path) -> dict[str, list[int]]:
    rows = spark.read.parquet(str(root / "out")).select("stream", "offset", "body").collect()
    out: dict[str, list[int]] = {}
    for r in rows:
        assert r["body"] == body(r["stream"], r["offset"])  # fresh streams: offset i holds record i
        out.setdefault(r["stream"], []).append(r["offset"])
    return {s: sorted(v) for s, v in out.items()}


def batches(query: Any) -> list[tuple[SourceOffset, SourceOffset, int]]:
    """(start, end, rows) of every micro-batch that moved the source, from Spark's progress reports."""
    out = []
    for p in query.recentProgress:
        src = p.sources[0]
        if src.startOffset == src.endOffset:
            continue
        begun = json.loads(src.startOffset) if src.startOffset else None  # batch 0: the "from" of its end
        start = SourceOffset("", -1, {}) if begun is None else SourceOffset.from_json(begun)
        end = SourceOffset.from_json(json.loads(src.endOffset))
        out.append((start, end, int(src.numInputRows)))
    return out


def test_available_now_stops_at_the_tail_fixed_at_start(rabbitmq_url: str, stream_name: Any) -> None:
    """The reader itself (no Spark): records published after prepareForTriggerAvailableNow are never
    admitted, and maxOffsetsPerTrigger caps what one trigger admits."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    s = stream_name("avnow")
    create_stream(rabbitmq_url, s, 120)
    reader = RabbitMQStreamMicroBatchReader(StreamingOptions.parse(
        {"url": rabbitmq_url, "stream": s, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "50"}))
    try:
        initial = reader.initialOffset()
        assert initial["offsets"] == {s: 0} and initial["batch"] == -1
        reader.prepareForTriggerAvailableNow()
        publish(rabbitmq_url, s, 80, start=120)
        first = reader.latestOffset(initial, reader.getDefaultReadLimit())
        assert reader.getDefaultReadLimit() == ReadMaxRows(50)
        assert first["offsets"] == {s: 50} and first["from"] == {s: 0} and first["batch"] == 0
        everything = reader.latestOffset(first, ReadAllAvailable())
        assert everything["offsets"] == {s: 120}  # not 200: the tail when the trigger started
        assert reader.latestOffset(everything, ReadAllAvailable()) is everything  # no new batch
        parts = reader.partitions(first, everything)
        assert [(p.stream, p.start, p.end) for p in parts] == [(s, 50, 120)]
    finally:
        reader.stop()


def test_own_offset_store_is_no_new_data(rabbitmq_url: str, stream_name: Any, tmp_path: Path,
                                         ledger: Ledger) -> None:
    """The reader itself: after a batch is recorded, the broker offset it stores takes an offset of the
    stream; the next trigger must not make a micro-batch (and an empty ledger range) of it alone."""
    s = stream_name("own")
    create_stream(rabbitmq_url, s, 30)
    reader = RabbitMQStreamMicroBatchReader(StreamingOptions.parse(
        {"url": rabbitmq_url, "stream": s, "startingOffsets": "earliest", "ledger": ledger.url,
         "pipeline": "own", "ledgerOutput": str(tmp_path / "ranges")}))
    try:
        initial = reader.initialOffset()
        end = reader.latestOffset(initial, reader.getDefaultReadLimit())
        assert end["offsets"] == {s: 30}
        reader.partitions(initial, end)  # claims [0, 30)
        assert reader.latestOffset(end, reader.getDefaultReadLimit()) is end  # settles, stores 29
        with StreamClient.connect(rabbitmq_url) as client:
            assert client.query_offset(s, "own") == 29 and client.committed_tail(s) == 31
        assert reader.latestOffset(end, reader.getDefaultReadLimit()) is end  # our entry is no data
        publish(rabbitmq_url, s, 1, start=30)
        assert reader.latestOffset(end, reader.getDefaultReadLimit())["offsets"] == {s: 32}
        assert [(r.start, r.end, r.status, r.records) for r in ledger.ranges("own")] == [
            (0, 30, RangeStatus.COMMITTED, 30)]
    finally:
        reader.stop()


def test_bounded_micro_batches_recorded_in_ledger(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, ledger: Ledger
) -> None:
    """availableNow over a super stream with maxOffsetsPerTrigger while a publisher keeps writing: the
    query ends, every batch is within the cap, the sink holds exactly the records up to the tail fixed
    at start, and the ledger's ranges are the micro-batches, committed, audited clean."""
    sup = stream_name.super_stream("orders")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(sup, partitions=2)
        parts = client.partitions(sup)
    for p, n in zip(parts, (150, 90), strict=True):
        publish(rabbitmq_url, p, n)
    stop = threading.Event()
    published = [0]

    def keep_publishing() -> None:
        while not stop.is_set():
            publish(rabbitmq_url, parts[0], 20, start=150 + published[0])
            published[0] += 20
            time.sleep(0.05)

    q = start_query(spark, rabbitmq_url, tmp_path, superStream=sup, startingOffsets="earliest",
                    maxOffsetsPerTrigger=80, ledger=ledger.url, pipeline="orders-stream",
                    ledgerOutput=str(tmp_path / "ranges"))
    # The tails were fixed when the query started; publish from its first batch on (>= 3 batches).
    deadline = time.monotonic() + 90
    while not q.recentProgress and q.isActive and time.monotonic() < deadline:
        time.sleep(0.1)
    writer = threading.Thread(target=keep_publishing, daemon=True)
    writer.start()
    try:
        assert q.awaitTermination(120), "an availableNow query must end even while records keep arriving"
    finally:
        stop.set()
        writer.join()
    assert q.exception() is None
    done = batches(q)
    assert len(done) >= 3 and all(rows <= 80 for _, _, rows in done), [r for _, _, r in done]
    final = done[-1][1].offsets
    assert final == {parts[0]: 150, parts[1]: 90}
    assert published[0] > 0  # records kept arriving while the query ran
    got = sink_offsets(spark, tmp_path)
    assert got == {p: list(range(final[p])) for p in parts if final[p]}

    ranges = [r for r in ledger.ranges("orders-stream") if r.status == RangeStatus.COMMITTED]
    assert {r.run.dag_id for r in ranges} == {f"spark-streaming:{done[0][1].query}"}
    expected = {
        (f"batch-{end.batch}", s, end.start_of(s, start), end.offsets[s])
        for start, end, _ in done for s in end.offsets if end.start_of(s, start) < end.offsets[s]
    }
    assert {(r.run.run_id, r.source.stream, r.start, r.end) for r in ranges} == expected
    assert sum(r.records for r in ranges) == sum(rows for _, _, rows in done) == sum(map(len, got.values()))
    with StreamClient.connect(rabbitmq_url) as client:
        report = audit(ledger, "orders-stream", broker=client)
        assert report.clean, report.to_text()
        assert client.query_offset(parts[1], "orders-stream") == 89


#: The driver the kill test SIGKILLs: its own local Spark (JVM and Python workers in its process
#: group), a query that keeps triggering until it is killed.
DRIVER = """
import json, sys
from streamledger.spark.session import build_session
root, url, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spark = build_session(master="local[1]", quick_start=True,
                      conf={"spark.ui.showConsoleProgress": "false",
                            "spark.python.authenticate.socketTimeout": "120s"})
reader = spark.readStream.format("rabbitmq_stream").option("url", url)
for key, value in opts.items():
    reader = reader.option(key, value)
(reader.load().writeStream.format("parquet").option("path", root + "/out")
 .option("checkpointLocation", root + "/checkpoint").trigger(processingTime="0 seconds").start()
 .awaitTermination())
"""


def log_ids(folder: Path) -> list[int]:
    return sorted(int(f.name) for f in folder.iterdir() if f.name.isdigit()) if folder.exists() else []


def test_driver_killed_mid_batch_restarts_from_checkpoint_and_writes_each_record_once(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, ledger: Ledger
) -> None:
    """The driver process (Python, JVM and workers: its whole process group) is SIGKILLed while a
    micro-batch is planned and claimed in the ledger but not committed; the query restarted from its
    checkpoint replays that batch with the same offsets: the file sink holds every record once, the
    ledger's ranges neither skip nor repeat, and the killed batch's open claim is the one the replay
    commits."""
    s = stream_name("restart")
    create_stream(rabbitmq_url, s, 200)
    opts = dict(stream=s, startingOffsets="earliest", maxOffsetsPerTrigger="40", ledger=ledger.url,
                pipeline="restart", ledgerOutput=str(tmp_path / "ranges"))
    checkpoint = tmp_path / "checkpoint"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), rabbitmq_url, json.dumps(opts)],
                              env=spark_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and driver.poll() is None:
            planned, committed = log_ids(checkpoint / "offsets"), log_ids(checkpoint / "commits")
            # the ledger (SQLite, which the driver writes) is read only once a batch is in flight
            if committed and planned and planned[-1] > committed[-1] and any(
                    r.status == RangeStatus.CLAIMED for r in ledger.ranges("restart")):
                break  # a batch is planned and claimed (its tasks are reading or writing), not committed
            time.sleep(0.02)
        assert driver.poll() is None, driver.stderr.read().decode()[-3000:] if driver.stderr else ""
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(60)
    planned, committed = log_ids(checkpoint / "offsets"), log_ids(checkpoint / "commits")
    assert committed and planned[-1] == committed[-1] + 1, (planned, committed)  # killed inside a batch
    killed = SourceOffset.from_json(json.loads((checkpoint / "offsets" / str(planned[-1]))
                                               .read_text().splitlines()[-1]))
    assert killed.offsets[s] < 200, "killed mid-way"
    open_claims = [r for r in ledger.ranges("restart") if r.status == RangeStatus.CLAIMED]
    assert [r.run.run_id for r in open_claims] == [f"batch-{killed.batch}"]

    q = start_query(spark, rabbitmq_url, tmp_path, **opts)
    assert q.awaitTermination(120)
    assert q.exception() is None
    assert sink_offsets(spark, tmp_path) == {s: list(range(200))}

    ranges = sorted(ledger.ranges("restart"), key=lambda r: r.start)
    assert all(r.status == RangeStatus.COMMITTED for r in ranges), [(r.start, r.end, r.status)
                                                                     for r in ranges]
    # Storing the broker offset takes offsets too (tracking entries): the last range may end past 200.
    assert [r.start for r in ranges] == [0] + [r.end for r in ranges[:-1]] and ranges[-1].end >= 200
    assert sum(r.records for r in ranges) == 200 and max(r.last_seen or 0 for r in ranges) == 199
    assert all(r.end - r.start <= 40 for r in ranges)
    replayed = [r for r in ranges if r.run.run_id == f"batch-{killed.batch}"]
    assert [(r.id, r.end) for r in replayed] == [(open_claims[0].id, killed.offsets[s])]
    assert len({r.run.dag_id for r in ranges}) == 1  # the query keeps its identity across the restart
    with StreamClient.connect(rabbitmq_url) as client:
        report = audit(ledger, "restart", broker=client)
        assert report.clean, report.to_text()


def read_all(reader: RabbitMQStreamMicroBatchReader, start: dict[str, Any], end: dict[str, Any]
             ) -> dict[str, list[int]]:
    """What the executors would read for one micro-batch (the tasks' own ``read``, run here)."""
    out: dict[str, list[int]] = {}
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            table = batch.to_pydict()
            for stream, offset in zip(table["stream"], table["offset"], strict=True):
                out.setdefault(stream, []).append(offset)
    return {k: sorted(v) for k, v in out.items()}


def test_starting_offsets_earliest_latest_per_stream_and_timestamp(rabbitmq_url: str, stream_name: Any
                                                                   ) -> None:
    """The reader itself: where a new query starts for each form of startingOffsets, and what its first
    micro-batch reads (records published after the start included)."""
    a, b = stream_name("soa"), stream_name("sob")
    create_stream(rabbitmq_url, a, 30)
    create_stream(rabbitmq_url, b, 10)
    time.sleep(1.1)  # a later chunk timestamp for the second publish
    split_ms = int(time.time() * 1000)
    publish(rabbitmq_url, a, 20, start=30)

    extra = [10]  # the next offset of b: one record is published into b after every query's start

    def first_batch(starting: str | None) -> tuple[dict[str, int], dict[str, list[int]]]:
        options = {"url": rabbitmq_url, "stream": f"{a},{b}"}
        if starting is not None:
            options["startingOffsets"] = starting
        reader = RabbitMQStreamMicroBatchReader(StreamingOptions.parse(options))
        try:
            initial = reader.initialOffset()
            publish(rabbitmq_url, b, 1, start=extra[0])
            extra[0] += 1
            end = reader.latestOffset(initial, reader.getDefaultReadLimit())
            return initial["offsets"], read_all(reader, initial, end)
        finally:
            reader.stop()

    assert first_batch("earliest") == ({a: 0, b: 0}, {a: list(range(50)), b: list(range(11))})
    assert first_batch(None) == ({a: 50, b: 11}, {b: [11]})  # latest by default, as Kafka's
    assert first_batch("latest") == ({a: 50, b: 12}, {b: [12]})
    assert first_batch(json.dumps({a: 45})) == ({a: 45, b: 13}, {a: list(range(45, 50)), b: [13]})
    assert first_batch(json.dumps({a: 5, b: "earliest"})) == (
        {a: 5, b: 0}, {a: list(range(5, 50)), b: list(range(15))})
    # b's first chunk stamped after split_ms is offset 10, published after the first query started
    assert first_batch(json.dumps({"timestamp": split_ms})) == (
        {a: 30, b: 10}, {a: list(range(30, 50)), b: list(range(10, 16))})


def test_new_super_stream_partition_is_read_from_its_first_offset(
    rabbitmq_url: str, stream_name: Any, broker_43: Any
) -> None:
    """The reader itself: a partition bound to the super stream while the query runs joins at its first
    offset in the next micro-batch (its start fixed in the offset's "from"); an availableNow run that
    began before the partition appeared does not read it (documented)."""
    from streamledger.protocol.amqp10 import Management
    from streamledger.protocol.amqp10.codec.types import Long

    sup = stream_name.super_stream("grow")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(sup, partitions=2)
        parts = client.partitions(sup)
    publish(rabbitmq_url, parts[0], 5)
    options = StreamingOptions.parse({"url": rabbitmq_url, "superStream": sup, "startingOffsets": "earliest"})
    reader, bounded = RabbitMQStreamMicroBatchReader(options), RabbitMQStreamMicroBatchReader(options)
    try:
        initial = reader.initialOffset()
        first = reader.latestOffset(initial, reader.getDefaultReadLimit())
        assert first["offsets"] == {parts[0]: 5, parts[1]: 0}
        bounded_initial = bounded.initialOffset()
        bounded.prepareForTriggerAvailableNow()

        added = stream_name("grow-extra")
        create_stream(rabbitmq_url, added, 7)
        amqp = f"amqp://guest:guest@{broker_43.host}:{broker_43.amqp_port}/"
        with Management.connect(amqp) as management:
            management.bind(sup, added, "extra", arguments={"x-stream-partition-order": Long(2)})
        with StreamClient.connect(rabbitmq_url) as client:
            assert added in client.partitions(sup)

        second = reader.latestOffset(first, reader.getDefaultReadLimit())
        assert second["offsets"] == {parts[0]: 5, parts[1]: 0, added: 7}
        assert second["from"] == {added: 0}
        assert read_all(reader, first, second) == {added: list(range(7))}

        done = bounded.latestOffset(bounded_initial, bounded.getDefaultReadLimit())
        assert done["offsets"][added] == 0  # joined at its first offset, nothing admitted past the start
        assert read_all(bounded, bounded_initial, done) == {parts[0]: list(range(5))}
        assert bounded.latestOffset(done, bounded.getDefaultReadLimit()) is done  # the run ends
    finally:
        reader.stop()
        bounded.stop()


def settled_first_offset(url: str, stream: str) -> int:
    """Retention runs asynchronously after a segment rolls: the first offset once it stops moving."""
    with StreamClient.connect(url) as client:
        first, stable_since = client.first_offset(stream), time.monotonic()
        while time.monotonic() - stable_since < 2.0:
            time.sleep(0.25)
            now = client.first_offset(stream)
            if now != first:
                first, stable_since = now, time.monotonic()
    return int(first)


def test_retention_past_the_checkpoint(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, ledger: Ledger
) -> None:
    """A query reads a stream and stops; retention then removes offsets past its checkpoint. Restarted
    from that checkpoint, failOnDataLoss (default) fails the query before anything is claimed; false
    reads on from the first retained offset and records the lost span in the ledger."""
    s = stream_name("retention")
    create_stream(rabbitmq_url, s, 100, max_length_bytes=60_000, max_segment_size_bytes=15_000)
    opts = dict(stream=s, startingOffsets="earliest", ledger=ledger.url, pipeline="retained",
                ledgerOutput=str(tmp_path / "ranges"))
    q = start_query(spark, rabbitmq_url, tmp_path, **opts)
    assert q.awaitTermination(120) and q.exception() is None
    checkpointed = batches(q)[-1][1].offsets[s]
    assert checkpointed >= 100
    for i in range(6):
        publish(rabbitmq_url, s, 500, start=100 + 500 * i, batch_size=100)
    first = settled_first_offset(rabbitmq_url, s)
    with StreamClient.connect(rabbitmq_url) as client:
        tail = int(client.committed_tail(s))
    assert checkpointed < first < tail, (checkpointed, first, tail)

    before = [(r.start, r.end, r.status) for r in ledger.ranges("retained")]
    q = start_query(spark, rabbitmq_url, tmp_path, **opts)
    lost = rf"offset {checkpointed} is no longer retained \(first available offset is {first}\)"
    with pytest.raises(Exception, match=lost):
        q.awaitTermination(120)
    assert [(r.start, r.end, r.status) for r in ledger.ranges("retained")] == before  # nothing claimed

    q = start_query(spark, rabbitmq_url, tmp_path, failOnDataLoss="false", **opts)
    assert q.awaitTermination(120)
    assert q.exception() is None
    # Not sink_offsets: the first run's stored broker offset took offset 100 (a tracking entry, no
    # record), so past it the bodies are shifted by one; [first, tail) holds only records.
    rows = spark.read.parquet(str(tmp_path / "out")).select("offset").collect()
    offsets = sorted(r["offset"] for r in rows)
    assert offsets[:100] == list(range(100)) and offsets[100:] == list(range(first, tail))
    by_status = {r.status: (r.start, r.end) for r in ledger.ranges("retained")
                 if r.status != RangeStatus.COMMITTED}
    assert by_status == {RangeStatus.LOST: (checkpointed, first)}
    committed = sorted((r.start, r.end) for r in ledger.ranges("retained")
                       if r.status == RangeStatus.COMMITTED)
    assert committed[0][0] == 0 and committed[-1] == (first, tail)
    with StreamClient.connect(rabbitmq_url) as client:
        report = audit(ledger, "retained", broker=client)
        assert report.clean, report.to_text()
