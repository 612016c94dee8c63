"""Issue 34: projection and filter pushdown of ``rabbitmq_stream`` (local Spark, real RabbitMQ 4.3).

Each test checks two things: the rows equal what Spark computes from the unfiltered, full read, and the
source did less (the planned slices a reader gets after ``pushFilters``, the columns its batches carry).
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamledger.spark.datasource import RabbitMQStreamDataSource, StreamSlice
from streamledger.spark.planning import PlanningError
from tests.integration.spark.helpers import RoundTrips, body, create_stream, publish, read_df

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]


def source(url: str, **options: Any) -> RabbitMQStreamDataSource:
    return RabbitMQStreamDataSource({"url": url, "filterPushdown": "true", **options})


@pytest.fixture
def pushdown(spark: Any) -> Iterator[Any]:
    """Spark 4.2's switch for Python filter pushdown (off by default), on for one test."""
    key = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "true")
    yield spark
    spark.conf.set(key, before)


FULL = StructType([
    StructField("stream", StringType()), StructField("offset", LongType()),
    StructField("chunk_timestamp", TimestampType()), StructField("body", BinaryType()),
    *(StructField(m, MapType(StringType(), StringType()))
      for m in ("properties", "application_properties", "message_annotations")),
])


def planned(reader: Any) -> list[tuple[str, int, int]]:
    out = []
    for p in reader.partitions():
        for piece in getattr(p, "slices", [p]):
            assert isinstance(piece, StreamSlice)
            out.append((piece.stream, piece.start, piece.end))
    return sorted(out)


def test_projection_by_schema_and_by_option(spark: Any, rabbitmq_url: str, stream_name: Any) -> None:
    s = stream_name("proj")
    create_stream(rabbitmq_url, s, 300)
    full = read_df(spark, rabbitmq_url, stream=s).select("offset", "body").orderBy("offset").collect()

    narrow = (spark.read.format("rabbitmq_stream").schema("offset LONG, body BINARY")
              .option("url", rabbitmq_url).option("stream", s).load())
    assert narrow.columns == ["offset", "body"]
    assert narrow.orderBy("offset").collect() == full
    by_option = read_df(spark, rabbitmq_url, stream=s, columns="body, offset")
    assert by_option.columns == ["body", "offset"]
    assert sorted(by_option.collect(), key=lambda r: r["offset"]) == [(r["body"], r["offset"]) for r in full]
    counted = spark.read.format("rabbitmq_stream").schema("offset LONG").option("url", rabbitmq_url)
    assert counted.option("stream", s).load().count() == 300

    # what a task ships: only the projected columns (the maps are neither decoded nor sent)
    reader = source(rabbitmq_url, stream=s).reader(
        StructType([StructField("offset", LongType()), StructField("body", BinaryType())]))
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    assert {tuple(b.schema.names) for b in batches} == {("offset", "body")}
    assert sum(b.num_rows for b in batches) == 300
    assert batches[0].column("body")[0].as_py() == body(s, 0)

    with pytest.raises(PlanningError, match=r"schema column offset string is not one of the source's"):
        source(rabbitmq_url, stream=s).reader(StructType([StructField("offset", StringType())]))
    with pytest.raises(PlanningError, match=r"option 'columns' names unknown columns \['headers'\]"):
        source(rabbitmq_url, stream=s, columns="offset,headers").schema()


