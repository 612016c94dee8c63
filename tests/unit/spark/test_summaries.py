"""Slice summaries: a task's records per log, as rows the job's metrics collect."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamledger.spark.arrow import ARROW_SCHEMA
from streamledger.spark.summaries import SUMMARY_OFFSET, SummaryError, decode, with_summaries


def batch(stream: str, offsets: list[int]) -> pa.RecordBatch:
    n = len(offsets)
    cols = {"stream": pa.array([stream] * n), "offset": pa.array(offsets, pa.int64()),
            "body": pa.array([b"x"] * n, pa.binary())}
    return pa.RecordBatch.from_arrays(
        [cols.get(f.name, pa.nulls(n, f.type)) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def test_batches_pass_unchanged_then_one_summary_row_per_log() -> None:
    given = [batch("a", [3, 4, 7]), batch("b", [10]), batch("a", [9, 12]), batch("c", [])]
    out = list(with_summaries(given))
    assert out[:4] == given
    summary = out[4]
    assert summary.schema == ARROW_SCHEMA
    assert summary.column("stream").to_pylist() == ["a", "b"]
    assert summary.column("offset").to_pylist() == [SUMMARY_OFFSET] * 2
    assert [decode(b) for b in summary.column("body").to_pylist()] == [(5, 3, 12), (1, 10, 10)]
    assert summary.column("properties").null_count == 2


def test_no_records_no_summary() -> None:
    assert list(with_summaries([batch("a", [])])) == [batch("a", [])]
    assert list(with_summaries([])) == []


def test_a_batch_mixing_logs_is_refused() -> None:
    mixed = pa.RecordBatch.from_arrays(
        [pa.array(["a", "b"]) if f.name == "stream" else pa.array([1, 2], pa.int64()) if f.name == "offset"
         else pa.nulls(2, f.type) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)
    with pytest.raises(SummaryError, match="'a'"):
        list(with_summaries([mixed]))
