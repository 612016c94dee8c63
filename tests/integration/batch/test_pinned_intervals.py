"""Issue 25 item 1: pinned interval ranges, against the real RabbitMQ broker, local Spark and a real
ledger. Runs of three data intervals go out of order (3rd, 1st, 2nd, the 2nd failing once and
retried): each run reads exactly the records whose chunk is stamped inside its interval, every
record is read exactly once, and the broker's stored offset waits at the failed interval's hole.

The measurement of the issue: with parallel runs (``[tail, limit)`` claims) whichever run goes
first takes the data, so a run processes another interval's records.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger.batch import BatchConfig, BatchError, run_batch
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, committed_bodies, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPELINE = "p-pinned"
WAVE = 30


def _now() -> datetime:
    return datetime.now(UTC)


def _utc(ts: Any) -> datetime:
    """A chunk timestamp as Spark wrote it (an instant; read back without a zone) in UTC."""
    moment: datetime = ts.to_pydatetime() if hasattr(ts, "to_pydatetime") else ts
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _interval_config(url: str, root: Path, stream: str, start: datetime, end: datetime) -> BatchConfig:
    return BatchConfig(pipeline=PIPELINE, url=url, output_root=str(root), stream=stream,
                       interval_start=start, interval_end=end, bound_by_interval=True, interval_grace=5.0)


def _stamps_by_run(ledger: Ledger) -> dict[str, list[tuple[int, datetime]]]:
    """(offset, chunk timestamp) of every record in every committed output, by the run that committed it."""
    out: dict[str, list[tuple[int, datetime]]] = {}
    for r in ledger.ranges(PIPELINE):
        if r.status == RangeStatus.COMMITTED and r.records:
            assert r.output is not None
            table = pq.read_table(r.output, columns=["offset", "chunk_timestamp"])
            rows = zip(table.column("offset").to_pylist(), table.column("chunk_timestamp").to_pylist(),
                       strict=True)
            out.setdefault(r.run.run_id, []).extend((o, _utc(ts)) for o, ts in rows)
    return out


def test_out_of_order_interval_runs_each_read_their_own_interval(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("pinned")
    create_stream(rabbitmq_url, s)
    bounds = [_now()]
    time.sleep(0.3)
    for wave in range(3):  # three waves, each inside its own interval (chunk stamps are the broker's clock)
        publish(rabbitmq_url, s, WAVE, start=wave * WAVE, batch_size=10)
        time.sleep(0.6)
        bounds.append(_now())
        time.sleep(0.6)
    publish(rabbitmq_url, s, 5, start=3 * WAVE)  # after the 3rd interval: its end is resolvable now
    intervals = {f"i{n + 1}": (bounds[n], bounds[n + 1]) for n in range(3)}

    def run(name: str, try_number: int = 1) -> Any:
        start, end = intervals[name.removeprefix("manual-")]
        cfg = _interval_config(rabbitmq_url, tmp_path, s, start, end)
        return run_batch(cfg, run=rid("read", run=name, try_number=try_number), ledger=ledger, broker=client,
                         runner=runner)

    run("i3")
    run("i1")
    assert client.query_offset(s, PIPELINE) == WAVE - 1  # interval 2 is not done: the offset waits there
    runner.die = RuntimeError("executor lost")
    with pytest.raises(RuntimeError, match="executor lost"):
        run("i2")
    (failed,) = [r for r in ledger.ranges(PIPELINE) if r.status == RangeStatus.FAILED]
    assert failed.run.run_id == "i2"
    assert client.query_offset(s, PIPELINE) == WAVE - 1  # ... and at its hole
    run("i2", try_number=2)  # its own retry redoes it
    assert client.query_offset(s, PIPELINE) == 3 * WAVE - 1

    stamps = _stamps_by_run(ledger)
    assert sorted(stamps) == ["i1", "i2", "i3"]
    for name, rows in stamps.items():
        start, end = intervals[name]
        outside = [(o, ts.isoformat()) for o, ts in rows if not start <= ts < end]
        assert not outside, (f"run {name} of [{start.isoformat()}, {end.isoformat()}) processed "
                             f"{len(outside)} record(s) of another interval: {outside[:3]}")
    assert sorted(committed_bodies(ledger, PIPELINE)) == sorted(body(s, i) for i in range(3 * WAVE))

    # A rerun of an old interval under another run id reproduces the same range and reads nothing.
    calls = runner.calls
    before = [(r.start, r.end, r.records) for r in ledger.ranges(PIPELINE) if r.status != RangeStatus.FAILED]
    again = run("manual-i1")
    assert again.ranges() == {s: [0, WAVE]} and runner.calls == calls
    assert [(r.start, r.end, r.records) for r in ledger.ranges(PIPELINE)
            if r.status != RangeStatus.FAILED] == before
    assert ledger.audit(PIPELINE, broker=client).clean


def test_an_interval_whose_end_the_broker_has_not_passed_is_not_ready(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Until a chunk stamped at or after the interval end is committed (or the grace has passed on
    an idle stream), the batch refuses in one line and claims nothing."""
    from streamledger.batch import IntervalNotReady

    s = stream_name("notready")
    create_stream(rabbitmq_url, s, 10)
    start = _now() - timedelta(minutes=1)
    cfg = _interval_config(rabbitmq_url, tmp_path, s, start, _now() + timedelta(seconds=1))
    with pytest.raises(IntervalNotReady, match=f"stream '{s}'.*not ready") as caught:
        run_batch(cfg, run=rid("read", run="late"), ledger=ledger, broker=client, runner=runner)
    assert isinstance(caught.value, BatchError) and caught.value.ready_by > _now()
    assert ledger.ranges(PIPELINE) == [] and runner.calls == 0
    time.sleep(1.2)  # past the end, still inside the grace: an idle stream waits for the grace
    with pytest.raises(IntervalNotReady):
        run_batch(cfg, run=rid("read", run="late"), ledger=ledger, broker=client, runner=runner)
    idle = dataclasses.replace(cfg, interval_grace=0.1)
    result = run_batch(idle, run=rid("read", run="late"), ledger=ledger, broker=client, runner=runner)
    assert result.ranges() == {s: [0, 10]}  # the grace has passed: the end is the committed tail
    assert [r.run.run_id for r in ledger.ranges(PIPELINE) if not r.empty] == ["late"]


def test_a_partition_not_ready_stops_the_batch_before_any_partition_is_claimed(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """The batched claim (issue 24) resolves every partition's pinned span before its one claim
    transaction: a ready partition listed first is not claimed when a later one is not ready."""
    from streamledger.batch import IntervalNotReady

    sup = stream_name.super_stream("pinsuper")
    client.create_super_stream(sup, binding_keys=["a", "b"])
    ready, idle = f"{sup}-a", f"{sup}-b"
    assert client.partitions(sup) == [ready, idle]
    publish(rabbitmq_url, ready, 5)
    publish(rabbitmq_url, idle, 5)
    end = _now() + timedelta(seconds=1)
    time.sleep(1.5)
    publish(rabbitmq_url, ready, 5, start=5)  # stamped after the end: only this partition is resolvable
    cfg = BatchConfig(pipeline=PIPELINE, url=rabbitmq_url, output_root=str(tmp_path), super_stream=sup,
                      interval_start=end - timedelta(minutes=1), interval_end=end, bound_by_interval=True,
                      interval_grace=60.0)
    with pytest.raises(IntervalNotReady, match=f"stream '{idle}'.*not ready"):
        run_batch(cfg, run=rid("read", run="pinsuper"), ledger=ledger, broker=client, runner=runner)
    assert ledger.ranges(PIPELINE) == [] and runner.calls == 0
