"""Admission control and the source offset of the streaming source (pure: no broker, no Spark)."""

from __future__ import annotations

import pytest

from streamledger.spark.planning import PlanningError
from streamledger.spark.streaming import SourceOffset, StreamingError, StreamingOptions, admit

URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"


def test_admit_all_when_under_the_cap_or_uncapped() -> None:
    assert admit({"a": 0, "b": 5}, {"a": 10, "b": 5}, None) == {"a": 10, "b": 5}
    assert admit({"a": 0, "b": 5}, {"a": 10, "b": 8}, 13) == {"a": 10, "b": 8}


@pytest.mark.parametrize("cap", [1, 2, 7, 50, 99])
def test_admit_shares_the_cap_by_backlog_and_never_exceeds(cap: int) -> None:
    starts, tails = {"a": 0, "b": 100, "c": 7}, {"a": 60, "b": 130, "c": 17}
    ends = admit(starts, tails, cap)
    assert sum(ends[s] - starts[s] for s in starts) == cap  # total backlog is 100 > cap
    assert all(starts[s] <= ends[s] <= tails[s] for s in starts)


def test_source_offset_round_trip_and_start_of() -> None:
    first = SourceOffset("q", 0, {"a": 10, "b": 4}, {"a": 0, "b": 4})
    assert SourceOffset.from_json(first.to_json()) == first
    later = SourceOffset("q", 1, {"a": 20, "b": 4, "c": 3}, {"c": 1})
    assert [later.start_of(s, first) for s in ("a", "b", "c")] == [10, 4, 1]
    with pytest.raises(StreamingError, match="did not write"):
        SourceOffset.from_json({"index": 3})


def test_options_refuse_batch_only_and_incomplete_ledger_options() -> None:
    with pytest.raises(PlanningError, match=r"endingOffsets.*batch reads"):
        StreamingOptions.parse({"url": URL, "stream": "s", "endingOffsets": "latest"})
    with pytest.raises(PlanningError, match="needs 'pipeline'"):
        StreamingOptions.parse({"url": URL, "stream": "s", "ledger": "default"})
    with pytest.raises(PlanningError, match="not both"):
        StreamingOptions.parse({"url": URL, "stream": "s", "maxOffsetsPerTrigger": "5",
                                "maxRecordsPerTrigger": "6"})
    opts = StreamingOptions.parse({"url": URL, "stream": "s", "maxRecordsPerTrigger": "6",
                                   "ledger": "default", "pipeline": "p", "ledgerOutput": "/tmp/x"})
    assert (opts.max_offsets, opts.ledger_on, opts.ledger_url) == (6, True, None)
