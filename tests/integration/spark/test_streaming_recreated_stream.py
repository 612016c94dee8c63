"""Ledger-recorded Structured Streaming meets a re-created stream (the batch's epochs and
fingerprints, issue 30 defect 3, composed with streaming). Real query on local Spark, RabbitMQ 4.3,
judged by the records the query wrote, not by the ledger."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch.proof import audit
from streamledger.cli import main
from streamledger.ledger import Ledger
from streamledger.manifest import MANIFEST
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.timeout(300)]

PIPELINE = "redteam-streaming"


def run_query(spark: Any, url: str, out: Path, checkpoint: Path, ledger: Ledger, stream: str, *,
              earliest: bool = True) -> None:
    """An availableNow query recording into ``ledger`` (its range outputs under the test's
    ``ranges``, whatever the checkpoint), its rows (stream, offset, body) written per Spark batch,
    run to the end. ``earliest=False`` leaves ``startingOffsets`` unset, as docs/spark.md says to
    start a new query on a pipeline with history (it starts where the ledger ends)."""
    reader = (spark.readStream.format("rabbitmq_stream").option("url", url).option("ledger", ledger.url)
              .option("pipeline", PIPELINE).option("ledgerOutput", str(checkpoint.parent.parent / "ranges"))
              .option("stream", stream))
    if earliest:
        reader = reader.option("startingOffsets", "earliest")

    def each(df: Any, batch_id: int) -> None:
        df.select("stream", "offset", "body").write.mode("overwrite").parquet(str(out / f"b{batch_id:05d}"))

    q = (reader.load().writeStream.foreachBatch(each).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    try:
        q.awaitTermination(240)
    except Exception as exc:  # the query failed: its error, as one exception type
        raise RuntimeError(str(exc)) from None
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))


def bodies(spark: Any, out: Path) -> set[bytes]:
    return {bytes(r["body"]) for r in spark.read.parquet(str(out / "b*")).select("body").collect()}


def test_a_stream_recreated_past_the_querys_offset_is_never_clean_over_its_unread_head(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """The query reads the stream's 100 records; the stream is deleted and re-created with 150 other
    records; the query resumes from its checkpoint at offset 100 and reads [100, 150) of the new stream.
    The new stream's first 100 records were never read by anyone: the proof must not be CLEAN."""
    s = stream_name("st-recreated")
    create_stream(rabbitmq_url, s, 100)
    out, cp = tmp_path / "a" / "out", tmp_path / "a" / "cp"
    run_query(spark, rabbitmq_url, out, cp, any_ledger, s)
    assert bodies(spark, out) == {body(s, i) for i in range(100)}
    with StreamClient.connect(rabbitmq_url) as c:
        c.delete_stream(s)
        c.create_stream(s)
    publish(rabbitmq_url, s, 150, start=1000)  # other bodies: <stream>#001000 ...
    try:
        run_query(spark, rabbitmq_url, out, cp, any_ledger, s)
    except RuntimeError as exc:  # refused: nothing of the new stream recorded, nothing skipped silently
        assert "deleted and re-created?" in str(exc)
        assert sorted((r.start, r.end) for r in any_ledger.ranges(PIPELINE) if r.records) == [(0, 100)]
        assert bodies(spark, out) == {body(s, i) for i in range(100)}
        return
    new = {body(s, i) for i in range(1000, 1150)}
    unread = new - bodies(spark, out)
    with StreamClient.connect(rabbitmq_url) as client:
        report = audit(any_ledger, PIPELINE, broker=client)
    assert not (unread and report.clean), (
        f"{len(unread)} records of the re-created stream never read, audit CLEAN")


def test_a_new_epochs_micro_batch_never_writes_over_the_retired_historys_output(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """A query records [0, 100) of the stream; the stream is re-created with 100 other records and
    `new-epoch` retires the history; a new query (new checkpoint) records [0, 100) of the new stream.
    Each range's output must stay its own: the old range's manifest still names it."""
    s = stream_name("st-epoch-dirs")
    create_stream(rabbitmq_url, s, 100)
    run_query(spark, rabbitmq_url, tmp_path / "a" / "out", tmp_path / "a" / "cp", any_ledger, s)
    (old,) = [r for r in any_ledger.ranges(PIPELINE) if r.records]
    assert old.output is not None
    with StreamClient.connect(rabbitmq_url) as c:
        c.delete_stream(s)
        c.create_stream(s)
    publish(rabbitmq_url, s, 100, start=1000)
    assert main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", PIPELINE, "--stream", s,
                 "--broker", old.source.broker, "--reason", "re-created"]) == 0
    run_query(spark, rabbitmq_url, tmp_path / "b" / "out", tmp_path / "b" / "cp", any_ledger, s)
    assert bodies(spark, tmp_path / "b" / "out") == {body(s, i) for i in range(1000, 1100)}
    new = [r for r in any_ledger.ranges(PIPELINE) if r.records and r.id != old.id]
    assert [(r.start, r.end) for r in new] == [(0, 100)]
    assert json.loads((Path(old.output) / MANIFEST).read_text())["range_id"] == old.id
    assert new[0].output != old.output
    with StreamClient.connect(rabbitmq_url) as client:
        report = audit(any_ledger, PIPELINE, broker=client)
    assert report.clean, report.to_text()


