"""Audit rule 10 (what a re-created stream's retired history held past its end) composed
with a batch that dies between its claim and the record of the tail it saw. RabbitMQ 4.3, local
Spark, both ledgers; judged by the records the old stream held and what the outputs hold."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, run_batch
from streamledger.batch.proof import audit
from streamledger.cli import main
from streamledger.ledger import Ledger, LedgerError, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPE = "p-redteam-epochs"


class LostAfterClaim:
    """A ledger whose database goes away right after a batch's claims: they are in, and every
    later call fails, as a dropped connection makes it fail."""

    def __init__(self, inner: Ledger) -> None:
        self._inner, self.gone = inner, False

    def __getattr__(self, name: str) -> Any:
        if self.gone:
            raise LedgerError(f"{name}: lost the ledger database postgresql://127.0.0.1/x")
        return getattr(self._inner, name)

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        got = self._inner.claim_many(*args, **kwargs)
        self.gone = True
        return got


def test_the_tail_a_batch_saw_when_it_claimed_is_known_to_new_epoch_even_if_it_died_right_after(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Batch 1 reads the stream's 100 records. 100 more are published; batch 2 (50 offsets a range)
    claims [100, 150) having seen the tail at 200, and dies before anything else reaches the ledger.
    The stream is deleted and re-created; the claim is released and `new-epoch` retires the old
    history. Records 100-199 of the old stream were never read: each must be in a range recorded
    lost, or the audit must not be CLEAN."""
    s = stream_name("died-after-claim")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE, max_offsets=50)
    run_batch(config(rabbitmq_url, tmp_path, s, pipeline=PIPE), run=rid("t"), ledger=any_ledger,
              broker=client, runner=runner)
    publish(rabbitmq_url, s, 100, start=100)
    with pytest.raises(Exception, match="lost the ledger database"):
        run_batch(cfg, run=rid("t", run="r2"), ledger=LostAfterClaim(any_ledger), broker=client,  # type: ignore[arg-type]
                  runner=runner)
    claimed = [(r.start, r.end) for r in any_ledger.ranges(PIPE) if r.status == RangeStatus.CLAIMED]
    assert claimed == [(100, 150)]
    client.delete_stream(s)
    client.create_stream(s)
    client.publish(s, [b"new-%d" % i for i in range(30)])
    assert main(["ledger", "release-stale", "--db", any_ledger.url, "--older-than", "0",
                 "--pipeline", PIPE]) == 0
    broker = any_ledger.ranges(PIPE)[0].source.broker
    assert main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", PIPE, "--stream", s,
                 "--broker", broker, "--reason", "re-created"]) == 0
    # The data: the old stream held 200 records; the outputs hold the first 100.
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(body(s, i) for i in range(100))
    lost = [(r.start, r.end) for r in any_ledger.ranges(PIPE) if r.status == RangeStatus.LOST]
    unaccounted = [o for o in range(100, 200) if not any(a <= o < b for a, b in lost)]
    report = audit(any_ledger, PIPE, broker=client)
    assert not (unaccounted and report.clean), (
        f"old-stream offsets {unaccounted[0]}..{unaccounted[-1]} neither read nor recorded lost "
        f"(lost: {lost}), audit CLEAN")


def test_a_retired_pinned_history_leaves_no_interval_unread_and_unrecorded(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Three data intervals of 30 records each; the runs of the 1st and 3rd read theirs, the 2nd's
    never claims (it failed before its claim, or the DAG does not catch up). The stream is deleted
    and re-created and `new-epoch` retires the history: the 2nd interval's records can never be read
    now, so each must be in a range recorded lost (rule 10), or the audit must not be CLEAN."""
    s = stream_name("pinned-retired")
    client.create_stream(s)
    bounds = [datetime.now(UTC)]
    time.sleep(0.3)
    for wave in range(3):  # each wave inside its own interval (chunk stamps are the broker's clock)
        publish(rabbitmq_url, s, 30, start=wave * 30, batch_size=10)
        time.sleep(0.6)
        bounds.append(datetime.now(UTC))
        time.sleep(0.6)
    publish(rabbitmq_url, s, 5, start=90)  # after the 3rd interval: its end is resolvable now
    for n in (0, 2):
        cfg = BatchConfig(pipeline=PIPE, url=rabbitmq_url, output_root=str(tmp_path), stream=s,
                          interval_start=bounds[n], interval_end=bounds[n + 1], bound_by_interval=True,
                          interval_grace=5.0)
        run_batch(cfg, run=rid("read", run=f"i{n + 1}"), ledger=any_ledger, broker=client, runner=runner)
    read = sorted(committed_bodies(any_ledger, PIPE))
    assert read == sorted([*(body(s, i) for i in range(30)), *(body(s, i) for i in range(60, 90))])
    client.delete_stream(s)
    client.create_stream(s)
    broker = any_ledger.ranges(PIPE)[0].source.broker
    assert main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", PIPE, "--stream", s,
                 "--broker", broker, "--reason", "re-created"]) == 0
    lost = [(r.start, r.end) for r in any_ledger.ranges(PIPE) if r.status == RangeStatus.LOST]
    unaccounted = [o for o in range(30, 60) if not any(a <= o < b for a, b in lost)]
    report = audit(any_ledger, PIPE, broker=client)
    assert not (unaccounted and report.clean), (
        f"old-stream offsets {unaccounted[0]}..{unaccounted[-1]} neither read nor recorded lost "
        f"(lost: {lost}), audit CLEAN")
