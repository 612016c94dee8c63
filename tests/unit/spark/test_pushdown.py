"""Issue 34: the pushed-filter record (bounds, millisecond rounding, exact post-filter) and the
trigger budget, without a broker (the broker-facing halves are in tests/integration/spark)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows

from streamledger.spark.admission import Budget, TriggerOptions, admit_bytes
from streamledger.spark.arrow import ARROW_SCHEMA
from streamledger.spark.pushdown import Projection, PushedFilters

T = dt.datetime(2026, 1, 1, 12, 0, 0, 500_250, tzinfo=dt.UTC)  # 250 µs past a millisecond
T_MS = int(T.timestamp() * 1000)  # floor


def test_split_takes_what_the_source_can_do_and_returns_the_rest_by_reference() -> None:
    keep = [Not(EqualTo(("offset",), 3)), StringStartsWith(("stream",), "a"), EqualTo(("body",), b"x"),
            In(("chunk_timestamp",), (T,)), GreaterThan(("application_properties", "k"), 1)]
    taken = [EqualTo(("stream",), "s"), In(("stream",), ("s", "t")), GreaterThanOrEqual(("offset",), 5),
             LessThan(("offset",), 50), IsNotNull(("offset",))]
    pushed, rest = PushedFilters.split([*taken, *keep])
    assert all(a is b for a, b in zip(rest, keep, strict=True))
    assert pushed == PushedFilters(streams=frozenset({"s"}), offset_from=5, offset_to=50)
    assert PushedFilters.split([IsNull(("stream",))])[0].nothing


@pytest.mark.parametrize(("f", "window"), [
    (GreaterThan(("chunk_timestamp",), T), (T_MS + 1, None)),          # ms*1000 > us
    (GreaterThanOrEqual(("chunk_timestamp",), T), (T_MS + 1, None)),   # ceil: T_MS itself is earlier
    (LessThan(("chunk_timestamp",), T), (None, T_MS + 1)),             # T_MS itself is earlier: kept
    (LessThanOrEqual(("chunk_timestamp",), T), (None, T_MS + 1)),
    (EqualTo(("chunk_timestamp",), T), (T_MS + 1, T_MS + 1)),          # no whole ms equals it: empty
])
def test_chunk_timestamp_bounds_round_to_whole_milliseconds(f: object, window: tuple[int | None, ...]
                                                            ) -> None:
    pushed, rest = PushedFilters.split([f])
    assert rest == [] and (pushed.time_from, pushed.time_to) == window


def test_offset_in_and_ranges_intersect() -> None:
    pushed, _ = PushedFilters.split([In(("offset",), (3, 7, 99)), LessThanOrEqual(("offset",), 50)])
    assert (pushed.offset_from, pushed.offset_to, pushed.offsets) == (3, 51, frozenset({3, 7, 99}))
    both, _ = PushedFilters.split([EqualTo(("stream",), "a"), EqualTo(("stream",), "b")])
    assert both.streams == frozenset()


def test_keep_is_exact_on_a_batch() -> None:
    n = 6
    stamps = [T_MS - 1, T_MS, T_MS, T_MS + 1, T_MS + 2, T_MS + 3]
    batch = pa.RecordBatch.from_arrays([
        pa.array(["s"] * n), pa.array(range(10, 10 + n), pa.int64()),
        pa.array([m * 1000 for m in stamps], pa.timestamp("us", tz="UTC")), pa.array([b"x"] * n),
        *(pa.nulls(n, ARROW_SCHEMA.field(c).type) for c in ARROW_SCHEMA.names[4:]),
    ], schema=ARROW_SCHEMA)
    pushed, _ = PushedFilters.split([GreaterThan(("chunk_timestamp",), T), LessThan(("offset",), 15)])
    assert batch.num_rows == n
    assert pushed.keep(batch).column("offset").to_pylist() == [13, 14]
    assert Projection(("body", "offset")).apply(batch).schema.names == ["body", "offset"]
    assert Projection(("body", "offset")).ddl == "body BINARY, offset LONG"


def test_keep_hands_on_the_batch_itself_when_every_row_passes() -> None:
    """Issue 44: a pushed window's batches mostly lie wholly inside it (its range ends at the chunks
    its bounds resolved to); filtering copied each of them, maps and all, for nothing."""
    n = 4
    batch = pa.RecordBatch.from_arrays([
        pa.array(["s"] * n), pa.array(range(10, 10 + n), pa.int64()),
        pa.array([(T_MS + 1 + i) * 1000 for i in range(n)], pa.timestamp("us", tz="UTC")),
        pa.array([b"x"] * n),
        *(pa.nulls(n, ARROW_SCHEMA.field(c).type) for c in ARROW_SCHEMA.names[4:]),
    ], schema=ARROW_SCHEMA)
    window, _ = PushedFilters.split([GreaterThanOrEqual(("chunk_timestamp",), T),
                                     LessThan(("chunk_timestamp",), T + dt.timedelta(seconds=1))])
    assert window.keep(batch) is batch
    narrower, _ = PushedFilters.split([GreaterThan(("chunk_timestamp",), T + dt.timedelta(milliseconds=1))])
    kept = narrower.keep(batch)
    assert kept is not batch and kept.column("offset").to_pylist() == [11, 12, 13]


def test_trigger_budget() -> None:
    opts = TriggerOptions.parse({"minOffsetsPerTrigger": "5", "maxOffsetsPerTrigger": "100",
                                 "maxBytesPerTrigger": "1m", "maxTriggerDelay": "30s"}.get)
    assert opts.max_trigger_delay_ms == 30_000 and opts.default_limit() == ReadMinRows(5)
    assert opts.budget(ReadMinRows(5), available_now=False) == Budget(100, 1024**2, 5)
    assert opts.budget(ReadMinRows(5), available_now=True) == Budget(100, 1024**2, 0)
    assert opts.budget(ReadMaxRows(10), available_now=False) == Budget(10, 1024**2, 5)
    assert opts.budget(ReadMaxBytes(10), available_now=False) == Budget(100, 10, 5)
    assert opts.budget(ReadAllAvailable(), available_now=False) == Budget()
    assert TriggerOptions().budget(ReadMaxRows(7), available_now=False) == Budget(7)


def test_admit_bytes_keeps_each_streams_share_and_moves_at_least_one() -> None:
    starts, ends = {"a": 0, "b": 100}, {"a": 100, "b": 300}
    out = admit_bytes(starts, ends, {"a": 10.0, "b": 10.0}, 1500)
    assert out == {"a": 50, "b": 200}  # 3000 bytes asked, 1500 allowed: half of each
    assert admit_bytes(starts, ends, {"a": 10.0, "b": 10.0}, 1) == {"a": 1, "b": 101}
    assert admit_bytes(starts, ends, {"a": 10.0}, 1500) == {"a": 100, "b": 300}  # b's size unknown


def test_filter_value_takes_equality_and_in_of_strings_and_post_filters_exactly() -> None:
    from streamledger.spark.pushdown import with_filter_value

    fv = ("filter_value",)
    kept = [IsNotNull(fv), Not(EqualTo(fv, "eu")), In(fv, ("eu", 1)), GreaterThan(fv, "a")]
    pushed, rest = PushedFilters.split([In(fv, ("eu", "us")), EqualTo(fv, "us"), *kept])
    assert pushed == PushedFilters(filter_values=frozenset({"us"})) and rest == kept
    assert PushedFilters.split([EqualTo(fv, "eu"), EqualTo(fv, "us")])[0].nothing

    apps = pa.array([[("region", "us")], [("region", "eu")], None, [("other", "us")]],
                    type=ARROW_SCHEMA.field("application_properties").type)
    n = len(apps)
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["s"] * n), pa.array(range(n), pa.int64()),
         pa.array([0] * n, ARROW_SCHEMA.field("chunk_timestamp").type), pa.array([b""] * n),
         pa.nulls(n, apps.type), apps, pa.nulls(n, apps.type)], schema=ARROW_SCHEMA)
    with_fv = with_filter_value(batch, "region")
    assert with_fv.column("filter_value").to_pylist() == ["us", "eu", None, None]
    assert pushed.keep(with_fv).column("offset").to_pylist() == [0]  # a null filter value never passes
    assert Projection.parse(None, source="x", filter_column=True).columns[-1] == "filter_value"


def test_no_ledger_recorded_read_takes_a_filter() -> None:
    """docs/spark.md, "Filters and the ledger": the job's reader (run_batch) and the recorded streaming
    reader offer Spark no pushFilters, so a committed range is never a broker-filtered read. A reader
    that starts taking filters must first make the pipeline declare them."""
    from pyspark.sql.datasource import DataSourceReader

    from streamledger.sources import find_kind
    from streamledger.spark.job import source_reader
    from streamledger.spark.streaming import RabbitMQStreamMicroBatchReader

    for url, decode in (("rabbitmq-stream://h:5552/", "amqp"), ("mewbase://h:7451/", "bson")):
        kind = find_kind(url)
        assert kind is not None
        reader = source_reader(kind, url=url, ranges={"s": (0, 10)}, splits=1, decode=decode)
        # Spark pushes filters only into a reader that overrides DataSourceReader.pushFilters
        assert type(reader).pushFilters is DataSourceReader.pushFilters, type(reader)
    assert not hasattr(RabbitMQStreamMicroBatchReader, "pushFilters")
