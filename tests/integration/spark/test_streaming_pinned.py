"""A ledger-recorded streaming query and a pipeline pinned to data intervals do not share one history
(found by the model checker composing them, tests/model): a query claims at the ledger's end, so it
takes offsets of an interval whose run has not come yet, and that run's pinned claim then overlaps a
live range on every retry: the interval stalls for ever, its gap reported by the audit. Real queries on
local Spark against RabbitMQ 4.3, both ledgers.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, BatchError, LocalSparkRunner, RunId, run_batch
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.spark.helpers import create_stream, publish

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.timeout(300)]

PIPELINE = "pinned-and-streamed"


def _query(spark: Any, url: str, stream: str, ledger: Ledger, root: Path, *, earliest: bool = False
           ) -> tuple[Any, Path]:
    """An availableNow query recording into ``ledger`` (where its history ends, or from the first
    offset); its rows go to ``root/q/b<batch id>``."""
    out = root / "q"

    def each(df: Any, batch_id: int) -> None:
        df.select("offset").write.mode("overwrite").parquet(str(out / f"b{batch_id:05d}"))

    reader = (spark.readStream.format("rabbitmq_stream").option("url", url).option("stream", stream)
              .option("ledger", ledger.url).option("pipeline", PIPELINE).option("ledgerOutput", str(root)))
    if earliest:
        reader = reader.option("startingOffsets", "earliest")
    q = (reader.load().writeStream.foreachBatch(each).option("checkpointLocation", str(root / "checkpoint"))
         .trigger(availableNow=True).start())
    return q, out


def _interval_batch(spark: Any, url: str, stream: str, ledger: Ledger, root: Path, start: datetime,
                    end: datetime, run: str) -> Any:
    runner = LocalSparkRunner()
    runner._spark = spark  # the suite's session: no second JVM
    cfg = BatchConfig(pipeline=PIPELINE, url=url, output_root=str(root), stream=stream, interval_start=start,
                      interval_end=end, bound_by_interval=True, interval_grace=0.0)
    with StreamClient.connect(url) as client:
        return run_batch(cfg, run=RunId("pinned", run, "read"), ledger=ledger, broker=client, runner=runner)


def _moment() -> datetime:
    time.sleep(0.3)  # chunk timestamps are the broker's clock, in milliseconds
    now = datetime.now(UTC)
    time.sleep(0.3)
    return now


def test_a_streaming_query_on_a_pinned_pipeline_is_refused_before_any_claim(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """Interval 0's run commits its pinned range; records of interval 1 follow. A streaming query on the
    pipeline must fail with one line naming the pipeline, the stream and the pinned history, having
    claimed and written nothing: recorded, it took interval 1's offsets and interval 1's run failed
    on every retry ("range overlaps a live range")."""
    ledger, s = any_ledger, stream_name("pinned")
    create_stream(rabbitmq_url, s)
    t0 = _moment()
    publish(rabbitmq_url, s, 30)
    t1 = _moment()
    assert _interval_batch(spark, rabbitmq_url, s, ledger, tmp_path, t0, t1, "i0").records == 30
    publish(rabbitmq_url, s, 20, start=30)
    before = [(r.id, r.status) for r in ledger.ranges(PIPELINE)]

    q, out = _query(spark, rabbitmq_url, s, ledger, tmp_path)
    with pytest.raises(Exception) as refused:
        q.awaitTermination(180)
    text = str(refused.value)
    assert f"pipeline {PIPELINE!r}, stream {s!r}" in text and "pinned to data intervals" in text, text[:2000]
    assert [(r.id, r.status) for r in ledger.ranges(PIPELINE)] == before  # nothing claimed
    assert not out.exists()  # nothing written

    t2 = _moment()  # interval 1's run reads what the query did not
    assert _interval_batch(spark, rabbitmq_url, s, ledger, tmp_path, t1, t2, "i1").records == 20


@pytest.mark.xfail(strict=True, reason=(
    "not fixed: a pinned batch does not look for a streaming query's ranges in its history: here interval "
    "0's run takes the query's committed [0, 30) as its own (30 records it never read, no error) and "
    "interval 1's is claimed beside it; an interval whose span overlaps a query's range without equalling "
    "it fails on every retry ('range overlaps a live range': the model checker's stall)"))
def test_a_pinned_batch_on_a_history_a_streaming_query_recorded_is_refused_before_any_claim(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """The other order: a query recorded [0, 30) of a pipeline a scheduler then runs pinned. Interval
    0's run (whose span the query read) and interval 1's (beside it) must each be refused with one
    line naming the pipeline and the query's history, before anything is claimed."""
    ledger, s = any_ledger, stream_name("streamed")
    create_stream(rabbitmq_url, s)
    t0 = _moment()
    publish(rabbitmq_url, s, 30)
    t1 = _moment()
    q, _out = _query(spark, rabbitmq_url, s, ledger, tmp_path, earliest=True)
    assert q.awaitTermination(180) and q.exception() is None
    publish(rabbitmq_url, s, 20, start=30)
    t2 = _moment()
    before = [(r.id, r.status) for r in ledger.ranges(PIPELINE)]
    for run, (start, end) in {"i0": (t0, t1), "i1": (t1, t2)}.items():
        with pytest.raises(BatchError, match="streaming query"):
            _interval_batch(spark, rabbitmq_url, s, ledger, tmp_path, start, end, run)
        assert [(r.id, r.status) for r in ledger.ranges(PIPELINE)] == before, run
