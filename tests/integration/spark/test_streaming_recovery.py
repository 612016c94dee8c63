"""Ledger-recorded Structured Streaming across failures, ``ledger release-stale`` and restarts (issue 30,
defect 6): real queries on local Spark against RabbitMQ 4.3, each restarted from its checkpoint.

The ledger must record exactly the span each micro-batch read (the offsets in the checkpoint's batch):
a claim of another span is never adopted or left in place, a released claim is claimed again with
the same span or the query fails with one line, and the audit is never CLEAN over a span nobody read.
The sink is a ``foreachBatch`` writing one directory per Spark batch id (overwritten on a replay), so
what the query read is known independently of the ledger.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch.proof import audit
from streamledger.cli import main
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.spark.helpers import client_offsets, create_stream, publish

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]

PIPELINE = "recovering"


class Injected(RuntimeError):
    """The failure a test injects inside a micro-batch (the batch is planned and claimed, not done)."""


def run_query(spark: Any, url: str, out: Path, checkpoint: Path, ledger: Ledger,
              during: Callable[[int], None] | None = None, **options: Any) -> Any:
    """An availableNow query recording into ``ledger``; ``during(batch_id)`` runs inside each batch,
    after its rows are written (it may raise to fail the batch)."""
    reader = (spark.readStream.format("rabbitmq_stream").option("url", url).option("ledger", ledger.url)
              .option("pipeline", PIPELINE).option("ledgerOutput", str(out.parent / "ranges")))
    for key, value in options.items():
        reader = reader.option(key, value)

    def each(df: Any, batch_id: int) -> None:
        df.select("stream", "offset").write.mode("overwrite").parquet(str(out / f"b{batch_id:05d}"))
        if during is not None:
            during(batch_id)

    return (reader.load().writeStream.foreachBatch(each).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start())


def read_back(spark: Any, out: Path) -> list[int]:
    """Every offset the query wrote, one entry per row (a duplicate shows twice)."""
    if not out.exists():
        return []
    return sorted(r["offset"] for r in spark.read.parquet(str(out / "b*")).select("offset").collect())


def release_stale(ledger: Ledger) -> None:
    """``streamledger ledger release-stale --older-than 0``: what an operator runs for a dead holder."""
    assert main(["ledger", "release-stale", "--db", ledger.url, "--older-than", "0",
                 "--pipeline", PIPELINE]) == 0


def spans(ledger: Ledger, status: RangeStatus) -> list[tuple[int, int]]:
    return sorted((r.start, r.end) for r in ledger.ranges(PIPELINE) if r.status == status)


def assert_recorded_once(ledger: Ledger, url: str, offsets: list[int], total: int) -> None:
    """The ledger's committed ranges tile the stream from 0 and hold exactly the records the query
    wrote (each once), and the whole proof is CLEAN."""
    assert offsets == list(range(total))
    done = spans(ledger, RangeStatus.COMMITTED)
    assert [a for a, _ in done] == [0] + [b for _, b in done[:-1]], done
    assert done[-1][1] >= total, done
    committed = [r for r in ledger.ranges(PIPELINE) if r.status == RangeStatus.COMMITTED]
    assert sum(r.records or 0 for r in committed) == total
    assert not spans(ledger, RangeStatus.CLAIMED)
    with StreamClient.connect(url) as client:
        report = audit(ledger, PIPELINE, broker=client)
        assert report.clean, report.to_text()


def test_a_failed_hole_of_another_span_is_released_never_adopted(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """Query A dies inside micro-batch 1 ([40, 80) claimed); ``release-stale`` fails the claim. A new
    query B on the same pipeline starts where the ledger ends (40) with a larger trigger, so its batch
    0 is [40, 90): the ledger hands back the failed span [40, 80). B must fail with one line naming
    the stream and both spans and leave nothing claimed; restarted from its checkpoint it must not
    adopt [40, 80) (commit it, read [80, 90) unrecorded, stall at "the ledger's ranges end at 80").
    A, restarted from its checkpoint, reads [40, 80) again under the same span and finishes."""
    ledger = any_ledger
    s = stream_name("hole")
    create_stream(rabbitmq_url, s, 200)

    def die_in_batch_1(batch_id: int) -> None:
        if batch_id == 1:
            raise Injected("query A dies inside micro-batch 1")

    out_a, out_b = tmp_path / "a" / "out", tmp_path / "b" / "out"
    q = run_query(spark, rabbitmq_url, out_a, tmp_path / "a" / "cp", ledger, die_in_batch_1,
                  stream=s, startingOffsets="earliest", maxOffsetsPerTrigger="40")
    with pytest.raises(Exception, match="query A dies inside micro-batch 1"):
        q.awaitTermination(180)
    assert spans(ledger, RangeStatus.CLAIMED) == [(40, 80)]
    release_stale(ledger)
    assert spans(ledger, RangeStatus.CLAIMED) == []

    refused = (rf"stream '{s}': the ledger hands micro-batch 0 of query \S+ the failed span \[40, 80\) "
               r"\(range \d+\), not the span it reads \[40, 90\)")
    for attempt in ("first start", "restart from the checkpoint"):
        q = run_query(spark, rabbitmq_url, out_b, tmp_path / "b" / "cp", ledger,
                      stream=s, maxOffsetsPerTrigger="50")
        with pytest.raises(Exception) as failed:
            q.awaitTermination(180)
        assert spans(ledger, RangeStatus.CLAIMED) == [], attempt  # the claim it could not use is released
        assert spans(ledger, RangeStatus.COMMITTED) == [(0, 40)], attempt  # nothing committed
        assert read_back(spark, out_b) == [], attempt  # B read nothing
        assert re.search(refused, str(failed.value)), str(failed.value)[:2000]

    q = run_query(spark, rabbitmq_url, out_a, tmp_path / "a" / "cp", ledger,
                  stream=s, startingOffsets="earliest", maxOffsetsPerTrigger="40")
    assert q.awaitTermination(180) and q.exception() is None
    assert (40, 80) in spans(ledger, RangeStatus.COMMITTED)
    assert_recorded_once(ledger, rabbitmq_url, read_back(spark, out_a), 200)


def test_a_restarted_query_refuses_its_open_claim_of_another_span(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, ledger: Ledger
) -> None:
    """Query A dies inside micro-batch 1 ([40, 80) claimed). Its checkpoint is then restored from a copy
    taken before batch 1 was planned and the query restarted with a larger trigger: Spark plans batch 1
    again as [40, 90) under the same query id. The restart must not adopt the open claim [40, 80):
    one line naming the stream and both spans, nothing committed. After ``release-stale`` and another
    restart it still fails with one line (the failed span is not what batch 1 reads) and never
    records [40, 80) as read."""
    s = stream_name("adopt")
    create_stream(rabbitmq_url, s, 200)

    def die_in_batch_1(batch_id: int) -> None:
        if batch_id == 1:
            raise Injected("query A dies inside micro-batch 1")

    out, cp = tmp_path / "a" / "out", tmp_path / "a" / "cp"
    q = run_query(spark, rabbitmq_url, out, cp, ledger, die_in_batch_1,
                  stream=s, startingOffsets="earliest", maxOffsetsPerTrigger="40")
    with pytest.raises(Exception, match="query A dies inside micro-batch 1"):
        q.awaitTermination(180)
    assert spans(ledger, RangeStatus.CLAIMED) == [(40, 80)]
    (cp / "offsets" / "1").unlink()  # the checkpoint as a backup taken after batch 0 holds it
    for crc in (cp / "offsets").glob(".1.crc"):
        crc.unlink()
    shutil.rmtree(out / "b00001", ignore_errors=True)

    adopt = (rf"stream '{s}': micro-batch 1 of query \S+ reads \[40, 90\) but its claim in the ledger "
             r"is \[40, 80\) \(range \d+\)")
    q = run_query(spark, rabbitmq_url, out, cp, ledger, stream=s, maxOffsetsPerTrigger="50")
    with pytest.raises(Exception, match=adopt):
        q.awaitTermination(180)
    assert spans(ledger, RangeStatus.COMMITTED) == [(0, 40)]  # nothing committed
    assert spans(ledger, RangeStatus.CLAIMED) == [(40, 80)]  # left for the operator to release

    release_stale(ledger)
    refused = (rf"stream '{s}': the ledger hands micro-batch 1 of query \S+ the failed span \[40, 80\) "
               r"\(range \d+\), not the span it reads \[40, 90\)")
    q = run_query(spark, rabbitmq_url, out, cp, ledger, stream=s, maxOffsetsPerTrigger="50")
    with pytest.raises(Exception, match=refused):
        q.awaitTermination(180)
    assert spans(ledger, RangeStatus.COMMITTED) == [(0, 40)]
    assert spans(ledger, RangeStatus.CLAIMED) == []
    with StreamClient.connect(rabbitmq_url) as client:
        report = audit(ledger, PIPELINE, broker=client)
        assert not report.clean  # [40, 80) is a failed hole nobody read: never CLEAN
        assert client.query_offset(s, PIPELINE) == 39


def test_release_stale_under_a_running_batch_and_after_a_death_then_restart(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """``release-stale`` fails the claim of micro-batch 1 while the batch runs (its holder is alive):
    the batch completes, so the recorder claims the same span again and commits it (before: every
    later batch failed with "the ledger's ranges end at 40"). The query then dies inside batch 3;
    ``release-stale`` fails that claim too, and the restart from the checkpoint claims the same span
    again and finishes: every record once, the ranges exactly Spark's batches, the audit CLEAN."""
    ledger = any_ledger
    s = stream_name("stale")
    create_stream(rabbitmq_url, s, 200)

    def release_then_die(batch_id: int) -> None:
        if batch_id == 1:
            release_stale(ledger)
            assert spans(ledger, RangeStatus.CLAIMED) == []
        if batch_id == 3:
            raise Injected("the query dies inside micro-batch 3")

    out, cp = tmp_path / "out", tmp_path / "cp"
    q = run_query(spark, rabbitmq_url, out, cp, ledger, release_then_die,
                  stream=s, startingOffsets="earliest", maxOffsetsPerTrigger="40")
    with pytest.raises(Exception, match="the query dies inside micro-batch 3"):
        q.awaitTermination(180)
    assert spans(ledger, RangeStatus.COMMITTED) == [(0, 40), (40, 80), (80, 120)]
    assert spans(ledger, RangeStatus.CLAIMED) == [(120, 160)]
    release_stale(ledger)

    q = run_query(spark, rabbitmq_url, out, cp, ledger,
                  stream=s, startingOffsets="earliest", maxOffsetsPerTrigger="40")
    assert q.awaitTermination(180) and q.exception() is None
    assert spans(ledger, RangeStatus.COMMITTED)[:5] == [(0, 40), (40, 80), (80, 120), (120, 160), (160, 200)]
    assert_recorded_once(ledger, rabbitmq_url, read_back(spark, out), 200)


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


