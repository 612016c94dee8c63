"""The audit reports the ledger's own marks of data not accounted for yet (issue 43, item 2): a source
a batch marked ``replaced`` is a violation naming ``new-epoch``, with the span past the ledger's end a
batch saw on the broker, and ``status`` shows the mark in its row. RabbitMQ 4.3, local Spark, both
ledgers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchError, run_batch
from streamledger.cli import main
from streamledger.ledger import Ledger, ViolationKind
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.spark.helpers import create_stream, publish

pytestmark = pytest.mark.timeout(300)


def test_a_source_marked_replaced_fails_the_audit_with_the_unread_span_and_status_shows_it(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    pipe, s = "p-audit-marks", stream_name("audit-marks")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=pipe)
    run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    (committed,) = [r for r in any_ledger.ranges(pipe) if r.records]
    publish(rabbitmq_url, s, 150, start=100)
    seen = client.committed_tail(s)
    any_ledger.saw_tails(pipe, {committed.source: seen})  # a batch's look at the tail
    client.delete_stream(s)
    client.create_stream(s)
    publish(rabbitmq_url, s, 30)
    with pytest.raises(BatchError, match="new-epoch"):
        run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    assert any_ledger.position(pipe, committed.source).replaced is not None

    capsys.readouterr()
    rc = main(["ledger", "audit", "--db", any_ledger.url, "--pipeline", pipe, "--no-outputs", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1, report
    (found,) = [v for v in report["violations"] if v["kind"] == ViolationKind.STREAM_REPLACED.value]
    assert (found["start"], found["end"]) == (committed.end, seen), found
    assert "new-epoch" in found["detail"]

    assert main(["status", "--db", any_ledger.url, "--pipeline", pipe, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["mark"] and row["mark"].startswith("replaced") and f"[{committed.end}, {seen})" in row["mark"]
    assert main(["status", "--db", any_ledger.url, "--pipeline", pipe]) == 0
    assert "MARK" in capsys.readouterr().out
