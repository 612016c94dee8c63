"""Idle claims answered, not stored (migration 0014), composed with two
brokers in one pipeline (the 4.3 and 4.0 servers, a stream of one name on each) and a run key that
was idle on one of them. The idle run is kept per pipeline, not per source: the same key on the other
broker's source gets "nothing new" too (docs/ledger.md, rule 1). Judged by what the outputs hold and
the audit given both brokers: nothing read twice, nothing skipped. Real brokers, local Spark, both
ledgers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import run_batch
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.sources import source_identity
from tests.integration.batch.helpers import CountingRunner, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPE = "p-s11-idle-brokers"


def test_a_key_idle_on_one_broker_reads_nothing_on_the_other_and_the_next_run_reads_it(
    any_ledger: Ledger, runner: CountingRunner, broker_43: Any, broker_40: Any, stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("idle-brokers")
    logs = {b.url: StreamClient.connect(b.url) for b in (broker_43, broker_40)}
    (east, east_log), (west, west_log) = logs.items()
    try:
        for url in logs:
            create_stream(url, s, 3)

        def batch(url: str, run: str, try_number: int = 1) -> Any:
            return run_batch(config(url, tmp_path, s, pipeline=PIPE), ledger=any_ledger, broker=logs[url],
                             run=rid("t", run=run, try_number=try_number), runner=runner)

        for url in logs:  # data, then the tracking chunk its StoreOffset left (recorded by the claim)
            assert batch(url, f"data-{url[-6:]}").records == 3
            tracking = batch(url, f"track-{url[-6:]}")
            assert [(p.start, p.end, p.records) for p in tracking.partitions] == [(3, 4, 0)]
        rows = len(any_ledger.ranges(PIPE))
        assert batch(east, "x").empty  # idle on the 4.3 server: recorded once, no range
        publish(west, s, 2, start=3)
        same_key = batch(west, "x")  # the same run key on the 4.0 server: nothing, though 2 came
        assert [(p.start, p.end, p.records) for p in same_key.partitions] == [(4, 4, 0)]
        again = batch(west, "x", try_number=2)
        assert again.records == 0 and len(any_ledger.ranges(PIPE)) == rows
        nxt = batch(west, "y")
        assert [(p.start, p.end, p.records) for p in nxt.partitions] == [(4, 6, 2)]
        assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(
            [*(body(s, i) for i in range(3)), *(body(s, i) for i in range(5))])
        named = {source_identity(url, log.cluster_name): log for url, log in logs.items()}
        report = audit(any_ledger, PIPE, broker=named)
        assert report.clean, report.to_text()
    finally:
        east_log.close()
        west_log.close()
