"""Issue 30, defects 1, 2 and 5: where pinned intervals, retention, the history's origin and
concurrent publishes meet, against the real RabbitMQ broker, local Spark and both ledgers.

1. a failed interval whose retry works out a narrower span (retention took its head) must get back
   exactly the span its failed claim held: the head is read, or recorded lost per ``on_data_loss``;
2. the offsets between the history's origin and the first interval that ran are a finding until
   some run reads them or they are recorded as deliberately skipped;
5. two batches of one pipeline publishing each other's committed ranges lock them in one order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, text

from streamledger.batch import BatchConfig, BatchError, run_batch
from streamledger.cli import main
from streamledger.ledger import Ledger, RangeStatus, ViolationKind
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPELINE = "p-seams"


def _now() -> datetime:
    return datetime.now(UTC)


def _interval(url: str, root: Path, stream: str, start: datetime, end: datetime, **kw: Any) -> BatchConfig:
    return BatchConfig(pipeline=PIPELINE, url=url, output_root=str(root), stream=stream,
                       interval_start=start, interval_end=end, bound_by_interval=True, interval_grace=5.0,
                       **kw)


def _spans(ledger: Ledger) -> list[tuple[int, int, str]]:
    return [(r.start, r.end, r.status.value) for r in ledger.ranges(PIPELINE)]


def test_a_failed_interval_whose_head_retention_took_is_retried_with_its_whole_span(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Defect 1: interval i1 claims [0, 150) and fails; retention then drops its head. The retry
    works its span out again from chunk timestamps ([first, 150)), but must get its failed claim's
    span back: with on_data_loss='fail' it fails naming retention, with 'record' it records the
    head lost and reads the rest. Nothing of [0, first) is ever silently left out."""
    ledger = any_ledger
    s = stream_name("seam1")
    create_stream(rabbitmq_url, s, 0, max_length_bytes=40_000, max_segment_size_bytes=6_000)
    t0 = _now()
    time.sleep(0.3)
    publish(rabbitmq_url, s, 150, batch_size=10)
    time.sleep(0.6)
    t1 = _now()
    time.sleep(0.6)
    publish(rabbitmq_url, s, 5, start=150, batch_size=5)  # stamped after t1: i1's end is resolvable
    fail = _interval(rabbitmq_url, tmp_path, s, t0, t1)  # on_data_loss="fail" is the default
    runner.die = RuntimeError("executor lost")
    with pytest.raises(RuntimeError, match="executor lost"):
        run_batch(fail, run=rid("read", run="i1"), ledger=ledger, broker=client, runner=runner)
    assert _spans(ledger) == [(0, 150, "failed")]

    sent = 155
    while client.first_offset(s) == 0 and sent < 900:  # retention drops i1's head, segment by segment
        publish(rabbitmq_url, s, 10, start=sent, batch_size=10)
        sent += 10
    first = client.first_offset(s)
    assert 0 < first < 150, f"retention should have cut inside i1, first offset {first}"

    with pytest.raises(BatchError, match=rf"retention removed everything below {first}"):
        run_batch(fail, run=rid("read", run="i1", try_number=2), ledger=ledger, broker=client, runner=runner)
    assert not [r for r in ledger.ranges(PIPELINE) if r.status == RangeStatus.COMMITTED and not r.empty], \
        _spans(ledger)
    report = ledger.audit(PIPELINE, broker=client)
    assert not report.clean, report.to_text()

    record = _interval(rabbitmq_url, tmp_path, s, t0, t1, on_data_loss="record")
    run_batch(record, run=rid("read", run="i1", try_number=3), ledger=ledger, broker=client, runner=runner)
    live = [(a, b, st) for a, b, st in _spans(ledger) if st != "failed"]
    assert live == [(0, first, "lost"), (first, 150, "committed")], _spans(ledger)
    assert sorted(committed_bodies(ledger, PIPELINE)) == sorted(body(s, i) for i in range(first, 150))
    assert client.query_offset(s, PIPELINE) == 149
    report = ledger.audit(PIPELINE, broker=client)
    assert report.clean, report.to_text()


