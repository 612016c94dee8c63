"""The streaming recorder (``batch.microbatch.MicroBatchRecorder``) against the real broker and a real
ledger: what one micro-batch's commit asks of the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch.microbatch import MicroBatchError, MicroBatchRecorder
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


def test_a_query_under_a_second_name_of_one_broker_is_refused_before_it_claims(
    any_ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    """A streaming query recording under ``broker_name`` west, on the broker whose stream the pipeline
    read as east, is refused in one line before its micro-batch claims (the batch's rule); east goes
    on. Before: nothing refused it."""
    s = stream_name("rec-names")
    create_stream(rabbitmq_url, s, 5)
    east = MicroBatchRecorder(any_ledger, "rec", str(tmp_path / "out"), "rabbitmq://east/%2F")
    east.claim("q", 0, s, 0, 5)
    east.settle("q", 0, {s: 5}, client)
    west = MicroBatchRecorder(any_ledger, "rec", str(tmp_path / "out"), "rabbitmq://west/%2F")
    with pytest.raises(MicroBatchError) as caught:
        west.check_same_streams([s], client)
    text = str(caught.value)
    assert "\n" not in text and repr(s) in text, text
    assert "rabbitmq://east/%2F" in text and "rabbitmq://west/%2F" in text and "broker_name" in text, text
    assert {r.source.broker for r in any_ledger.ranges("rec")} == {"rabbitmq://east/%2F"}
    east.check_same_streams([s], client)  # the history's own name goes on
    east.close()
    west.close()
