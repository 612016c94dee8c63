"""Where pinned intervals meet retention on a new stream, against the real RabbitMQ broker, local
Spark and both ledgers: offsets of a pinned history that retention took before any interval claimed
them are data loss, decided by ``on_data_loss`` (a failed batch naming them, or recorded ``lost``),
never a ``gap`` left for ``ledger skip``."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, BatchError, run_batch
from streamledger.ledger import Ledger, RangeStatus, ViolationKind
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, committed_bodies, rid, split_pinned_span
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPELINE = "p-pinned-loss"


def _interval(url: str, root: Path, stream: str, start: datetime, end: datetime, **kw: Any) -> BatchConfig:
    return BatchConfig(pipeline=PIPELINE, url=url, output_root=str(root), stream=stream,
                       interval_start=start, interval_end=end, bound_by_interval=True, interval_grace=5.0,
                       **kw)


def _spans(ledger: Ledger) -> list[tuple[int, int, str]]:
    return [(r.start, r.end, r.status.value) for r in ledger.ranges(PIPELINE)]


def _head_taken(client: StreamClient, url: str, s: str) -> tuple[datetime, datetime, datetime, int, int]:
    """Interval i1 [t0, t1) holds offsets [0, 150); i2 [t1, t2) the records published after, which
    push retention into i1 (never past it); a record after t2 makes i2's end resolvable. Returns
    the times, the first offset retention left and where i2 begins."""
    t0 = datetime.now(UTC)
    time.sleep(0.3)
    publish(url, s, 150, batch_size=10)
    time.sleep(0.6)
    t1 = datetime.now(UTC)
    time.sleep(0.6)
    sent = 150
    while client.first_offset(s) == 0 and sent < 900:
        publish(url, s, 10, start=sent, batch_size=10)
        sent += 10
    first = client.first_offset(s)
    assert 0 < first < 150, f"retention should have cut inside i1, first offset {first}"
    time.sleep(0.6)
    t2 = datetime.now(UTC)
    time.sleep(0.6)
    publish(url, s, 5, start=sent, batch_size=5)
    return t0, t1, t2, first, sent


@pytest.mark.parametrize("on_data_loss", ["fail", "record"])
def test_retention_taking_a_new_pinned_streams_head_before_any_claim_is_data_loss(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, on_data_loss: str,
) -> None:
    """A pinned pipeline whose history begins at origin t0 on a fresh stream; retention takes
    [0, first) before any interval runs, then i2 runs first. Before, i2 committed its range behind
    an origin marker at 0 and [0, first) became a `gap` for `ledger skip`, whatever on_data_loss
    said. Now with 'fail' the batch fails in one line naming the stream, the lost offsets and
    retention, and nothing is claimed; with 'record' [0, first) is recorded lost, i1 reads the rest
    later, audit CLEAN."""
    ledger = any_ledger
    s = stream_name("pinloss")
    create_stream(rabbitmq_url, s, 0, max_length_bytes=40_000, max_segment_size_bytes=6_000)
    t0, t1, t2, first, sent = _head_taken(client, rabbitmq_url, s)
    # the history begins at the origin (not at the first offset retention left, as "first" would)
    i2 = _interval(rabbitmq_url, tmp_path, s, t1, t2, origin=t0, on_data_loss=on_data_loss,
                   initial_position="interval_start")

    if on_data_loss == "fail":
        with pytest.raises(BatchError) as info:
            run_batch(i2, run=rid("read", run="i2"), ledger=ledger, broker=client, runner=runner)
        msg = str(info.value)
        assert "\n" not in msg and repr(s) in msg and f"[0, {first})" in msg and "retention" in msg, msg
        assert _spans(ledger) == [(0, first, "failed")], _spans(ledger)  # nothing claimed: a refusal
        assert runner.calls == 0
        report = ledger.audit(PIPELINE, broker=client)
        assert [(v.kind, v.start, v.end) for v in report.violations] == [
            (ViolationKind.FAILED_NOT_RETRIED, 0, first)], report.to_text()
        with pytest.raises(BatchError, match=rf"never read \[0, {first}\)"):  # every run, until decided
            run_batch(i2, run=rid("read", run="i2", try_number=2), ledger=ledger, broker=client,
                      runner=runner)
        assert _spans(ledger) == [(0, first, "failed")], _spans(ledger)
        # the user decides: the loss recorded (on_data_loss='record'), then the audit is CLEAN
        record = _interval(rabbitmq_url, tmp_path, s, t1, t2, origin=t0, on_data_loss="record",
                           initial_position="interval_start")
        run_batch(record, run=rid("read", run="i2", try_number=3), ledger=ledger, broker=client,
                  runner=runner)
        live = [(a, b, st) for a, b, st in _spans(ledger) if st != "failed" and a < b]
        assert live == [(0, first, "lost"), (150, sent, "committed")], _spans(ledger)
        return

    run_batch(i2, run=rid("read", run="i2"), ledger=ledger, broker=client, runner=runner)
    live = [(a, b, st) for a, b, st in _spans(ledger) if st != "failed" and a < b]
    assert live == [(0, first, "lost"), (150, sent, "committed")], _spans(ledger)
    i1 = _interval(rabbitmq_url, tmp_path, s, t0, t1, origin=t0, on_data_loss=on_data_loss,
                   initial_position="interval_start")
    run_batch(i1, run=rid("read", run="i1"), ledger=ledger, broker=client, runner=runner)
    live = [(a, b, st) for a, b, st in _spans(ledger) if st != "failed" and a < b]
    assert live == [(0, first, "lost"), (first, 150, "committed"), (150, sent, "committed")], _spans(ledger)
    assert sorted(committed_bodies(ledger, PIPELINE)) == sorted(body(s, i) for i in range(first, sent))
    assert client.query_offset(s, PIPELINE) == sent - 1
    report = ledger.audit(PIPELINE, broker=client, stale_after=timedelta(0))
    assert report.clean, report.to_text()
    assert not report.of_kind(ViolationKind.GAP)
    lost = [r for r in ledger.ranges(PIPELINE) if r.status == RangeStatus.LOST]
    assert len(lost) == 1 and "retention" in (lost[0].error or ""), lost


def test_an_interval_retried_after_a_narrower_run_split_its_span_reads_both_pieces(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Interval i1 claims [0, 150) and fails; a run of the narrower interval [ta, tb) inside it
    commits [50, 100). What i1's failed claim held and nothing covers is two pieces: its retry must
    read both, [0, 50) and [100, 150) (before, only the lower one: [100, 150) stayed a gap for ever
    and the broker offset stopped at 49)."""
    ledger = any_ledger
    s = stream_name("pieces")
    create_stream(rabbitmq_url, s)
    t0, t1 = split_pinned_span(PIPELINE, rabbitmq_url, tmp_path, s, ledger, client, runner)
    i1 = _interval(rabbitmq_url, tmp_path, s, t0, t1, initial_position="interval_start")
    assert [(a, b, st) for a, b, st in _spans(ledger) if a < b] == [
        (0, 150, "failed"), (50, 100, "committed")], _spans(ledger)

    got = run_batch(i1, run=rid("read", run="i1", try_number=2), ledger=ledger, broker=client, runner=runner)
    live = [(a, b, st) for a, b, st in _spans(ledger) if st != "failed" and a < b]
    assert live == [(0, 50, "committed"), (50, 100, "committed"), (100, 150, "committed")], _spans(ledger)
    assert got.records == 100, got.to_dict()
    # what XCom, Dagster's metadata and asset events report: both pieces (before: {s: [100, 150]} only)
    assert got.ranges() == {s: [0, 50, 100, 150]}, got.to_dict()
    assert got.to_dict()["ranges"] == {s: [0, 50, 100, 150]}
    assert sorted(committed_bodies(ledger, PIPELINE)) == sorted(body(s, i) for i in range(150))
    assert client.query_offset(s, PIPELINE) == 149
    report = ledger.audit(PIPELINE, broker=client, stale_after=timedelta(0))
    assert report.clean, report.to_text()
    # a rerun of the interval is idempotent: nothing read again
    calls = runner.calls
    run_batch(i1, run=rid("read", run="i1", try_number=3), ledger=ledger, broker=client, runner=runner)
    assert runner.calls == calls
