"""Idle batches do not grow the ledger. A batch that finds nothing new on a partition records no
range there (an empty claim is answered, not stored, once the source has a history); the tracking
chunks a StoreOffset left past the ledger's end, which move the position, are recorded committed by
the claim itself (one insert), not claimed and then committed row by row. Every promise stays: a
retry of the same run gets the same answer (nothing where its first attempt got nothing), the audit
proves contiguity, and results still list every partition. Against the real RabbitMQ 4.3 broker,
local Spark and both ledgers.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, BatchError, run_batch
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, committed_bodies, rid

pytestmark = pytest.mark.timeout(600)  # several batches each, and the Spark session on a busy machine

PIPE = "p-idle-growth"


class Calls:
    """The real ledger, counting the calls made through it (every call goes through)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._ledger, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return value(*args, **kwargs)

        return call


def _super_stream(client: StreamClient, stream_name: Any, n: int, records: int) -> list[str]:
    sup = stream_name.super_stream("idle-growth")
    client.create_super_stream(sup, partitions=n)
    parts = sorted(client.partitions(sup))
    for p in parts:
        client.publish(p, [b"%s:%d" % (p.encode(), i) for i in range(records)])
    return [sup, *parts]


def test_idle_batches_do_not_grow_the_ledger(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    sup, *parts = _super_stream(client, stream_name, 6, 3)
    cfg = BatchConfig(pipeline=PIPE, url=rabbitmq_url, output_root=str(tmp_path / "out"), super_stream=sup)
    run_batch(cfg, run=rid("t", run="r1"), ledger=any_ledger, broker=client, runner=runner)
    assert len(any_ledger.ranges(PIPE)) == 6

    # The first idle batch: the tracking chunk each StoreOffset left at 3 moves the position, so it is
    # recorded, committed by the claim itself (no commit afterwards, no job).
    counted = Calls(any_ledger)
    first = run_batch(cfg, run=rid("t", run="r2"), ledger=counted, broker=client,  # type: ignore[arg-type]
                      runner=runner)
    assert [(r.start, r.end, r.records) for r in first.partitions] == [(3, 4, 0)] * 6
    assert counted.calls["commit_many"] == 0 and counted.calls["commit"] == 0, counted.calls
    tracking = [r for r in any_ledger.ranges(PIPE) if r.start == 3]
    assert [(r.end, r.status, r.records) for r in tracking] == [(4, RangeStatus.COMMITTED, 0)] * 6
    grown = len(any_ledger.ranges(PIPE))
    assert grown == 12

    # Idle batches after that: nothing new anywhere, nothing recorded per partition.
    for i in range(3, 7):
        idle = run_batch(cfg, run=rid("t", run=f"r{i}"), ledger=any_ledger, broker=client, runner=runner)
        assert len(any_ledger.ranges(PIPE)) == grown, f"batch r{i} grew the ledger"
        assert [(r.start, r.end, r.records, r.range_id) for r in idle.partitions] == [(4, 4, 0, None)] * 6
        assert idle.empty
    assert runner.calls == 1

    # The history is still proven whole, and the next records are read from where it ends.
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
    client.publish(parts[2], [b"late:%d" % i for i in range(2)])
    later = run_batch(cfg, run=rid("t", run="r9"), ledger=any_ledger, broker=client, runner=runner)
    assert [(r.start, r.end, r.records) for r in later.partitions if r.records] == [(4, 6, 2)]
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(
        [*(b"%s:%d" % (p.encode(), i) for p in parts for i in range(3)), b"late:0", b"late:1"])
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


def test_a_retry_of_an_idle_run_gets_nothing_though_records_came_since(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    sup, *parts = _super_stream(client, stream_name, 3, 2)
    cfg = BatchConfig(pipeline=PIPE, url=rabbitmq_url, output_root=str(tmp_path / "out"), super_stream=sup)
    for run in ("r1", "r2", "r3"):  # data, tracking chunks, idle
        run_batch(cfg, run=rid("t", run=run), ledger=any_ledger, broker=client, runner=runner)
    count = len(any_ledger.ranges(PIPE))
    client.publish(parts[0], [b"new:%d" % i for i in range(3)])

    # r3 again (a cleared task, a retry): its first attempt found nothing, so does this one
    again = run_batch(cfg, run=rid("t", run="r3", try_number=2), ledger=any_ledger, broker=client,
                      runner=runner)
    assert again.records == 0 and all(r.start == r.end for r in again.partitions), again.partitions
    assert len(any_ledger.ranges(PIPE)) == count
    # the next run reads them
    nxt = run_batch(cfg, run=rid("t", run="r4"), ledger=any_ledger, broker=client, runner=runner)
    assert nxt.records == 3
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


def test_a_retry_of_a_run_reads_its_claim_and_nothing_where_it_found_nothing(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """A run whose job died: its retry reads exactly its claim on the partition that had records,
    and nothing on the partitions its first attempt found idle, though records came there since."""
    sup, *parts = _super_stream(client, stream_name, 3, 2)
    cfg = BatchConfig(pipeline=PIPE, url=rabbitmq_url, output_root=str(tmp_path / "out"), super_stream=sup)
    for run in ("r1", "r2", "r3"):  # data, tracking chunks, idle
        run_batch(cfg, run=rid("t", run=run), ledger=any_ledger, broker=client, runner=runner)
    client.publish(parts[1], [b"one:%d" % i for i in range(2)])
    runner.die = RuntimeError("executor lost")
    with pytest.raises((BatchError, RuntimeError)):
        run_batch(cfg, run=rid("t", run="r4"), ledger=any_ledger, broker=client, runner=runner)
    client.publish(parts[0], [b"zero:%d" % i for i in range(2)])
    client.publish(parts[1], [b"one:%d" % i for i in range(2, 4)])

    retry = run_batch(cfg, run=rid("t", run="r4", try_number=2), ledger=any_ledger, broker=client,
                      runner=runner)
    assert [(r.start, r.end, r.records) for r in retry.partitions] == [(3, 3, 0), (3, 5, 2), (3, 3, 0)]
    nxt = run_batch(cfg, run=rid("t", run="r5"), ledger=any_ledger, broker=client, runner=runner)
    assert sorted((r.start, r.end, r.records) for r in nxt.partitions if r.records) == [(3, 5, 2), (5, 8, 2)]
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
