"""The ``rabbitmq_stream`` data source on local[2] against the real RabbitMQ 4.3 broker.

Every test compares Spark's rows with what was published (bodies, offsets): the union of the
partitions must be exactly the records of the planned ranges, with nothing lost or doubled at a
slice boundary.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from streamledger.protocol.rabbitmq import StreamClient
from streamledger.spark.arrow import ARROW_SCHEMA
from tests.integration.spark.helpers import (
    body,
    client_offsets,
    create_stream,
    publish,
    read_df,
    rows_by_stream,
)

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]


def test_single_stream_all_records_with_properties(spark: Any, rabbitmq_url: str, stream_name: Any) -> None:
    s = stream_name("single")
    create_stream(rabbitmq_url, s, 2500)
    df = read_df(spark, rabbitmq_url, stream=s)
    assert df.schema.fieldNames() == ARROW_SCHEMA.names
    rows = df.orderBy("offset").collect()
    assert [r["offset"] for r in rows] == list(range(2500))  # fresh stream: no tracking offsets
    assert [r["body"] for r in rows] == [body(s, i) for i in range(2500)]
    assert {r["stream"] for r in rows} == {s}
    assert all(r["application_properties"] == {"source": "spark-tests"} for r in rows)
    assert all(r["chunk_timestamp"] is not None for r in rows)
    password = urlsplit(rabbitmq_url).password
    if password:  # Spark redacts options named like "url" in plans (spark.sql.redaction.options.regex)
        assert password not in df._jdf.queryExecution().toString()

    raw = read_df(spark, rabbitmq_url, stream=s, decode="raw", endingOffsets="10").collect()
    assert len(raw) == 10
    assert all(r["properties"] is None and r["application_properties"] is None for r in raw)
    assert all(body(s, r["offset"]) in r["body"] for r in raw)  # raw = the whole AMQP message


def test_super_stream_three_partitions(spark: Any, rabbitmq_url: str, stream_name: Any) -> None:
    sup = stream_name.super_stream("orders")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(sup, partitions=3)
        parts = client.partitions(sup)
    assert len(parts) == 3
    counts = dict(zip(parts, (700, 0, 1234), strict=True))  # one partition stays empty
    for p, n in counts.items():
        publish(rabbitmq_url, p, n)

    df = read_df(spark, rabbitmq_url, superStream=sup, maxRecordsPerPartition=400)
    assert df.rdd.getNumPartitions() == 2 + 4  # ceil(700/400) + 0 + ceil(1234/400)
    rows = df.collect()
    got = rows_by_stream(rows)
    assert got == {p: list(range(n)) for p, n in counts.items() if n}
    assert sorted(r["body"] for r in rows) == sorted(body(p, i) for p, n in counts.items() for i in range(n))


def test_ranges_mid_chunk_with_splits(spark: Any, rabbitmq_url: str, stream_name: Any) -> None:
    a, b = stream_name("a"), stream_name("b")
    create_stream(rabbitmq_url, a, 3000)
    create_stream(rabbitmq_url, b, 1000)
    # Ends that are not chunk boundaries (publish batches are 300), sliced into odd widths.
    ranges = {a: [137, 2861], b: [1, 999]}
    df = read_df(spark, rabbitmq_url, ranges=json.dumps(ranges), maxRecordsPerPartition=97)
    assert df.rdd.getNumPartitions() == -(-(2861 - 137) // 97) + -(-(999 - 1) // 97)
    rows = df.collect()
    got = rows_by_stream(rows)
    assert got[a] == list(range(137, 2861)) == client_offsets(rabbitmq_url, a, 137, 2861)
    assert got[b] == list(range(1, 999))
    assert len(rows) == len({(r["stream"], r["offset"]) for r in rows})  # no duplicate at any boundary
    assert all(r["body"] == body(r["stream"], r["offset"]) for r in rows)

    # The same through startingOffsets/endingOffsets, per-stream JSON, and splitsPerStream.
    df2 = read_df(
        spark, rabbitmq_url, stream=f"{a},{b}",
        startingOffsets=json.dumps({a: 137, b: 1}), endingOffsets=json.dumps({a: 2861, b: 999}),
        splitsPerStream=3,
    )
    assert df2.rdd.getNumPartitions() == 6
    assert rows_by_stream(df2.collect()) == got


def test_empty_ranges(spark: Any, rabbitmq_url: str, stream_name: Any) -> None:
    full, empty = stream_name("full"), stream_name("empty")
    create_stream(rabbitmq_url, full, 50)
    create_stream(rabbitmq_url, empty, 0)
    assert read_df(spark, rabbitmq_url, ranges=json.dumps({full: [20, 20]})).count() == 0
    assert read_df(spark, rabbitmq_url, stream=full, startingOffsets="latest").count() == 0
    df = read_df(spark, rabbitmq_url, stream=empty)
    assert df.count() == 0 and df.schema.fieldNames() == ARROW_SCHEMA.names
    both = read_df(spark, rabbitmq_url, stream=f"{full},{empty}", maxRecordsPerPartition=1000)
    assert both.rdd.getNumPartitions() == 1
    assert rows_by_stream(both.collect()) == {full: list(range(50))}


def test_timestamp_bounds(spark: Any, rabbitmq_url: str, stream_name: Any) -> None:
    s = stream_name("ts")
    create_stream(rabbitmq_url, s, 300)
    time.sleep(1.2)
    cut = int(time.time() * 1000)
    time.sleep(0.2)
    publish(rabbitmq_url, s, 200, start=300)
    later = read_df(spark, rabbitmq_url, stream=s, startingOffsets=json.dumps({"timestamp": cut}))
    assert rows_by_stream(later.collect()) == {s: list(range(300, 500))}
    earlier = read_df(spark, rabbitmq_url, stream=s, endingOffsets=json.dumps({"timestamp": cut}))
    assert rows_by_stream(earlier.collect()) == {s: list(range(300))}


def test_end_past_the_tail_is_an_error(spark: Any, rabbitmq_url: str, stream_name: Any) -> None:
    s = stream_name("tail")
    create_stream(rabbitmq_url, s, 10)
    with pytest.raises(Exception, match=r"end offset 50 is past the committed tail 10"):
        read_df(spark, rabbitmq_url, stream=s, endingOffsets="50").collect()


def retention_stream(url: str, stream_name: Any) -> tuple[str, int, int]:
    """A stream whose first offsets were removed by retention: returns (name, first, tail)."""
    s = stream_name("retention")
    create_stream(url, s, 0, max_length_bytes=60_000, max_segment_size_bytes=15_000)
    for i in range(6):
        publish(url, s, 500, start=500 * i, batch_size=100)
    # Retention runs asynchronously after a segment rolls: wait until the first offset settles.
    with StreamClient.connect(url) as client:
        first, stable_since = client.first_offset(s), time.monotonic()
        while time.monotonic() - stable_since < 2.0:
            time.sleep(0.25)
            now = client.first_offset(s)
            if now != first:
                first, stable_since = now, time.monotonic()
        tail = client.committed_tail(s)
    assert 0 < first < tail, (first, tail)
    return s, first, tail


def test_range_below_retention(spark: Any, rabbitmq_url: str, stream_name: Any) -> None:
    s, first, tail = retention_stream(rabbitmq_url, stream_name)
    lost = rf"offset 0 is no longer retained \(first available offset is {first}\)"
    with pytest.raises(Exception, match=lost):
        read_df(spark, rabbitmq_url, ranges=json.dumps({s: [0, tail]})).collect()

    rows = read_df(spark, rabbitmq_url, ranges=json.dumps({s: [0, tail]}), failOnDataLoss="false").collect()
    assert rows_by_stream(rows) == {s: list(range(first, tail))}
    # A range entirely below retention reads nothing (and is not an error) when loss is allowed.
    gone = read_df(spark, rabbitmq_url, ranges=json.dumps({s: [0, first]}), failOnDataLoss="false")
    assert gone.count() == 0
