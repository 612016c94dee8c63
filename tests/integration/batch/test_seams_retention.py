"""Issue 30, what the model checker found where retention, stored offsets and re-created streams
meet, against the real RabbitMQ broker, local Spark and both ledgers.

A. retention removing the segment that held the broker's stored offset is not a re-created stream:
   the batch goes on (the retention gap handled per ``on_data_loss``) and stores the offset again.
B. a failed range of a history retired by ``ledger new-epoch`` can never be redone: the new epoch
   records what it left unread as lost instead of leaving a finding nothing can clear.
C. a committed range whose publish keeps failing is an audit finding until it is published.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchError, run_batch
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPELINE = "p-retention"
PAD = b"." * 2_000


def _padded(client: StreamClient, stream: str, start: int, count: int) -> None:
    """``count`` records of about 2 kB each, bodies ``<stream>#<i>`` then padding."""
    got = client.publish(stream, [body(stream, i) + PAD for i in range(start, start + count)], batch_size=10)
    assert got.confirmed == count, got


def _retain_past(client: StreamClient, stream: str, offset: int, sent: int) -> int:
    """Publish padded records until retention dropped every offset up to ``offset``; the count sent."""
    while client.first_offset(stream) <= offset and sent < 2_000:
        _padded(client, stream, sent, 60)
        sent += 60
    # A round can roll a segment and leave retention nothing but an empty one (first == tail: every
    # record sent is gone); one more small record stays, so the batch after has something to read.
    # Retention deletes asynchronously (slower on a busy machine): the check is made again after a
    # pause, until a record stays (a CI-like run read [40, 102) lost and nothing after it).
    while sent < 2_000:
        while client.committed_tail(stream) <= client.first_offset(stream) and sent < 2_000:
            _padded(client, stream, sent, 1)
            sent += 1
        time.sleep(1.0)
        if client.committed_tail(stream) > client.first_offset(stream):
            break
    assert client.first_offset(stream) > offset, client.first_offset(stream)
    return sent


@pytest.mark.parametrize("on_data_loss", ["record", "fail"])
def test_retention_taking_the_stored_offset_is_not_a_re_created_stream(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, on_data_loss: str,
) -> None:
    """A: r1 reads 40 records and stores 39; retention then drops every segment up to past the
    ledger's end, the stored offset with them. r2 must not refuse the stream as re-created: with
    on_data_loss='record' it records the gap lost, reads the rest and stores the offset again;
    with 'fail' it fails naming retention, like any other retention gap."""
    ledger = any_ledger
    s = stream_name("ret-a")
    create_stream(rabbitmq_url, s, 0, max_length_bytes=60_000, max_segment_size_bytes=15_000)
    publish(rabbitmq_url, s, 40, batch_size=10)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPELINE, on_data_loss=on_data_loss)
    run_batch(cfg, run=rid("read", run="r1"), ledger=ledger, broker=client, runner=runner)
    assert client.query_offset(s, PIPELINE) == 39
    sent = _retain_past(client, s, 40, 40)
    first = client.first_offset(s)

    if on_data_loss == "fail":
        gap = r"must read \[40, \d+\) but retention removed everything below \d+"
        with pytest.raises(BatchError, match=gap):
            run_batch(cfg, run=rid("read", run="r2"), ledger=ledger, broker=client, runner=runner)
        return
    run_batch(cfg, run=rid("read", run="r2"), ledger=ledger, broker=client, runner=runner)
    live = [(r.start, r.end, r.status) for r in ledger.ranges(PIPELINE) if r.status != RangeStatus.FAILED]
    if len(live) == 2:  # retention took the record left for r2 before r2 read it (a busy machine): r2
        _padded(client, s, sent, 1)  # recorded everything lost up to the tail; one more for r3 to read
        sent += 1
        run_batch(cfg, run=rid("read", run="r3"), ledger=ledger, broker=client, runner=runner)
        live = [(r.start, r.end, r.status) for r in ledger.ranges(PIPELINE) if r.status != RangeStatus.FAILED]
    # Retention deletes segments asynchronously: it may have gone on after ``first`` was read.
    assert live[0][:2] == (0, 40) and live[1][0] == 40 and live[1][2] == RangeStatus.LOST, live
    assert live[1][1] >= first and [r[2] for r in live[2:]] == [RangeStatus.COMMITTED], (live, first)
    ids = sorted(int(b[: len(body(s, 0))].split(b"#")[1]) for b in committed_bodies(ledger, PIPELINE))
    head, rest = ids[:40], ids[40:]
    assert head == list(range(40)) and rest and rest == list(range(rest[0], sent)), ids
    stored = client.query_offset(s, PIPELINE)
    assert stored is not None and stored >= first, (stored, first)
    report = ledger.audit(PIPELINE, broker=client)
    assert report.clean, report.to_text()


