"""Issue 10: the exactly-once promise of ``run_batch`` under failures, against the real RabbitMQ 4.3
broker, local Spark and real ledgers (SQLite; PostgreSQL where the bug lives in the claim).

A *kill* is a ``BaseException`` raised inside the batch (by the runner or the broker call it is
in): nothing of the batch's own clean-up runs, exactly like SIGKILL of the task process. Each test
names the issue item it proves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, BatchError, run_batch
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, KillAtStore, Killed, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)


def test_stored_offset_never_passes_a_claim_whose_holder_was_killed(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 1 (watermark): A is killed holding [0, 50); B commits [50, 100) and must not store 99."""
    s = stream_name("wm")
    create_stream(rabbitmq_url, s, 100)
    ledger = any_ledger
    a = config(rabbitmq_url, tmp_path, s, max_offsets=50)
    runner.die = Killed("SIGKILL during the read")
    with pytest.raises(Killed):
        run_batch(a, run=rid("task-a"), ledger=ledger, broker=client, runner=runner)
    run_batch(config(rabbitmq_url, tmp_path, s), run=rid("task-b"), ledger=ledger, broker=client,
              runner=runner)
    stored = client.query_offset(s, "p-exactly-once")
    assert stored is None, f"the broker's stored offset {stored} passes [0, 50), which nobody committed"
    # A's retry commits its range: now the whole prefix is done and the offset covers it.
    run_batch(a, run=rid("task-a", try_number=2), ledger=ledger, broker=client, runner=runner)
    assert client.query_offset(s, "p-exactly-once") == 99
    assert sorted(committed_bodies(ledger, "p-exactly-once")) == sorted(
        body(s, i) for i in range(100)
    )
    assert ledger.audit("p-exactly-once", broker=client).clean


def test_a_retry_after_commit_never_touches_the_committed_output(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 2 (atomic outputs): killed between commit and StoreOffset, then a retry whose job dies
    mid-write: the committed range's directory stays complete and readable."""
    s = stream_name("atomic")
    create_stream(rabbitmq_url, s, 40)
    broker = KillAtStore(client)
    broker.kill = True
    cfg = config(rabbitmq_url, tmp_path, s)
    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=broker, runner=runner)
    (done,) = ledger.ranges("p-exactly-once")
    assert done.status == RangeStatus.COMMITTED and done.records == 40
    before = sorted(committed_bodies(ledger, "p-exactly-once"))
    runner.die_mid_write = True
    try:
        run_batch(cfg, run=rid("t", try_number=2), ledger=ledger, broker=broker, runner=runner)
    except (BatchError, RuntimeError):
        pass
    assert sorted(committed_bodies(ledger, "p-exactly-once")) == before
    runner.die_mid_write = False
    run_batch(cfg, run=rid("t", try_number=3), ledger=ledger, broker=broker, runner=runner)
    assert client.query_offset(s, "p-exactly-once") == 39
    assert ledger.audit("p-exactly-once", broker=client).clean