def test_a_deep_audit_of_a_streaming_pipeline_is_clean(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """The model checker's first streaming disagreement (a false alarm): a query recorded [0, 100)
    and wrote every row to its own sink, yet `ledger audit --deep` counted the rows of the range's
    directory (where a micro-batch writes only its manifest) and reported 0 rows, not 100."""
    s = stream_name("st-deep")
    create_stream(rabbitmq_url, s, 100)
    out = tmp_path / "a" / "out"
    run_query(spark, rabbitmq_url, out, tmp_path / "a" / "cp", any_ledger, s)
    assert bodies(spark, out) == {body(s, i) for i in range(100)}
    with StreamClient.connect(rabbitmq_url) as client:
        report = audit(any_ledger, PIPELINE, broker=client, deep=True)
    assert report.clean, report.to_text()


RETENTION = {"max_length_bytes": 60_000, "max_segment_size_bytes": 15_000}


def test_a_recreated_stream_refused_once_stays_refused_after_retention_took_its_fingerprint(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """The batch's identity signs, for the streaming recorder too (one source). A query records
    [0, 10) (its fingerprint: the chunk holding offset 9); the stream is re-created with 5 records: a
    new query resuming at the ledger's end 10 sees the committed tail 5 below it and fails. That
    refusal must be remembered (as the batch's is, until `new-epoch`): the new stream then grows past
    10 while retention rolls the fingerprinted chunk out, and a query reading on from 10 would leave
    the new stream's records below 10, still on the broker, unread for ever."""
    s = stream_name("st-refused")
    for _ in range(5):  # one chunk [0, 10): a busy broker may write one publish as two (then again)
        create_stream(rabbitmq_url, s, **RETENTION)
        publish(rabbitmq_url, s, 10, batch_size=10)
        with StreamClient.connect(rabbitmq_url) as c:
            head = c.chunk_at(s, 9)
            if head is not None and head.first_offset == 0:
                break
            c.delete_stream(s)
    else:
        raise AssertionError(f"the broker split a publish of 10 into several chunks five times on {s}")
    run_query(spark, rabbitmq_url, tmp_path / "a" / "out", tmp_path / "a" / "cp", any_ledger, s)
    (old,) = [r for r in any_ledger.ranges(PIPELINE) if r.records]
    assert (old.start, old.end) == (0, 10)
    (pos,) = any_ledger.positions(PIPELINE, [old.source])
    assert pos.chunk is not None
    with StreamClient.connect(rabbitmq_url) as c:
        c.delete_stream(s)
        c.create_stream(s, **RETENTION)
    publish(rabbitmq_url, s, 5, start=1000)
    with pytest.raises(RuntimeError, match="below"):  # the new stream's tail 5 is below the ledger's end
        run_query(spark, rabbitmq_url, tmp_path / "b" / "out", tmp_path / "b" / "cp", any_ledger, s,
                  earliest=False)
    with StreamClient.connect(rabbitmq_url) as c:
        for i in range(5, 10):  # one segment each: retention drops the first segment, [0, 6)
            c.publish(s, [body(s, 1000 + i) + b"|" + b"x" * 16_000], batch_size=1)
        c.publish(s, [body(s, 1000 + i) for i in range(10, 15)], batch_size=5)
        for _ in range(50):  # the first offset the broker reports may lag retention a moment
            first, tail = c.first_offset(s), c.committed_tail(s)
            if first > pos.chunk.offset:
                break
            time.sleep(0.1)
    # records below 10 still there, the fingerprinted chunk gone
    assert pos.chunk.offset < first < 10 < tail, (pos.chunk, first, tail)
    try:
        run_query(spark, rabbitmq_url, tmp_path / "c" / "out", tmp_path / "c" / "cp", any_ledger, s,
                  earliest=False)
    except RuntimeError as exc:
        assert "deleted and re-created?" in str(exc), exc
        assert sorted((r.start, r.end) for r in any_ledger.ranges(PIPELINE) if r.records) == [(0, 10)]
        return
    ranges = [(r.start, r.end, r.status.value) for r in any_ledger.ranges(PIPELINE)]
    raise AssertionError(f"the query read on from the old ledger end 10 on the re-created stream (first "
                         f"offset {first}): [{first}, 10) never read; ranges {ranges}")


def test_a_checkpointed_micro_batch_replayed_on_a_recreated_stream_claims_nothing(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """The model checker's seed 21 (SQLite): a query planned micro-batch 0 as [0, 40) and died before
    writing it; the stream was deleted and re-created (empty), the old history retired by `new-epoch`.
    Restarted from its checkpoint, the query replays [0, 40) on a stream whose tail is 0: it must
    fail before claiming (before: the new epoch got a claim [0, 40) no read could ever finish, every
    batch after refused the stream as re-created, the pipeline stalled for good)."""
    s = stream_name("st-replay")
    create_stream(rabbitmq_url, s, 40)
    out, cp = tmp_path / "a" / "out", tmp_path / "a" / "cp"
    reader = (spark.readStream.format("rabbitmq_stream").option("url", rabbitmq_url)
              .option("ledger", any_ledger.url).option("pipeline", PIPELINE)
              .option("ledgerOutput", str(tmp_path / "ranges")).option("stream", s)
              .option("startingOffsets", "earliest"))

    def dies(df: Any, batch_id: int) -> None:
        raise RuntimeError("the query dies before writing")

    q = reader.load().writeStream.foreachBatch(dies).option("checkpointLocation", str(cp)) \
        .trigger(availableNow=True).start()
    with pytest.raises(Exception, match="dies before writing"):
        q.awaitTermination(240)
    (claim,) = any_ledger.ranges(PIPELINE)
    assert (claim.start, claim.end, claim.status.value) == (0, 40, "claimed")
    any_ledger.release_stale(timedelta(0))
    with StreamClient.connect(rabbitmq_url) as c:
        c.delete_stream(s)
        c.create_stream(s)
    assert main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", PIPELINE, "--stream", s,
                 "--broker", claim.source.broker, "--reason", "re-created"]) == 0
    with pytest.raises(RuntimeError, match="re-created"):
        run_query(spark, rabbitmq_url, out, cp, any_ledger, s)
    live = [(r.start, r.end, r.status.value) for r in any_ledger.ranges(PIPELINE)
            if "#epoch" not in r.source.broker and r.status.value in ("claimed", "committed") and not r.empty]
    assert live == [], live


def test_a_first_micro_batch_replayed_on_a_stream_recreated_with_other_records_is_refused(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, any_ledger: Ledger
) -> None:
    """A query plans micro-batch 0 as [0, 40) and dies before writing it: the history holds that
    claim and no committed range. The stream is deleted and re-created with 60 other records. The
    query restarted from its checkpoint replays [0, 40): it must refuse the stream as re-created, not
    read the new stream's [0, 40) as the old one's and leave the audit CLEAN over 40 records nobody
    read (the batch's model soak seed 209, met by a streaming query)."""
    s = stream_name("st-first-claim")
    create_stream(rabbitmq_url, s, 40)
    out, cp = tmp_path / "a" / "out", tmp_path / "a" / "cp"
    reader = (spark.readStream.format("rabbitmq_stream").option("url", rabbitmq_url)
              .option("ledger", any_ledger.url).option("pipeline", PIPELINE)
              .option("ledgerOutput", str(tmp_path / "ranges")).option("stream", s)
              .option("startingOffsets", "earliest"))

    def dies(df: Any, batch_id: int) -> None:
        raise RuntimeError("the query dies before writing")

    q = reader.load().writeStream.foreachBatch(dies).option("checkpointLocation", str(cp)) \
        .trigger(availableNow=True).start()
    with pytest.raises(Exception, match="dies before writing"):
        q.awaitTermination(240)
    (claim,) = any_ledger.ranges(PIPELINE)
    assert (claim.start, claim.end, claim.status.value) == (0, 40, "claimed")
    with StreamClient.connect(rabbitmq_url) as c:
        c.delete_stream(s)
        c.create_stream(s)
    publish(rabbitmq_url, s, 60, start=1000)  # other records: bodies 1000..1059
    try:
        run_query(spark, rabbitmq_url, out, cp, any_ledger, s)
    except RuntimeError as refused:
        assert "re-created" in str(refused) and "new-epoch" in str(refused), refused
        assert not [r for r in any_ledger.ranges(PIPELINE) if r.status.value == "committed" and not r.empty]
        return
    report = audit(any_ledger, PIPELINE)
    old_lost = [r for r in any_ledger.ranges(PIPELINE) if r.status.value == "lost" and r.start == 0]
    assert old_lost or not report.clean, (sorted(bodies(spark, out))[:3], report.to_text())