def test_the_offsets_before_the_first_interval_that_ran_are_a_finding_until_skipped(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Defect 2: origin t0, but the first run is the second interval's (i1's never claims: it failed
    before claiming, or the DAG does not catch up). The 30 records of i1 are never read; the audit
    must say so (a note while the next range is young, a violation once older than stale_after),
    until they are read or recorded as deliberately skipped (``streamledger ledger skip``)."""
    ledger = any_ledger
    s = stream_name("seam2")
    create_stream(rabbitmq_url, s)
    t0 = _now()
    time.sleep(0.3)
    publish(rabbitmq_url, s, 30, batch_size=10)
    time.sleep(0.6)
    t1 = _now()
    time.sleep(0.6)
    publish(rabbitmq_url, s, 30, start=30, batch_size=10)
    time.sleep(0.6)
    t2 = _now()
    time.sleep(0.6)
    publish(rabbitmq_url, s, 5, start=60, batch_size=5)
    i2 = _interval(rabbitmq_url, tmp_path, s, t1, t2, origin=t0)
    run_batch(i2, run=rid("read", run="i2"), ledger=ledger, broker=client, runner=runner)
    assert [(a, b) for a, b, st in _spans(ledger) if st == "committed"] == [(0, 0), (30, 60)]
    assert client.query_offset(s, PIPELINE) is None  # the watermark stops at the origin's gap

    young = ledger.audit(PIPELINE, broker=client)
    assert [(v.kind, v.start, v.end) for v in young.notes if v.kind == ViolationKind.GAP] == [
        (ViolationKind.GAP, 0, 30)], young.to_text()
    url = str(ledger.engine.url.render_as_string(hide_password=False))
    rc = main(["ledger", "audit", "--db", url, "--pipeline", PIPELINE, "--stale-after", "0", "--no-outputs"])
    out = capsys.readouterr().out
    assert rc == 1 and "gap" in out and "[0, 30)" in out, out

    broker = next(r.source.broker for r in ledger.ranges(PIPELINE))
    rc = main(["ledger", "skip", "--db", url, "--pipeline", PIPELINE, "--stream", s, "--broker", broker,
               "--start", "0", "--end", "30", "--reason", "the DAG does not catch up"])
    out = capsys.readouterr().out
    assert rc == 0 and "[0, 30)" in out, out
    (skipped,) = [r for r in ledger.ranges(PIPELINE) if r.skipped]
    assert (skipped.start, skipped.end, skipped.status) == (0, 30, RangeStatus.LOST)
    # A rerun of i2 finds its range done and stores the offset the skip let the watermark reach.
    run_batch(i2, run=rid("read", run="manual-i2"), ledger=ledger, broker=client, runner=runner)
    assert client.query_offset(s, PIPELINE) == 59
    report = ledger.audit(PIPELINE, broker=client, stale_after=timedelta(0))
    assert report.clean, report.to_text()
    assert [(v.kind, v.start, v.end) for v in report.notes if v.kind == ViolationKind.SKIPPED] == [
        (ViolationKind.SKIPPED, 0, 30)], report.to_text()
    assert sorted(committed_bodies(ledger, PIPELINE)) == sorted(body(s, i) for i in range(30, 60))
    # A span some range covers cannot be skipped: one line, nothing recorded.
    rc = main(["ledger", "skip", "--db", url, "--pipeline", PIPELINE, "--stream", s, "--broker", broker,
               "--start", "40", "--end", "70", "--reason", "x"])
    err = capsys.readouterr().err
    assert rc != 0 and "[40, 70)" in err and len(err.strip().splitlines()) == 1, err
    assert len([r for r in ledger.ranges(PIPELINE) if r.skipped]) == 1


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    with Ledger(postgres_url, create=True):
        pass
    yield postgres_url


def test_two_batches_publishing_each_others_ranges_do_not_deadlock(
    pg_url: str, runner: CountingRunner, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
) -> None:
    """Defect 5 (PostgreSQL): batches A and B of one pipeline claim adjacent ranges, read and commit
    them, and meet at a barrier; each then publishes its own range and the other's (committed, not
    published yet: stranded, as far as it can tell). Locked in request order, each holds its own
    and waits for the other's: "deadlock detected". Locked in one global order, both succeed.

    To make the interleaving certain rather than likely, the test holds both rows locked (a plain
    ``SELECT ... FOR UPDATE`` of its own) while the two batches start publishing, waits until both
    wait for a row lock, and lets go of both at once."""
    s = stream_name("seam5")
    create_stream(rabbitmq_url, s, 100)
    committed, go = threading.Barrier(3, timeout=180), threading.Barrier(3, timeout=180)
    claimed = threading.Event()
    errors: dict[str, BaseException] = {}

    def step(name: str, _batch: Any) -> None:
        if name == "claimed":
            claimed.set()
        if name == "committed":
            committed.wait()
            go.wait()

    def one(task: str) -> None:
        try:
            with Ledger(pg_url) as ledger, StreamClient.connect(rabbitmq_url) as client:
                run_batch(config(rabbitmq_url, tmp_path, s, pipeline=PIPELINE, max_offsets=50),
                          run=rid(task), ledger=ledger, broker=client, runner=runner, on_step=step)
        except BaseException as exc:  # reported below, with the other thread's
            errors[task] = exc
            committed.abort()
            go.abort()

    a = threading.Thread(target=one, args=("task-a",))
    a.start()
    assert claimed.wait(120)  # A holds [0, 50) before B claims: B gets [50, 100)
    b = threading.Thread(target=one, args=("task-b",))
    b.start()
    with Ledger(pg_url) as ledger:
        committed.wait()
        ids = [r.id for r in ledger.ranges(PIPELINE) if not r.empty]
        assert len(ids) == 2
        with ledger.engine.connect() as conn:
            tx = conn.begin()
            conn.execute(text("SELECT id FROM streamledger_range WHERE id IN :ids FOR UPDATE")
                         .bindparams(bindparam("ids", expanding=True)), {"ids": ids})
            go.wait()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")).scalar_one() < 2:
                time.sleep(0.05)
            tx.rollback()  # both batches get their first row at once
    a.join(240)
    b.join(240)
    assert not errors, {k: f"{type(v).__name__}: {v}" for k, v in errors.items()}
    with Ledger(pg_url) as ledger:
        rows = [(r.start, r.end, r.status.value, r.published_at is not None) for r in ledger.ranges(PIPELINE)]
        assert rows == [(0, 50, "committed", True), (50, 100, "committed", True)], rows
        assert sorted(committed_bodies(ledger, PIPELINE)) == sorted(body(s, i) for i in range(100))
        report = ledger.audit(PIPELINE)
    assert report.clean, report.to_text()
