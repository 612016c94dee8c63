"""Issue 34: batch and streaming reads of ``rabbitmq_stream`` agree (local Spark, real RabbitMQ 4.3).

The same window, given by the same Kafka-named options, read by ``spark.read`` and by a ledger-recorded
``spark.readStream`` (AvailableNow, several micro-batches, maxBytesPerTrigger): the same rows, the same
schema; the ledger's committed ranges and the bounded job (``run_job``) cover exactly the window the
batch options plan.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from streamledger.ledger import Ledger, RangeStatus
from streamledger.spark.datasource import ReadOptions, plan
from streamledger.spark.job import run_job
from tests.integration.spark.helpers import create_stream, publish, read_df

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((r["stream"], r["offset"], r["body"], tuple(sorted(r["application_properties"].items())))
                  for r in df.collect())


def test_batch_and_streaming_read_the_same_window(spark: Any, rabbitmq_url: str, stream_name: Any,
                                                  tmp_path: Path) -> None:
    a, b = stream_name("agree-a"), stream_name("agree-b")
    create_stream(rabbitmq_url, a, 120)
    create_stream(rabbitmq_url, b, 80)
    time.sleep(1.1)
    cut = int(time.time() * 1000)
    time.sleep(0.1)
    publish(rabbitmq_url, a, 150, start=120)
    publish(rabbitmq_url, b, 90, start=80)
    common = {"stream": f"{a},{b}", "startingTimestamp": str(cut),
              "columns": "stream,offset,body,application_properties"}

    batch = read_df(spark, rabbitmq_url, **common)
    batch_rows = rows(batch)
    assert {(s, o) for s, o, _, _ in batch_rows} == (
        {(a, o) for o in range(120, 270)} | {(b, o) for o in range(80, 170)})

    # the window the batch options plan, before the streaming query's stored offsets move the tails
    window = {r.stream: (r.start, r.end) for r in plan(ReadOptions.parse({"url": rabbitmq_url, **common}))}
    assert window == {a: (120, 270), b: (80, 170)}

    ledger_url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    reader = spark.readStream.format("rabbitmq_stream").option("url", rabbitmq_url)
    for key, value in {**common, "maxBytesPerTrigger": "8k", "ledger": ledger_url, "pipeline": "agree",
                       "ledgerOutput": str(tmp_path / "ranges")}.items():
        reader = reader.option(key, value)
    stream_df = reader.load()
    assert stream_df.schema == batch.schema
    query = (stream_df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    assert query.awaitTermination(240) and query.exception() is None
    moved = [p for p in query.recentProgress if p.sources[0].startOffset != p.sources[0].endOffset]
    assert len(moved) > 1  # maxBytesPerTrigger cut the window into several micro-batches

    streamed = spark.read.parquet(str(tmp_path / "out"))
    assert streamed.schema.fieldNames() == batch.schema.fieldNames()
    assert rows(streamed) == batch_rows

    ledger = Ledger(ledger_url)
    try:
        committed = sorted((r.source.stream, r.start, r.end) for r in ledger.ranges("agree")
                           if r.status == RangeStatus.COMMITTED)
    finally:
        ledger.close()
    for s, (first, end) in window.items():
        spans = [(start, stop) for name, start, stop in committed if name == s]
        assert spans[0][0] == first and spans[-1][1] == end
        assert all(x[1] == y[0] for x, y in itertools.pairwise(spans))  # contiguous, no overlap

    # the bounded job over the window the same options plan: the same offsets and record counts
    manifest = run_job(spark, url=rabbitmq_url, ranges=window, output=str(tmp_path / "job"))
    assert {s: (e["start"], e["end"], e["records"]) for s, e in manifest["streams"].items()} == {
        s: (first, end, end - first) for s, (first, end) in window.items()}