def test_filters_on_stream_and_offset_prune_the_plan(pushdown: Any, rabbitmq_url: str, stream_name: Any
                                                     ) -> None:
    spark = pushdown
    a, b, c = stream_name("fa"), stream_name("fb"), stream_name("fc")
    for s in (a, b, c):
        create_stream(rabbitmq_url, s, 200)

    reader = source(rabbitmq_url, stream=f"{a},{b},{c}").reader(FULL)  # the schema Spark passes
    unsupported = GreaterThan(("body",), b"x")
    filters = [In(("stream",), (a, b)), GreaterThan(("offset",), 10), LessThanOrEqual(("offset",), 150),
               unsupported]
    assert list(reader.pushFilters(filters)) == [unsupported]
    assert planned(reader) == [(a, 11, 151), (b, 11, 151)]  # c pruned; 2 x 140 offsets, not 3 x 200

    reader = source(rabbitmq_url, stream=f"{a},{b},{c}").reader(FULL)
    assert list(reader.pushFilters([EqualTo(("stream",), c), In(("offset",), (3, 7, 99))])) == []
    assert planned(reader) == [(c, 3, 100)]
    rows = [r for p in reader.partitions() for batch in reader.read(p) for r in batch.to_pylist()]
    assert sorted(r["offset"] for r in rows) == [3, 7, 99]  # exact: the range is narrowed, then filtered

    df = read_df(spark, rabbitmq_url, stream=f"{a},{b},{c}", filterPushdown="true")
    condition = (F.col("stream").isin(a, b) & (F.col("offset") > 10) & (F.col("offset") <= 150)
                 & F.col("body").isNotNull())
    query = df.filter(condition)
    unpushed = read_df(spark, rabbitmq_url, stream=f"{a},{b},{c}").filter(condition)
    expected = sorted((r["stream"], r["offset"]) for r in unpushed.collect())
    assert expected == sorted((s, o) for s in (a, b) for o in range(11, 151))
    assert sorted((r["stream"], r["offset"]) for r in query.collect()) == expected
    plan = query._jdf.queryExecution().executedPlan().toString()
    assert "stream" in plan and "offset" in plan  # Spark shows what it pushed
    assert df.filter(F.col("offset").isin(3, 7, 99) & (F.col("stream") == c)).count() == 3
    assert df.filter(F.col("stream") == "no-such-stream").count() == 0


def test_chunk_timestamp_window_reads_only_its_chunks(pushdown: Any, rabbitmq_url: str, stream_name: Any
                                                      ) -> None:
    spark = pushdown
    s = stream_name("window")
    create_stream(rabbitmq_url, s, 100)
    cuts = []
    for era in (1, 2):
        time.sleep(1.1)
        cuts.append(dt.datetime.now(dt.UTC))
        time.sleep(0.1)
        publish(rabbitmq_url, s, 100, start=100 * era)

    reader = source(rabbitmq_url, stream=s).reader(FULL)
    window = [GreaterThanOrEqual(("chunk_timestamp",), cuts[0]), LessThan(("chunk_timestamp",), cuts[1])]
    assert list(reader.pushFilters(window)) == []
    assert planned(reader) == [(s, 100, 200)]  # the middle era's chunks only: 100 of 300 offsets

    def offsets(pushed: bool, condition: Any) -> list[int]:
        df = read_df(spark, rabbitmq_url, stream=s, filterPushdown=str(pushed).lower())
        return sorted(r["offset"] for r in df.filter(condition).select("offset").collect())

    stamp = F.col("chunk_timestamp")
    for condition, expected in (((stamp >= F.lit(cuts[0])) & (stamp < F.lit(cuts[1])), range(100, 200)),
                                (stamp > F.lit(cuts[1]), range(200, 300)),
                                (stamp <= F.lit(cuts[0]), range(100))):
        got = offsets(True, condition)
        assert got == list(expected)
        assert got == offsets(False, condition)  # the unfiltered read, filtered by Spark


