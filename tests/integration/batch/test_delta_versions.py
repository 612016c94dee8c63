"""The Delta commit version the ledger records for a range is the version its commit made, whatever
other writers commit to the table meanwhile (real RabbitMQ, local Spark, the real delta-rs).

delta-rs' ``DeltaTable.history()`` lists the log's newest commit infos but numbers them down from
the version the table object was loaded at: a commit another writer makes after the load shifts
every number by one. The failure this pins was seen once under load in
test_table_faults.py::test_batches_of_two_pipelines_committing_to_one_table_at_once_…[delta]:
"the range is in commit 1, the ledger recorded commit 0"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import run_batch
from streamledger.batch.proof import audit
from streamledger.batch.sinks import KEY_PIPELINE, KEY_RANGES
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.batch.test_table_faults import append_foreign, foreign_rows
from tests.integration.batch.test_table_sinks import PIPE
from tests.integration.spark.helpers import create_stream

pytestmark = pytest.mark.timeout(300)


def _versions_holding(table: Path, pipeline: str) -> list[int]:
    """The versions whose commit info names ``pipeline``'s ranges, read from the log's file names."""
    out = []
    for f in sorted((table / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            info = json.loads(line).get("commitInfo") or {}
            if info.get(KEY_PIPELINE) == pipeline and KEY_RANGES in info:
                out.append(int(f.stem))
    return out


def test_a_commit_another_writer_makes_right_after_ours_does_not_shift_the_recorded_version(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch creates the table (version 0) and commits its range (version 1); another writer
    appends (version 2) after the batch opened the table to look for its commit and before it read
    the log. The ledger must record version 1, and the audit must agree."""
    from deltalake import DeltaTable

    s = stream_name("dver")
    create_stream(rabbitmq_url, s, 30)
    cfg = config(rabbitmq_url, tmp_path, s, sink="delta")
    where = tmp_path / PIPE
    real_history = DeltaTable.history
    fired: list[int] = []

    def history_after_another_commit(self: Any, limit: int | None = None) -> Any:
        if not fired and _versions_holding(where, PIPE):  # ours landed: someone else commits now
            fired.append(self.version())
            append_foreign("delta", ledger, tmp_path, foreign_rows("theirs", [0, 1]))
        return real_history(self, limit)

    monkeypatch.setattr(DeltaTable, "history", history_after_another_commit)
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    monkeypatch.undo()
    assert fired, "no look at the table after the batch's commit"
    assert _versions_holding(where, PIPE) == [1]
    (rng,) = [r for r in ledger.ranges(PIPE) if r.records]
    assert rng.sink_commit == 1, rng.sink_commit
    report = audit(ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
