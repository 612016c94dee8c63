"""``streamledger ledger audit --no-outputs`` (``audit(outputs_too=False)``)
given the broker, over one broker's stream read twice under two names (two first batches that raced
past the claim-time check, as in test_broker_names_after_retention), before anything was recorded.
Real RabbitMQ 4.3, local Spark, both ledgers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import run_batch
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.spark.helpers import create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPE = "p-exactly-once"


def _require(ok: bool, what: object) -> None:
    if not ok:
        raise RuntimeError(f"scenario broken: {what}")


def test_an_audit_without_outputs_given_the_broker_finds_one_stream_read_twice_under_two_names(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("s12-no-outputs")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 10)
    east = config(rabbitmq_url, tmp_path, s, broker_name="east")
    west = config(rabbitmq_url, tmp_path, s, broker_name="west")

    def meanwhile(step: str, _batch: Any) -> None:
        if step == "claimed":  # east holds [0, 10) unprinted: west's first batch is not refused
            run_batch(west, run=rid("t", run="w1"), ledger=any_ledger, broker=client, runner=runner)

    run_batch(east, run=rid("t", run="e1"), ledger=any_ledger, broker=client, runner=runner,
              on_step=meanwhile)
    read = sorted((r.start, r.end) for r in any_ledger.ranges(PIPE)
                  if r.status == RangeStatus.COMMITTED and r.records)
    _require(read == [(0, 10), (0, 10)], read)  # [0, 10) read twice
    _require(any_ledger.same_broker(PIPE) == [], "nothing recorded yet")
    report = audit(any_ledger, PIPE, broker=client, outputs_too=False)
    assert not report.clean, report.to_text()
    assert "overlap" in [v.kind.value for v in report.violations], report.to_text()