def test_a_delta_range_whose_publish_keeps_failing_is_a_finding_until_published(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """C: a Delta pipeline named ``orders v2`` whose table location turns into a plain file after
    the ledger commit: the publish fails, and so does every later run. The committed range is never
    published, so the audit is never CLEAN; once the location is usable the next run publishes the
    range from its staging copy (no second read) and the audit is CLEAN."""
    ledger = any_ledger
    s = stream_name("ret-c")
    create_stream(rabbitmq_url, s, 30)
    name = "orders v2"
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=name, sink="delta")
    spot: dict[str, Path] = {}

    def spoil(step: str, batch: Any) -> None:
        if step == "committed":
            spot["table"] = Path(batch.sink.location)
            spot["table"].parent.mkdir(parents=True, exist_ok=True)
            spot["table"].write_text("not a table")

    with pytest.raises(Exception):  # noqa: B017 - whatever the sink raises, the range stays committed
        run_batch(cfg, run=rid("read", run="r1"), ledger=ledger, broker=client, runner=runner, on_step=spoil)
    (rng,) = ledger.ranges(name)
    assert rng.status == RangeStatus.COMMITTED and rng.published_at is None, rng
    for attempt in (2, 3):
        report = ledger.audit(name, broker=client)
        assert not report.clean, report.to_text()
        assert "unpublished" in report.to_text(), report.to_text()
        with pytest.raises(Exception):  # noqa: B017
            run_batch(cfg, run=rid("read", run=f"r{attempt}"), ledger=ledger, broker=client, runner=runner)
    report = ledger.audit(name, broker=client)
    assert not report.clean, report.to_text()
    spot["table"].unlink()
    reads = runner.calls
    run_batch(cfg, run=rid("read", run="r4"), ledger=ledger, broker=client, runner=runner)
    assert runner.calls == reads
    assert client.query_offset(s, name) is not None
    report = ledger.audit(name, broker=client)
    assert report.clean, report.to_text()


def test_a_failed_range_of_a_retired_epoch_is_recorded_lost_by_the_new_epoch(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """B (model checker, seed 507): with on_data_loss='fail', a range [0, 40) fails (retention took
    it) and is never redone; the stream is deleted and re-created, then `ledger new-epoch`. Nobody
    can ever read the old stream's offsets again, yet the retired history kept the failed range, so
    the audit reported `failed_not_retried` for ever on a pipeline whose every record on the new
    stream is read once. The new epoch records what the old stream's history never read as lost
    (never silent: the reason names the re-created stream): the failed [0, 40) and the rest of
    what the batch saw the old stream hold, up to its tail."""
    ledger = any_ledger
    s = stream_name("ret-b")
    create_stream(rabbitmq_url, s, 0, max_length_bytes=60_000, max_segment_size_bytes=15_000)
    publish(rabbitmq_url, s, 49, batch_size=10)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPELINE, max_offsets=40, initial_position="first")
    runner.die = RuntimeError("executor lost")
    with pytest.raises(RuntimeError, match="executor lost"):
        run_batch(cfg, run=rid("read", run="r1"), ledger=ledger, broker=client, runner=runner)
    _retain_past(client, s, 40, 49)
    with pytest.raises(BatchError, match=r"must read \[0, 40\) but retention removed everything below"):
        run_batch(cfg, run=rid("read", run="r1", try_number=2), ledger=ledger, broker=client, runner=runner)
    tail = client.committed_tail(s)  # all the old stream held, none of it read (audit rule 10)
    client.delete_stream(s)
    create_stream(rabbitmq_url, s, 0, max_length_bytes=60_000, max_segment_size_bytes=15_000)
    (old,) = {r.source for r in ledger.ranges(PIPELINE)}
    ledger.new_epoch(PIPELINE, old, reason="re-created")
    publish(rabbitmq_url, s, 60, batch_size=10)
    for n in range(3):
        run_batch(cfg, run=rid("read", run=f"d{n}"), ledger=ledger, broker=client, runner=runner)
    ids = sorted(int(b.split(b"#")[1]) for b in committed_bodies(ledger, PIPELINE))
    assert ids == list(range(60)), ids
    report = ledger.audit(PIPELINE, broker=client)
    assert report.clean, report.to_text()
    retired = [(r.start, r.end, r.status) for r in ledger.ranges(PIPELINE)
               if r.source.broker != old.broker and r.status != RangeStatus.FAILED]
    assert retired == [(0, tail, RangeStatus.LOST)], retired