def test_retention_under_an_open_claim_records_the_loss_not_a_read(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, ledger: Ledger
) -> None:
    """The query dies inside micro-batch 1 ([40, 80) claimed); retention then removes offsets past 40.
    Restarted from its checkpoint with failOnDataLoss=false, Spark replays batch 1 from the first
    retained offset: the open claim [40, 80) is not what the batch reads, so it is not adopted (before:
    committed as read, the loss never recorded, audit CLEAN); the removed head is recorded ``lost``
    and only what the batch read is committed."""
    s = stream_name("retained")
    create_stream(rabbitmq_url, s, 100, max_length_bytes=60_000, max_segment_size_bytes=15_000)

    def die_in_batch_1(batch_id: int) -> None:
        if batch_id == 1:
            raise Injected("the query dies inside micro-batch 1")

    out, cp = tmp_path / "out", tmp_path / "cp"
    q = run_query(spark, rabbitmq_url, out, cp, ledger, die_in_batch_1,
                  stream=s, startingOffsets="earliest", maxOffsetsPerTrigger="40")
    with pytest.raises(Exception, match="the query dies inside micro-batch 1"):
        q.awaitTermination(180)
    assert spans(ledger, RangeStatus.CLAIMED) == [(40, 80)]
    shutil.rmtree(out / "b00001", ignore_errors=True)
    for i in range(6):
        publish(rabbitmq_url, s, 500, start=100 + 500 * i, batch_size=100)
    first = settled_first_offset(rabbitmq_url, s)
    with StreamClient.connect(rabbitmq_url) as client:
        tail = int(client.committed_tail(s))
    assert 40 < first < tail, (first, tail)
    # read now: the query's own StoreOffset may roll a segment and let retention move on afterwards
    kept = client_offsets(rabbitmq_url, s, first, tail)  # records only (no StoreOffset tracking entry)

    q = run_query(spark, rabbitmq_url, out, cp, ledger, stream=s, failOnDataLoss="false")
    assert q.awaitTermination(180) and q.exception() is None
    assert read_back(spark, out) == list(range(40)) + kept
    lost = spans(ledger, RangeStatus.LOST)
    assert lost and lost[0][0] == 40 and lost[-1][1] == first, lost
    assert [a for a, _ in lost[1:]] == [b for _, b in lost[:-1]], lost
    done = spans(ledger, RangeStatus.COMMITTED)
    assert done[0] == (0, 40) and done[1][0] == first and done[-1][1] >= tail, done
    assert [a for a, _ in done[2:]] == [b for _, b in done[1:-1]], done
    committed = [r for r in ledger.ranges(PIPELINE) if r.status == RangeStatus.COMMITTED]
    assert sum(r.records or 0 for r in committed) == 40 + len(kept)
    assert not spans(ledger, RangeStatus.CLAIMED)
    with StreamClient.connect(rabbitmq_url) as client:
        report = audit(ledger, PIPELINE, broker=client)
        assert report.clean, report.to_text()


