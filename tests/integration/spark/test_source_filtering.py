"""Issue 34: RabbitMQ stream filtering under ``filter_value = v`` / ``IN`` (local Spark, real RabbitMQ).

The publisher sets each message's filter value from application property ``region``; the source
declares that property (``filterValueProperty``) and gets column ``filter_value``. Each test checks the
rows equal Spark's own filter over a full read, and that the broker sent fewer chunks and bytes
(``ReadStats`` of the same slices read without the pushed filter).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.datasource import EqualTo, In, IsNotNull
from pyspark.sql.types import StringType, StructField, StructType

from streamledger.protocol.rabbitmq import OutboundMessage, ReadStats, StreamClient
from streamledger.spark.datasource import RabbitMQStreamDataSource, StreamSlice, read_slice
from streamledger.spark.planning import PlanningError
from tests.integration.spark.helpers import read_df
from tests.integration.spark.test_source_pushdown import FULL
from tests.support.rabbitmq import Broker

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]

WITH_FILTER = StructType([*FULL.fields, StructField("filter_value", StringType())])
REGIONS = ("eu", "us", "apac")


@pytest.fixture
def pushdown(spark: Any) -> Iterator[Any]:
    key = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "true")
    yield spark
    spark.conf.set(key, before)


def publish_regions(url: str, stream: str, groups: int = 12, per_group: int = 50) -> dict[int, str | None]:
    """One confirmed publish per group (its own chunks): region REGIONS[g % 3]; group 4 without the
    property (unfiltered), group 7 mixes eu and us in one frame. Returns each offset's region."""
    regions: dict[int, str | None] = {}
    with StreamClient.connect(url) as client:
        client.create_stream(stream)
        for g in range(groups):
            names: list[str | None] = [None if g == 4 else REGIONS[g % 3]] * per_group
            if g == 7:
                names = ["eu" if i % 2 else "us" for i in range(per_group)]
            base = len(regions)
            client.publish(stream, [OutboundMessage(b"%d" % (base + i), None if r is None else {"region": r})
                                    for i, r in enumerate(names)],
                           batch_size=per_group, filter_property="region")
            regions.update({base + i: r for i, r in enumerate(names)})
    return regions


def source(url: str, **options: Any) -> RabbitMQStreamDataSource:
    return RabbitMQStreamDataSource({"url": url, "filterPushdown": "true", "filterValueProperty": "region",
                                     **options})


def read_all(reader: Any) -> tuple[list[dict[str, Any]], ReadStats]:
    """Every row the reader's planned slices yield, and what the broker sent for them."""
    stats = ReadStats()
    rows = []
    for p in reader.partitions():
        for piece in getattr(p, "slices", [p]):
            assert isinstance(piece, StreamSlice)
            rows += [r for b in read_slice(reader.options, piece, stats=stats) for r in b.to_pylist()]
    return rows, stats


def test_filter_value_equality_and_in_are_pushed_to_the_broker(pushdown: Any, rabbitmq_url: str,
                                                                stream_name: Any) -> None:
    spark = pushdown
    s = stream_name("sfilt")
    regions = publish_regions(rabbitmq_url, s)

    # the plan: Spark hands the source the filter and the source keeps it (nothing left for Spark)
    reader = source(rabbitmq_url, stream=s).reader(WITH_FILTER)
    assert list(reader.pushFilters([In(("filter_value",), ("eu", "apac"))])) == []
    assert reader.options.pushed.filter_values == {"eu", "apac"}
    rows, pushed = read_all(reader)
    assert sorted(r["offset"] for r in rows) == sorted(o for o, r in regions.items() if r in ("eu", "apac"))
    assert {r["filter_value"] for r in rows} == {"eu", "apac"}
    assert all(dict(r["application_properties"])["region"] == r["filter_value"] for r in rows)

    # pruned: the same slices read in full cost more chunks and bytes
    _, full = read_all(source(rabbitmq_url, stream=s).reader(WITH_FILTER))
    assert pushed.filtered and not full.filtered
    assert pushed.chunks < full.chunks and pushed.chunk_bytes < full.chunk_bytes, (pushed, full)
    # 4 eu + 4 apac groups of 12, the unfiltered group and the mixed one: about 10/12 of the bytes
    assert pushed.chunk_bytes <= 0.9 * full.chunk_bytes, (pushed, full)

    narrow = source(rabbitmq_url, stream=s).reader(WITH_FILTER)
    not_null = IsNotNull(("filter_value",))
    assert list(narrow.pushFilters([EqualTo(("filter_value",), "us"), not_null])) == [not_null]
    us_rows, us_stats = read_all(narrow)
    assert sorted(r["offset"] for r in us_rows) == sorted(o for o, r in regions.items() if r == "us")
    assert us_stats.chunk_bytes < 0.5 * full.chunk_bytes, (us_stats, full)  # 4 us, unfiltered, mixed

    # through Spark: the same rows as Spark's own filter over the full read
    for condition in (F.col("filter_value") == "eu", F.col("filter_value").isin("us", "apac")):
        got = read_df(spark, rabbitmq_url, stream=s, filterPushdown="true", filterValueProperty="region"
                      ).filter(condition).select("offset", "filter_value").collect()
        want = read_df(spark, rabbitmq_url, stream=s, filterValueProperty="region"
                       ).filter(condition).select("offset", "filter_value").collect()
        assert sorted(got) == sorted(want) and len(got) > 0


