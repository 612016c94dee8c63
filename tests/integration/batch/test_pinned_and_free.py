"""One history is either pinned to data intervals or free (claimed where the ledger ends: batches
without an interval, streaming queries), never both. Mixed, the pinned claims and the free ones
overlap: a pinned run whose span equals a free range took it as its own (records it never read), one
whose span overlaps a free range failed on every retry ("range overlaps a live range"), and a free
batch on a pinned history took offsets of an interval whose run had not come yet. Each order is
refused with one line naming the pipeline, the stream and the range of the other kind, before
anything is claimed. Real broker (4.3), local Spark, both ledgers.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, BatchError, run_batch
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, rid
from tests.integration.spark.helpers import create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPELINE = "p-pinned-or-free"


def _moment() -> datetime:
    time.sleep(0.3)  # chunk timestamps are the broker's clock, in milliseconds
    now = datetime.now(UTC)
    time.sleep(0.3)
    return now


def _config(url: str, root: Path, stream: str, interval: tuple[datetime, datetime] | None = None
            ) -> BatchConfig:
    if interval is None:
        return BatchConfig(pipeline=PIPELINE, url=url, output_root=str(root), stream=stream,
                           initial_position="first")
    return BatchConfig(pipeline=PIPELINE, url=url, output_root=str(root), stream=stream,
                       interval_start=interval[0], interval_end=interval[1], bound_by_interval=True,
                       interval_grace=0.0)


def test_a_pinned_batch_on_a_free_history_is_refused_before_any_claim(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("free-then-pinned")
    create_stream(rabbitmq_url, s, 0)
    t0 = _moment()
    publish(rabbitmq_url, s, 30)
    t1 = _moment()
    free = run_batch(_config(rabbitmq_url, tmp_path, s), run=rid("t", run="free"), ledger=any_ledger,
                     broker=client, runner=runner)
    assert free.records == 30
    publish(rabbitmq_url, s, 20, start=30)
    t2 = _moment()
    before = [(r.id, r.status) for r in any_ledger.ranges(PIPELINE)]
    jobs = runner.calls
    for run, interval in {"i0": (t0, t1), "i1": (t1, t2), "wide": (t0, t2)}.items():
        with pytest.raises(BatchError) as refused:
            run_batch(_config(rabbitmq_url, tmp_path, s, interval), run=rid("t", run=run), ledger=any_ledger,
                      broker=client, runner=runner)
        text = str(refused.value)
        assert f"pipeline {PIPELINE!r}, stream {s!r}" in text and "not pinned" in text, text
        assert "\n" not in text
        assert [(r.id, r.status) for r in any_ledger.ranges(PIPELINE)] == before, run
    assert runner.calls == jobs  # no job ran


def test_a_free_batch_on_a_pinned_history_is_refused_before_any_claim(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("pinned-then-free")
    create_stream(rabbitmq_url, s, 0)
    t0 = _moment()
    publish(rabbitmq_url, s, 30)
    t1 = _moment()
    pinned = run_batch(_config(rabbitmq_url, tmp_path, s, (t0, t1)), run=rid("t", run="i0"),
                       ledger=any_ledger, broker=client, runner=runner)
    assert pinned.records == 30
    publish(rabbitmq_url, s, 20, start=30)
    t2 = _moment()
    before = [(r.id, r.status) for r in any_ledger.ranges(PIPELINE)]
    jobs = runner.calls
    with pytest.raises(BatchError) as refused:
        run_batch(_config(rabbitmq_url, tmp_path, s), run=rid("t", run="free"), ledger=any_ledger,
                  broker=client, runner=runner)
    text = str(refused.value)
    assert f"pipeline {PIPELINE!r}, stream {s!r}" in text and "pinned to data intervals" in text, text
    assert [(r.id, r.status) for r in any_ledger.ranges(PIPELINE)] == before
    assert runner.calls == jobs
    # interval 1's run reads what the free batch would have taken
    assert run_batch(_config(rabbitmq_url, tmp_path, s, (t1, t2)), run=rid("t", run="i1"), ledger=any_ledger,
                     broker=client, runner=runner).records == 20