def test_a_new_epoch_records_what_a_streaming_query_saw_but_never_read_lost(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """Audit rule 10 for streaming pipelines: a query saw the stream hold 200 records, committed
    [0, 40) and died inside [40, 80); the stream is then deleted and re-created. `new-epoch` must
    record everything of the old stream nobody read as lost, [40, tail), naming the re-created
    stream. Before, the micro-batch recorder recorded no `seen_tail`, so only the failed claim's span
    [40, 80) was recorded and [80, 200) vanished with the audit CLEAN."""
    ledger = any_ledger
    s = stream_name("stream-epoch")
    create_stream(rabbitmq_url, s, 200)

    def die_in_batch_1(batch_id: int) -> None:
        if batch_id == 1:
            raise Injected("the query dies inside micro-batch 1")

    q = run_query(spark, rabbitmq_url, tmp_path / "out", tmp_path / "cp", ledger, die_in_batch_1,
                  stream=s, startingOffsets="earliest", maxOffsetsPerTrigger="40")
    with pytest.raises(Exception, match="dies inside micro-batch 1"):
        q.awaitTermination(180)
    assert spans(ledger, RangeStatus.COMMITTED) == [(0, 40)]
    release_stale(ledger)
    with StreamClient.connect(rabbitmq_url) as client:
        tail = client.committed_tail(s)
        assert tail >= 200
        client.delete_stream(s)
        client.create_stream(s)
        client.publish(s, [b"new-%d" % i for i in range(30)])
    [src] = {r.source for r in ledger.ranges(PIPELINE)}
    ledger.new_epoch(PIPELINE, src, reason="re-created")
    retired = sorted((r.start, r.end, r.status.value) for r in ledger.ranges(PIPELINE)
                     if r.source.broker != src.broker and r.status != RangeStatus.FAILED)
    # up to the tail the query saw: every record (the tracking entry of its StoreOffset may come after)
    assert retired[:1] == [(0, 40, "committed")] and len(retired) == 2, retired
    assert retired[1][0] == 40 and 200 <= retired[1][1] <= tail and retired[1][2] == "lost", retired
    [lost] = [r for r in ledger.ranges(PIPELINE) if r.status == RangeStatus.LOST]
    assert "re-created" in (lost.error or ""), lost
