"""The streaming recorder (``batch.microbatch.MicroBatchRecorder``) against the real broker and a real
ledger: what one micro-batch's commit asks of the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamledger.batch.microbatch import MicroBatchRecorder
from streamledger.ledger import Ledger, SourceRef
from streamledger.ledger.types import SourcePosition
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.spark.helpers import create_stream


class CountingLedger(Ledger):
    """The real ledger, counting how often it is asked for positions (a spy: nothing replaced)."""

    asked: list[int]

    def positions(self, pipeline: str, sources: Sequence[SourceRef], **kw: Any) -> list[SourcePosition]:
        self.asked.append(len(sources))
        return super().positions(pipeline, sources, **kw)


def test_a_micro_batch_of_many_streams_reads_the_ledgers_positions_once_to_commit(
    client: StreamClient, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """Settling a micro-batch of four streams asks the ledger's positions (the epoch naming each range's
    directory) in one read, not once per stream (before: four reads, [1, 1, 1, 1])."""
    streams = [stream_name(f"rec-{i}") for i in range(4)]
    for s in streams:
        create_stream(rabbitmq_url, s, 5)
    ledger = CountingLedger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", create=True)
    ledger.asked = []
    rec = MicroBatchRecorder(ledger, "rec", str(tmp_path / "out"), "rabbitmq://test/%2F")
    for s in streams:
        rec.claim("q", 0, s, 0, 5)
    ledger.asked.clear()
    rec.settle("q", 0, {s: 5 for s in streams}, client)
    assert ledger.asked == [4], ledger.asked
    assert sorted((r.source.stream, r.start, r.end, r.records) for r in ledger.ranges("rec")) == sorted(
        (s, 0, 5, 5) for s in streams)
    rec.close()