def test_the_filter_column_only_when_declared(spark: Any, rabbitmq_url: str, stream_name: Any) -> None:
    s = stream_name("sfiltcol")
    publish_regions(rabbitmq_url, s, groups=3, per_group=4)
    assert "filter_value" not in read_df(spark, rabbitmq_url, stream=s).columns
    df = read_df(spark, rabbitmq_url, stream=s, filterValueColumn="region", columns="offset,filter_value")
    assert df.columns == ["offset", "filter_value"]
    assert sorted(df.collect()) == [(o, REGIONS[o // 4]) for o in range(12)]
    # properties=none: the map is decoded for filter_value only and stays null, as asked
    df = read_df(spark, rabbitmq_url, stream=s, filterValueProperty="region", properties="none")
    assert {(r["application_properties"], r["filter_value"]) for r in df.collect()} == {
        (None, region) for region in REGIONS}
    with pytest.raises(PlanningError, match=r"option 'columns' names unknown columns \['filter_value'\]"):
        RabbitMQStreamDataSource({"url": rabbitmq_url, "stream": s, "columns": "filter_value"}).schema()
    with pytest.raises(PlanningError, match="give 'filterValueProperty' or its alias 'filterValueColumn'"):
        source(rabbitmq_url, stream=s, filterValueColumn="region").schema()


def test_on_a_broker_without_filtering_the_read_is_whole_and_exact(broker_310: Broker, stream_name: Any
                                                                   ) -> None:
    """3.10 has no filter values (publishers cannot set them) and ignores ``filter.N``: the pushed filter
    reads every chunk and is applied to the rows, the same answer, unpruned."""
    s = stream_name("sfilt310", broker=broker_310)
    with StreamClient.connect(broker_310.url) as client:
        client.create_stream(s)
        for region in REGIONS:
            client.publish(s, [b"a", b"b"], application_properties={"region": region})
    reader = source(broker_310.url, stream=s).reader(WITH_FILTER)
    assert list(reader.pushFilters([EqualTo(("filter_value",), "us")])) == []
    rows, stats = read_all(reader)
    assert [(r["offset"], r["filter_value"]) for r in rows] == [(2, "us"), (3, "us")]
    assert not stats.filtered and stats.chunks == 3


def test_streaming_has_the_same_filter_column(spark: Any, rabbitmq_url: str, stream_name: Any,
                                              tmp_path: Any) -> None:
    """Batch and streaming agree: the declared property gives readStream the same column; Spark 4.2
    offers a streaming reader no filters, so the query filters it in Spark."""
    s = stream_name("sfiltstream")
    regions = publish_regions(rabbitmq_url, s, groups=6, per_group=10)
    df = (spark.readStream.format("rabbitmq_stream").option("url", rabbitmq_url).option("stream", s)
          .option("startingOffsets", "earliest").option("filterValueProperty", "region").load())
    assert df.schema == WITH_FILTER
    q = (df.filter(F.col("filter_value") == "us").select("offset", "filter_value").writeStream
         .format("memory").queryName("sfiltstream").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    try:
        q.awaitTermination(180)
    finally:
        q.stop()
    got = sorted(tuple(r) for r in spark.sql("select * from sfiltstream").collect())
    assert got == sorted((o, "us") for o, r in regions.items() if r == "us") and got