def test_a_pushed_window_split_over_several_tasks_reads_each_record_once(
        pushdown: Any, rabbitmq_url: str, stream_name: Any) -> None:
    """Issue 44: a window read by several tasks (``splitsPerStream``: the slices cut inside chunks,
    each task's batches ramping up and shrinking again towards its slice's end) hands Spark exactly
    the window's records, each once, with their bodies; the same as Spark filtering the full read
    split the same way."""
    spark = pushdown
    s = stream_name("wsplit")
    create_stream(rabbitmq_url, s, 100)
    time.sleep(1.1)
    since = dt.datetime.now(dt.UTC)
    time.sleep(0.1)
    publish(rabbitmq_url, s, 100, start=100, batch_size=7)  # many small chunks, cut inside some
    time.sleep(1.1)
    until = dt.datetime.now(dt.UTC)
    time.sleep(0.1)
    publish(rabbitmq_url, s, 100, start=200)

    reader = source(rabbitmq_url, stream=s, splitsPerStream="3").reader(FULL)
    assert list(reader.pushFilters([GreaterThanOrEqual(("chunk_timestamp",), since),
                                    LessThan(("chunk_timestamp",), until)])) == []
    assert planned(reader) == [(s, 100, 134), (s, 134, 167), (s, 167, 200)]
    stamp = F.col("chunk_timestamp")
    window = (stamp >= F.lit(since)) & (stamp < F.lit(until))
    for pushed in (True, False):
        df = read_df(spark, rabbitmq_url, stream=s, splitsPerStream="3", batchRows="5",
                     filterPushdown=str(pushed).lower()).filter(window)
        rows = sorted((r["offset"], r["body"]) for r in df.select("offset", "body").collect())
        assert rows == [(o, body(s, o)) for o in range(100, 200)], pushed