def test_a_recreated_stream_that_rolled_an_older_fingerprint_out_is_refused(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """D (the model checker's PostgreSQL seed 2000): r1 commits [0, 20) and fingerprints its chunk;
    r2 commits the next 200 records. The stream is deleted and re-created, and grows until retention has taken
    r1's chunk but not r2's last one. A batch must refuse it as another stream: the fingerprint of r2's commit
    (the newest) tells, where the only fingerprint r1 took has rolled out with nothing to compare.
    Before the fix the batch read on from 50, the new stream's first records never read, the old
    watermark stored, audit CLEAN."""
    from streamledger.batch import StreamReplaced

    ledger = any_ledger
    s = stream_name("ret-fp")
    # r2's range is long and the new stream keeps ~1 MB, so retention's cut (whole segments, applied
    # lazily) lands well inside it: r1's chunk gone, r2's last one still retained.
    settings = {"max_length_bytes": 1_000_000, "max_segment_size_bytes": 15_000}
    create_stream(rabbitmq_url, s, 0, **settings)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPELINE, on_data_loss="record")
    publish(rabbitmq_url, s, 20, batch_size=10)
    run_batch(cfg, run=rid("read", run="r1"), ledger=ledger, broker=client, runner=runner)
    publish(rabbitmq_url, s, 200, start=20, batch_size=10)
    run_batch(cfg, run=rid("read", run="r2"), ledger=ledger, broker=client, runner=runner)
    last = client.query_offset(s, PIPELINE)  # r2's last record (the tracking chunks take offsets too)
    assert last is not None and last >= 219

    client.delete_stream(s)
    client.create_stream(s, **settings)
    sent = 0
    while client.first_offset(s) <= 20 and sent < 5_000:
        client.publish(s, [body(s, 1000 + i) + PAD for i in range(sent, sent + 10)], batch_size=10)
        sent += 10
    first, tail = client.first_offset(s), client.committed_tail(s)
    assert 20 < first <= last < tail, (first, last, tail)  # r1's chunk gone, r2's last one retained

    with pytest.raises(StreamReplaced, match="this is not the stream pipeline"):
        run_batch(cfg, run=rid("read", run="r3"), ledger=ledger, broker=client, runner=runner)
    assert client.query_offset(s, PIPELINE) is None  # the old watermark was not stored on it


def test_a_stream_refused_as_recreated_stays_refused_once_its_fingerprint_rolled_out(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """E (the model checker's SQLite seed 3000): r1 commits [0, 20); the stream is re-created and
    r2 refuses it (its tail 5 is below the ledger's end 20). Before anyone runs `new-epoch` the new
    stream grows past 20 and retention rolls out the chunk r1 fingerprinted: no sign is left, and
    r3 read the new stream on from the old end, its first records never read, audit CLEAN. Once a
    batch has seen the broker hold another stream the ledger remembers it: every later batch
    refuses until `new-epoch`."""
    from streamledger.batch import StreamReplaced

    ledger = any_ledger
    s = stream_name("ret-e")
    settings = {"max_length_bytes": 60_000, "max_segment_size_bytes": 15_000}
    create_stream(rabbitmq_url, s, 0, **settings)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPELINE, on_data_loss="record")
    publish(rabbitmq_url, s, 20, batch_size=10)
    run_batch(cfg, run=rid("read", run="r1"), ledger=ledger, broker=client, runner=runner)
    client.delete_stream(s)
    client.create_stream(s, **settings)
    _padded(client, s, 1000, 5)
    with pytest.raises(StreamReplaced, match="below the ledger's end"):
        run_batch(cfg, run=rid("read", run="r2"), ledger=ledger, broker=client, runner=runner)
    _retain_past(client, s, 20, 5)
    before = ledger.ranges(PIPELINE)
    with pytest.raises(StreamReplaced, match="this is not the stream pipeline") as refused:
        run_batch(cfg, run=rid("read", run="r3"), ledger=ledger, broker=client, runner=runner)
    assert "\n" not in str(refused.value) and "new-epoch" in str(refused.value)
    assert ledger.ranges(PIPELINE) == before
    assert client.query_offset(s, PIPELINE) is None
    [src] = {r.source for r in before}
    ledger.new_epoch(PIPELINE, src, reason="re-created")
    run_batch(cfg, run=rid("read", run="r4"), ledger=ledger, broker=client, runner=runner)
    report = ledger.audit(PIPELINE, broker=client)
    assert report.clean, report.to_text()
