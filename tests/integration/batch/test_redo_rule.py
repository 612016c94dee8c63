"""The claim rule's redo step through the public API (run_batch against RabbitMQ, local Spark, both
ledgers): what a failed claim held and a later range covers only in part is claimed again, never
left a gap for ever (tests/unit/ledger/test_redo_rule.py has the ledger alone)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, run_batch
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, committed_bodies, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPELINE = "p-redo"


def _interval(url: str, root: Path, stream: str, start: datetime, end: datetime, **kw: Any) -> BatchConfig:
    return BatchConfig(pipeline=PIPELINE, url=url, output_root=str(root), stream=stream,
                       interval_start=start, interval_end=end, bound_by_interval=True, interval_grace=5.0,
                       on_data_loss="record", **kw)


def _spans(ledger: Ledger) -> list[tuple[int, int, str]]:
    return [(r.start, r.end, r.status.value) for r in ledger.ranges(PIPELINE)]


def test_an_interval_retried_after_a_manual_run_read_its_tail_gets_back_the_head(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Interval i1 claims [0, 150) and fails; retention then takes its head; a manual run of the
    same interval works its span out as [first, 150) and commits it. i1's retry must get back what
    its failed claim held and nothing covers, [0, first): recorded lost (on_data_loss='record'),
    so the history is whole, the broker offset reaches 149 and the audit is clean. Before, the
    retry found the manual run's range done and [0, first) stayed a gap nobody would claim."""
    ledger = any_ledger
    s = stream_name("redo1")
    create_stream(rabbitmq_url, s, 0, max_length_bytes=40_000, max_segment_size_bytes=6_000)
    t0 = datetime.now(UTC)
    time.sleep(0.3)
    publish(rabbitmq_url, s, 150, batch_size=10)
    time.sleep(0.6)
    t1 = datetime.now(UTC)
    time.sleep(0.6)
    publish(rabbitmq_url, s, 5, start=150, batch_size=5)  # stamped after t1: i1's end is resolvable
    i1 = _interval(rabbitmq_url, tmp_path, s, t0, t1)
    runner.die = RuntimeError("executor lost")
    with pytest.raises(RuntimeError, match="executor lost"):
        run_batch(i1, run=rid("read", run="i1"), ledger=ledger, broker=client, runner=runner)
    assert _spans(ledger) == [(0, 150, "failed")]

    sent = 155
    while client.first_offset(s) == 0 and sent < 900:  # retention drops i1's head, segment by segment
        publish(rabbitmq_url, s, 10, start=sent, batch_size=10)
        sent += 10
    first = client.first_offset(s)
    assert 0 < first < 150, f"retention should have cut inside i1, first offset {first}"

    run_batch(i1, run=rid("read", run="manual__i1"), ledger=ledger, broker=client, runner=runner)
    assert [(a, b, st) for a, b, st in _spans(ledger) if st != "failed"] == [(first, 150, "committed")], \
        _spans(ledger)

    run_batch(i1, run=rid("read", run="i1", try_number=2), ledger=ledger, broker=client, runner=runner)
    live = [(a, b, st) for a, b, st in _spans(ledger) if st != "failed" and a < b]
    assert live == [(0, first, "lost"), (first, 150, "committed")], _spans(ledger)
    assert sorted(committed_bodies(ledger, PIPELINE)) == sorted(body(s, i) for i in range(first, 150))
    assert client.query_offset(s, PIPELINE) == 149
    report = ledger.audit(PIPELINE, broker=client, stale_after=timedelta(0))
    assert report.clean, report.to_text()