def test_a_window_over_many_streams_resolves_its_bounds_in_one_broker_round(
    pushdown: Any, rabbitmq_url: str, stream_name: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44: a pushed chunk_timestamp window asks the broker for both bounds of every stream in
    one pipelined round (and each stream's first offset and tail in one StreamStats round): planning
    it over three streams costs the round trips of one stream, one more than the plain plan, where it
    was two StreamStats and two resolutions per stream. The ranges and rows stay exact: each stream's
    middle era, and a window past the tail plans and reads nothing."""
    spark = pushdown
    streams = [stream_name(f"wr{i}") for i in range(3)]
    for s in streams:
        create_stream(rabbitmq_url, s, 50)
    cuts = []
    for era in (1, 2):
        time.sleep(1.1)
        cuts.append(dt.datetime.now(dt.UTC))
        time.sleep(0.1)
        for s in streams:
            publish(rabbitmq_url, s, 50, start=50 * era)
    window = [GreaterThanOrEqual(("chunk_timestamp",), cuts[0]), LessThan(("chunk_timestamp",), cuts[1])]

    def plan_counted(names: list[str], filters: list[Any]) -> tuple[int, list[tuple[str, int, int]]]:
        reader = source(rabbitmq_url, stream=",".join(names)).reader(FULL)
        assert list(reader.pushFilters(filters)) == []
        counter = RoundTrips(monkeypatch)
        ranges = planned(reader)
        monkeypatch.undo()
        return counter.count, ranges

    one, _ = plan_counted(streams[:1], window)
    three, ranges = plan_counted(streams, window)
    plain, _ = plan_counted(streams, [])
    assert ranges == sorted((s, 50, 100) for s in streams)
    assert three == one == plain + 1, (one, three, plain)

    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    assert plan_counted(streams, [GreaterThanOrEqual(("chunk_timestamp",), later)])[1] == []
    stamp = F.col("chunk_timestamp")
    for condition, expected in (((stamp >= F.lit(cuts[0])) & (stamp < F.lit(cuts[1])),
                                 sorted((s, o) for s in streams for o in range(50, 100))),
                                (stamp >= F.lit(later), [])):
        for pushed in (True, False):  # pushed, and filtered by Spark from the full read
            df = read_df(spark, rabbitmq_url, stream=",".join(streams), filterPushdown=str(pushed).lower())
            got = sorted((r["stream"], r["offset"]) for r in df.filter(condition).select("stream", "offset")
                         .collect())
            assert got == expected, pushed


def test_a_pushed_offset_filter_reports_only_the_lost_offsets_it_asked_for(rabbitmq_url: str, stream_name: Any
                                                                            ) -> None:
    """Red team: retention had removed [0, first); a pushed offset filter decides which of those the
    query wanted. The lost span reported (failOnDataLoss=false) and the failure (true) are about exactly
    those offsets: none when the filter starts past the cut, [low, first) when it starts inside it."""
    from streamledger.spark.planning import PlannedRange
    from tests.integration.spark.test_datasource import retention_stream

    s, first, tail = retention_stream(rabbitmq_url, stream_name)
    low = first // 2

    def plan(filters: list[Any], **options: Any) -> list[PlannedRange]:
        reader = source(rabbitmq_url, stream=s, startingOffsets="0", **options).reader(FULL)
        assert list(reader.pushFilters(filters)) == []
        return reader.plan()

    loose = {"failOnDataLoss": "false"}
    assert [r.lost for r in plan([GreaterThanOrEqual(("offset",), low)], **loose)] == [(low, first)]
    assert [r.lost for r in plan([LessThan(("offset",), low)], **loose)] == [(0, low)]
    assert [r.lost for r in plan([GreaterThanOrEqual(("offset",), first + 10)], **loose)] == [None]
    assert [r.lost for r in plan([In(("offset",), (low, first + 1))], **loose)] == [(low, first)]

    # failOnDataLoss=true: a filter past the cut loses nothing the query asked for; inside it, the
    # error names the first offset the query wanted
    (r,) = plan([GreaterThanOrEqual(("offset",), first + 10)])
    assert (r.start, r.end, r.lost) == (first + 10, tail, None)
    with pytest.raises(Exception, match=rf"offset {low} is no longer retained \(first available offset is "
                                        rf"{first}\)"):
        plan([GreaterThanOrEqual(("offset",), low)])


def test_a_pushed_window_over_a_super_stream_split_over_several_tasks_reads_each_record_once(
        pushdown: Any, rabbitmq_url: str, stream_name: Any) -> None:
    """Issue 44 (red team): a window over a super stream's partitions, each split in slices cut inside
    chunks (``splitsPerStream=3``, ``batchRows=4``: batches ramp up and shrink again towards each
    slice's end), partitions of uneven sizes (one with no record in the window, one with one): each
    record of the window comes once with its body, as Spark filtering the full read split the same way."""
    from streamledger.protocol.rabbitmq import StreamClient

    spark = pushdown
    sup = stream_name.super_stream("wsplit-super")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(sup, partitions=3)
        parts = client.partitions(sup)
    for p in parts:
        publish(rabbitmq_url, p, 40)
    time.sleep(1.1)
    since = dt.datetime.now(dt.UTC)
    time.sleep(0.1)
    for p, n in zip(parts, (0, 1, 97), strict=True):
        publish(rabbitmq_url, p, n, start=40, batch_size=6)  # many small chunks: slices cut inside them
    time.sleep(1.1)
    until = dt.datetime.now(dt.UTC)
    time.sleep(0.1)
    for p in parts:
        publish(rabbitmq_url, p, 20, start=200)
    reader = source(rabbitmq_url, superStream=sup, splitsPerStream="3").reader(FULL)
    assert list(reader.pushFilters([GreaterThanOrEqual(("chunk_timestamp",), since),
                                    LessThan(("chunk_timestamp",), until)])) == []
    slices = planned(reader)
    for p, (first, end) in ((parts[1], (40, 41)), (parts[2], (40, 137))):  # no gap, no overlap
        mine = [(a, b) for s, a, b in slices if s == p]
        assert mine[0][0] == first and mine[-1][1] == end, slices
        assert all(b == a2 for (_, b), (a2, _) in itertools.pairwise(mine)), slices
    assert len([s for s in slices if s[0] == parts[2]]) == 3 and parts[0] not in {s[0] for s in slices}
    stamp = F.col("chunk_timestamp")
    window = (stamp >= F.lit(since)) & (stamp < F.lit(until))
    want = sorted([(parts[1], 40, body(parts[1], 40))]
                  + [(parts[2], o, body(parts[2], o)) for o in range(40, 137)])
    for pushed in (True, False):
        df = read_df(spark, rabbitmq_url, superStream=sup, splitsPerStream="3", batchRows="4",
                     filterPushdown=str(pushed).lower()).filter(window)
        rows = sorted((r["stream"], r["offset"], r["body"])
                      for r in df.select("stream", "offset", "body").collect())
        assert rows == want, pushed
