"""Issue 34: the Kafka-named options of ``rabbitmq_stream`` against the real RabbitMQ 4.3 broker.

The planner and the streaming reader are driven directly (what Spark's planner process calls), so each
rule is checked on the offsets it produces; test_source_spark.py runs the same options through Spark.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    ReadMinRows,
)

from streamledger.protocol.rabbitmq import StreamClient
from streamledger.spark.datasource import ReadOptions, StreamSlice, plan
from streamledger.spark.planning import PlanningError
from streamledger.spark.streaming import RabbitMQStreamMicroBatchReader, StreamingError, StreamingOptions
from tests.integration.spark.helpers import create_stream, publish

pytestmark = [pytest.mark.rabbitmq]


def two_eras(url: str, a: str, b: str) -> int:
    """``a``: 30 records, then (a later chunk timestamp) 20 more; ``b``: 10 records before the cut.
    Returns the cut (ms)."""
    create_stream(url, a, 30)
    create_stream(url, b, 10)
    time.sleep(1.1)
    cut = int(time.time() * 1000)
    time.sleep(0.1)
    publish(url, a, 20, start=30)
    return cut


def ranges(url: str, **options: Any) -> dict[str, tuple[int, int]]:
    return {r.stream: (r.start, r.end) for r in plan(ReadOptions.parse({"url": url, **options}))}


def test_timestamp_options_precedence_and_strategy(rabbitmq_url: str, stream_name: Any) -> None:
    a, b = stream_name("tsa"), stream_name("tsb")
    cut = two_eras(rabbitmq_url, a, b)
    both = f"{a},{b}"

    # b has no chunk stamped at or after the cut: Kafka's default strategy is an error naming it
    past = rf"stream '{b}': no committed chunk is stamped at or after {cut}"
    with pytest.raises(PlanningError, match=past):
        ranges(rabbitmq_url, stream=both, startingTimestamp=str(cut))
    assert ranges(rabbitmq_url, stream=both, startingTimestamp=str(cut),
                  startingOffsetsByTimestampStrategy="latest") == {a: (30, 50), b: (10, 10)}
    # per stream; the others take startingOffsets
    assert ranges(rabbitmq_url, stream=both, startingOffsets="5",
                  startingOffsetsByTimestamp=json.dumps({a: cut})) == {a: (30, 50), b: (5, 10)}
    # startingTimestamp wins over startingOffsetsByTimestamp, which wins over startingOffsets
    assert ranges(rabbitmq_url, stream=a, startingOffsets="1", startingTimestamp="0",
                  startingOffsetsByTimestamp=json.dumps({a: cut})) == {a: (0, 50)}
    assert ranges(rabbitmq_url, stream=a, startingOffsets="1",
                  startingOffsetsByTimestamp=json.dumps({a: cut})) == {a: (30, 50)}
    # ends: a timestamp past the last chunk is the tail
    assert ranges(rabbitmq_url, stream=both, endingTimestamp=str(cut)) == {a: (0, 30), b: (0, 10)}
    assert ranges(rabbitmq_url, stream=both, endingOffsets="8",
                  endingOffsetsByTimestamp=json.dumps({a: cut})) == {a: (0, 30), b: (0, 8)}
    # our own {"timestamp": ms} form obeys the same strategy
    with pytest.raises(PlanningError, match=rf"stream '{b}'"):
        ranges(rabbitmq_url, stream=b, startingOffsets=json.dumps({"timestamp": cut}))

    for bad, message in (
        ({"startingOffsetsByTimestamp": json.dumps({"nope": 1})}, r"unknown stream\(s\) \['nope'\]"),
        ({"startingOffsetsByTimestampStrategy": "maybe"}, r"expected error or latest"),
        ({"endingTimestamp": "soon"}, r"endingTimestamp: expected an integer"),
        ({"startingOffsetsByTimestamp": "[1]"}, r"expected a JSON object"),
    ):
        with pytest.raises(PlanningError, match=message):
            ranges(rabbitmq_url, stream=a, **bad)
    with pytest.raises(PlanningError, match=r"'ranges' fixes both ends"):
        ReadOptions.parse({"url": rabbitmq_url, "ranges": json.dumps({a: [0, 1]}), "startingTimestamp": "1"})


def stream_reader(url: str, **options: Any) -> RabbitMQStreamMicroBatchReader:
    return RabbitMQStreamMicroBatchReader(StreamingOptions.parse({"url": url, **options}))


def test_streaming_start_by_timestamp(rabbitmq_url: str, stream_name: Any) -> None:
    a, b = stream_name("sta"), stream_name("stb")
    cut = two_eras(rabbitmq_url, a, b)
    reader = stream_reader(rabbitmq_url, stream=f"{a},{b}", startingOffsetsByTimestamp=json.dumps({a: cut}),
                           startingOffsets="earliest")
    try:
        assert reader.initialOffset()["offsets"] == {a: 30, b: 0}
    finally:
        reader.stop()
    reader = stream_reader(rabbitmq_url, stream=f"{a},{b}", startingTimestamp=str(cut))
    try:
        with pytest.raises(PlanningError, match=rf"stream '{b}'"):
            reader.initialOffset()
    finally:
        reader.stop()
    with pytest.raises(PlanningError, match=r"'endingTimestamp' is for batch reads"):
        StreamingOptions.parse({"url": rabbitmq_url, "stream": a, "endingTimestamp": "1"})


def test_default_read_limit_and_the_limits_spark_passes(rabbitmq_url: str, stream_name: Any) -> None:
    s = stream_name("limits")
    create_stream(rabbitmq_url, s, 100)
    def default(**options: str) -> Any:
        return stream_reader(rabbitmq_url, stream=s, **options).getDefaultReadLimit()

    assert default() == ReadAllAvailable()
    assert default(maxRecordsPerTrigger="7") == ReadMaxRows(7)
    assert default(maxBytesPerTrigger="2k") == ReadMaxBytes(2048)
    assert default(minOffsetsPerTrigger="5", maxOffsetsPerTrigger="9") == ReadMinRows(5)
    for bad, message in (({"minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"}, r"is above"),
                         ({"maxTriggerDelay": "5s"}, r"needs minOffsetsPerTrigger"),
                         ({"minOffsetsPerTrigger": "1", "maxTriggerDelay": "soon"}, r"maxTriggerDelay"),
                         ({"maxBytesPerTrigger": "-3"}, r"maxBytesPerTrigger")):
        with pytest.raises(PlanningError, match=message):
            StreamingOptions.parse({"url": rabbitmq_url, "stream": s, **bad})

    reader = stream_reader(rabbitmq_url, stream=s, startingOffsets="earliest", maxOffsetsPerTrigger="30")
    try:
        initial = reader.initialOffset()
        # the configured cap and a tighter one Spark passes both hold; ReadAllAvailable overrides
        assert reader.latestOffset(initial, ReadMaxRows(10))["offsets"] == {s: 10}
        assert reader.latestOffset(initial, ReadMaxRows(1000))["offsets"] == {s: 30}
        assert reader.latestOffset(initial, ReadAllAvailable())["offsets"] == {s: 100}
        assert reader.latestOffset(initial, ReadMaxFiles(1))["offsets"] == {s: 30}  # no files: n/a
    finally:
        reader.stop()


def test_min_offsets_wait_up_to_max_trigger_delay(rabbitmq_url: str, stream_name: Any) -> None:
    s = stream_name("minoff")
    create_stream(rabbitmq_url, s, 10)
    reader = stream_reader(rabbitmq_url, stream=s, startingOffsets="earliest", minOffsetsPerTrigger="50",
                           maxTriggerDelay="2s")
    try:
        limit = reader.getDefaultReadLimit()
        initial = reader.initialOffset()
        first = reader.latestOffset(initial, limit)  # the first trigger never waits (Kafka's)
        assert first["offsets"] == {s: 10}
        publish(rabbitmq_url, s, 20, start=10)
        assert reader.latestOffset(first, limit) is first  # 20 < 50 and the delay has not passed
        publish(rabbitmq_url, s, 30, start=30)
        second = reader.latestOffset(first, limit)  # 50 new offsets: no wait
        assert second["offsets"] == {s: 60}
        publish(rabbitmq_url, s, 5, start=60)
        assert reader.latestOffset(second, limit) is second
        time.sleep(2.1)
        assert reader.latestOffset(second, limit)["offsets"] == {s: 65}  # the delay passed

        publish(rabbitmq_url, s, 3, start=65)
        assert reader.latestOffset(second, limit) is second  # 8 < 50, and a batch was just admitted
        reader.prepareForTriggerAvailableNow()  # AvailableNow ignores the minimum (it must finish)
        assert reader.latestOffset(second, limit)["offsets"] == {s: 68}
    finally:
        reader.stop()


def test_max_bytes_per_trigger(rabbitmq_url: str, stream_name: Any) -> None:
    s = stream_name("maxbytes")
    create_stream(rabbitmq_url, s)
    with StreamClient.connect(rabbitmq_url) as client:
        client.publish(s, [bytes([65 + i % 26]) * 1000 for i in range(200)], batch_size=200)
        per_offset = client.bytes_per_offset(s)
    assert per_offset is not None and 1000 < per_offset < 1200  # body + AMQP sections + entry header
    reader = stream_reader(rabbitmq_url, stream=s, startingOffsets="earliest", maxBytesPerTrigger="20k")
    try:
        limit = reader.getDefaultReadLimit()
        start = reader.initialOffset()
        widths = []
        while True:
            end = reader.latestOffset(start, limit)
            if end is start:
                break
            widths.append(end["offsets"][s] - start["offsets"][s])
            start = end
        assert sum(widths) == 200
        assert all(w * per_offset <= 20 * 1024 for w in widths)
        assert 16 <= widths[0] <= 20 and len(widths) >= 10
        # a tiny budget still moves: one offset per trigger
        tiny = stream_reader(rabbitmq_url, stream=s, startingOffsets="earliest", maxBytesPerTrigger="10")
        try:
            assert tiny.latestOffset(tiny.initialOffset(), tiny.getDefaultReadLimit())["offsets"] == {s: 1}
        finally:
            tiny.stop()
    finally:
        reader.stop()


@pytest.mark.parametrize("fail", [True, False])
def test_fail_on_data_loss_when_the_tail_falls_below_the_checkpoint(
    rabbitmq_url: str, stream_name: Any, fail: bool
) -> None:
    """Kafka's failOnDataLoss also covers a topic deleted and recreated: here the stream's tail falls
    below the offset the query already reached."""
    s = stream_name("recreated")
    create_stream(rabbitmq_url, s, 40)
    reader = stream_reader(rabbitmq_url, stream=s, startingOffsets="earliest",
                           failOnDataLoss=str(fail).lower())
    try:
        first = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        assert first["offsets"] == {s: 40}
        with StreamClient.connect(rabbitmq_url) as client:
            client.delete_stream(s)
        create_stream(rabbitmq_url, s, 15)
        reader.stop()  # the live connection's view of the old stream goes with it
        if fail:
            with pytest.raises(StreamingError, match=rf"stream '{s}': the committed tail 15 is below the "
                                                     r"query's offset 40"):
                reader.latestOffset(first, ReadAllAvailable())
            return
        again = reader.latestOffset(first, ReadAllAvailable())
        assert again["offsets"] == {s: 15} and again["from"] == {s: 0}
        parts = [p for p in reader.partitions(first, again) if isinstance(p, StreamSlice)]
        assert [(p.stream, p.start, p.end) for p in parts] == [(s, 0, 15)]
    finally:
        reader.stop()