def test_an_idle_pipeline_writes_nothing_to_the_stream_and_starts_no_job(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 3 (idle stays idle): after the data is done, runs start no job and add no offsets."""
    s = stream_name("idle")
    create_stream(rabbitmq_url, s, 25)
    cfg = config(rabbitmq_url, tmp_path, s)
    run_batch(cfg, run=rid("t", "r1"), ledger=ledger, broker=client, runner=runner)
    assert client.query_offset(s, "p-exactly-once") == 24
    jobs, tail = runner.calls, client.committed_tail(s)
    for n in range(2, 5):
        run_batch(cfg, run=rid("t", f"r{n}"), ledger=ledger, broker=client, runner=runner)
    assert runner.calls == jobs, "an idle run started a Spark job"
    assert client.committed_tail(s) <= tail + 1, "idle runs keep writing tracking chunks to the stream"
    assert client.query_offset(s, "p-exactly-once") == 24
    tail = client.committed_tail(s)
    run_batch(cfg, run=rid("t", "r9"), ledger=ledger, broker=client, runner=runner)
    assert client.committed_tail(s) == tail
    assert ledger.audit("p-exactly-once", broker=client).clean


def test_record_loss_works_on_a_retry_of_a_failed_range(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 4: on_data_loss='record' also when retention removed the start of a range being retried."""
    s = stream_name("loss")
    create_stream(rabbitmq_url, s, 0, max_length_bytes=60_000, max_segment_size_bytes=15_000)
    publish(rabbitmq_url, s, 300, batch_size=100)
    cfg = config(rabbitmq_url, tmp_path, s, on_data_loss="record")
    runner.die = RuntimeError("the first attempt fails")
    with pytest.raises(RuntimeError):
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    for i in range(1, 7):
        publish(rabbitmq_url, s, 500, start=300 + 500 * (i - 1), batch_size=100)
    deadline = time.monotonic() + 30
    while client.first_offset(s) < 300 and time.monotonic() < deadline:
        time.sleep(0.25)
    first = client.first_offset(s)
    assert first >= 300, first
    result = run_batch(cfg, run=rid("t", try_number=2), ledger=ledger, broker=client, runner=runner)
    statuses = [(r.start, r.end, r.status.value) for r in ledger.ranges("p-exactly-once")
                if r.status != RangeStatus.FAILED]
    assert statuses[0][:1] == (0,) and statuses[0][2] == "lost", statuses
    assert result.partitions[0].status in ("committed", "empty")
    run_batch(cfg, run=rid("t2"), ledger=ledger, broker=client, runner=runner)
    report = ledger.audit("p-exactly-once", broker=client)
    assert report.clean, report.to_text()


def test_pipeline_names_over_255_bytes_are_refused_before_anything_runs(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 6: the broker's reference is 255 bytes; 128 'é' are 256 bytes but only 128 characters."""
    s = stream_name("name")
    create_stream(rabbitmq_url, s, 5)
    with pytest.raises(BatchError, match="256 bytes"):
        config(rabbitmq_url, tmp_path, s, pipeline="é" * 128)
    longest = "é" * 127 + "x"  # 255 bytes: the broker takes it
    run_batch(config(rabbitmq_url, tmp_path, s, pipeline=longest), run=rid("t"), ledger=ledger,
              broker=client, runner=runner)
    assert client.query_offset(s, longest) == 4


def test_one_history_whichever_address_names_the_broker(
    ledger: Ledger, runner: CountingRunner, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
) -> None:
    """Item 8: 127.0.0.1 and localhost are the same broker: one source, no overlap."""
    s = stream_name("ident")
    create_stream(rabbitmq_url, s, 10)
    other = rabbitmq_url.replace("127.0.0.1", "localhost")
    assert other != rabbitmq_url
    with StreamClient.connect(rabbitmq_url) as c:
        run_batch(config(rabbitmq_url, tmp_path, s), run=rid("t", "r1"), ledger=ledger, broker=c,
                  runner=runner)
    publish(rabbitmq_url, s, 10, start=10)
    with StreamClient.connect(other) as c:
        run_batch(config(other, tmp_path, s), run=rid("t", "r2"), ledger=ledger, broker=c, runner=runner)
    rows = [r for r in ledger.ranges("p-exactly-once") if not r.empty]
    assert len({r.source.broker for r in rows}) == 1, [r.source.broker for r in rows]
    assert (rows[0].start, rows[0].end) == (0, 10)
    assert rows[-1].end >= 20 and rows[-1].start == 10


def test_a_failed_range_is_redone_by_the_next_run_instead_of_blocking_it(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 9: after a run's retries are spent its range is a hole; later runs fill it, then go on."""
    s = stream_name("hole")
    create_stream(rabbitmq_url, s, 30)
    cfg = config(rabbitmq_url, tmp_path, s)
    runner.die = RuntimeError("retries spent")
    with pytest.raises(RuntimeError):
        run_batch(cfg, run=rid("t", "r1"), ledger=any_ledger, broker=client, runner=runner)
    publish(rabbitmq_url, s, 30, start=30)
    run_batch(cfg, run=rid("t", "r2"), ledger=any_ledger, broker=client, runner=runner)
    run_batch(cfg, run=rid("t", "r3"), ledger=any_ledger, broker=client, runner=runner)
    assert sorted(committed_bodies(any_ledger, "p-exactly-once")) == sorted(
        body(s, i) for i in range(60)
    )
    report = any_ledger.audit("p-exactly-once", broker=client)
    assert report.clean, report.to_text()


def test_a_long_job_keeps_its_claim_alive(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 10: the claim beats while the job runs, so releasing stale claims leaves it alone."""
    s = stream_name("beat")
    create_stream(rabbitmq_url, s, 10)
    cfg = config(rabbitmq_url, tmp_path, s, heartbeat_interval=0.3)
    released: list[Any] = []
    real = runner.inner

    def slow(**kwargs: Any) -> Mapping[str, Any]:
        time.sleep(2.5)
        released.extend(ledger.release_stale(timedelta(seconds=1)))
        return real(**kwargs)

    runner.inner = slow  # type: ignore[assignment]
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    assert released == [], "a claim whose job was still running was released as stale"
    (r,) = ledger.ranges("p-exactly-once")
    assert r.status == RangeStatus.COMMITTED


def test_max_offsets_is_named_for_what_it_caps(rabbitmq_url: str, tmp_path: Path) -> None:
    """Item 11: the cap counts offsets (tracking chunks take offsets too), and says so."""
    cfg = BatchConfig(pipeline="p", url=rabbitmq_url, output_root=str(tmp_path), stream="s", max_offsets=100)
    assert cfg.max_offsets == 100
    with pytest.warns(DeprecationWarning, match="max_records counts offsets"):
        old = BatchConfig(pipeline="p", url=rabbitmq_url, output_root=str(tmp_path), stream="s",
                          max_records=7)
    assert old.max_offsets == 7
