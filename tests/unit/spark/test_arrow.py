"""The Arrow conversion must produce exactly the schema Spark derives, or Spark rejects every batch."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamledger.spark.arrow import ARROW_SCHEMA, STRING_MAP, map_column, stringify, to_arrow


def spark_schema() -> StructType:
    m = MapType(StringType(), StringType(), True)
    return StructType(
        [
            StructField("stream", StringType()),
            StructField("offset", LongType()),
            StructField("chunk_timestamp", TimestampType()),
            StructField("body", BinaryType()),
            StructField("properties", m),
            StructField("application_properties", m),
            StructField("message_annotations", m),
        ]
    )


def test_schema_is_what_spark_derives() -> None:
    assert to_arrow_schema(spark_schema(), timezone="UTC").equals(ARROW_SCHEMA)


def test_to_arrow_columns_and_types() -> None:
    batch = to_arrow(
        "s-0",
        [10, 12],
        [1_700_000_000_123, 1_700_000_000_123],
        [b"a", b"\x00\xff"],
        [{"message_id": 7, "content_type": "text/plain"}, None],
        [{"flag": True, "n": 3, "blob": b"\xff\xfe"}, {}],
        None,
    )
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert [r["stream"] for r in rows] == ["s-0", "s-0"]
    assert [r["offset"] for r in rows] == [10, 12]
    assert rows[0]["chunk_timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC)
    assert rows[1]["body"] == b"\x00\xff"
    assert dict(rows[0]["properties"]) == {"message_id": "7", "content_type": "text/plain"}
    assert rows[1]["properties"] is None
    assert dict(rows[0]["application_properties"]) == {"flag": "true", "n": "3", "blob": "base64://4="}
    assert rows[1]["application_properties"] == []
    assert rows[0]["message_annotations"] is None


def test_empty_batch_keeps_schema() -> None:
    batch = to_arrow("s", [], [], [])
    assert batch.num_rows == 0 and batch.schema.equals(ARROW_SCHEMA)


def test_mismatched_columns_name_the_stream() -> None:
    with pytest.raises(ValueError, match="'s-1'"):
        to_arrow("s-1", [1, 2], [0], [b"x", b"y"])


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("x", "x"),
        (False, "false"),
        (12, "12"),
        (1.5, "1.5"),
        (b"caf\xc3\xa9", "café"),
        (dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "2024-01-02T03:04:05+00:00"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (None, None),
    ],
)
def test_stringify(value: object, text: str | None) -> None:
    assert stringify(value) == text


def test_map_column_all_null_when_missing() -> None:
    col = map_column(None, 3)
    assert col.type == STRING_MAP and col.null_count == 3


# ---------------------------------------------------------------- Arrow straight from the buffer layout


def _buffer_batch(chunks: list[bytes], decode: str = "amqp") -> Any:
    from streamledger.protocol.rabbitmq.chunk import decode_chunk_buffers
    from streamledger.protocol.rabbitmq.records import BufferBatch

    out = BufferBatch.empty("s-0")
    for c in chunks:
        decode_chunk_buffers(c, 0, start=0, end=2**64, decode=decode, verify_crc=True,  # type: ignore[arg-type]
                             maps=True, out=out)
    return out


def _chunks() -> list[bytes]:
    from streamledger.protocol.rabbitmq.amqp import encode_message
    from streamledger.protocol.rabbitmq.chunk import build_chunk

    plain = [encode_message(b"m%d" % i * (i % 9)) for i in range(300)]
    props = [encode_message(b"p%d" % i, application_properties={"i": i, "b": b"\xff"},
                            properties={"message-id": i}) for i in range(50)]
    return [build_chunk(plain[:200], first_offset=1_000, timestamp=1_700_000_000_123),
            build_chunk(plain[200:], first_offset=1_210, timestamp=1_700_000_000_456),  # gap of 10
            build_chunk(props, first_offset=1_400, timestamp=1_700_000_001_000)]


@pytest.mark.parametrize("decode", ["amqp", "raw"])
def test_buffers_to_arrow_equals_to_arrow(decode: str) -> None:
    from streamledger.spark.arrow import buffers_to_arrow

    batch = _buffer_batch(_chunks(), decode)
    lists = batch.to_record_batch()
    expected = to_arrow("s-0", lists.offsets, lists.chunk_timestamps, lists.bodies, lists.properties,
                        lists.application_properties, lists.message_annotations)
    got = buffers_to_arrow(batch)
    assert got.schema.equals(ARROW_SCHEMA)
    assert got.equals(expected)
    # a map column not asked for is all null, whatever the records hold
    only_app = buffers_to_arrow(batch, ("application_properties",))
    assert only_app.column(4).null_count == len(batch)
    assert only_app.column(5).equals(expected.column(5))


def test_buffers_to_arrow_wraps_the_bodies_without_copying() -> None:
    from streamledger.spark.arrow import buffers_to_arrow

    batch = _buffer_batch(_chunks()[:1])
    body = buffers_to_arrow(batch).column(3)
    assert body.buffers()[2].address == pa.py_buffer(batch.body_data).address


def test_buffers_to_arrow_empty_and_single_stream_column_reuse() -> None:
    from streamledger.protocol.rabbitmq.records import BufferBatch
    from streamledger.spark.arrow import buffers_to_arrow

    empty = buffers_to_arrow(BufferBatch.empty("x"))
    assert empty.num_rows == 0 and empty.schema.equals(ARROW_SCHEMA)
    batch = _buffer_batch(_chunks())
    a, b = buffers_to_arrow(batch), buffers_to_arrow(batch)
    assert a.column(0).to_pylist() == ["s-0"] * len(batch) == b.column(0).to_pylist()


def test_check_runs_refuses_repeats_and_escapes() -> None:
    from streamledger.spark.datasource import SliceCheckError, StreamSlice, check_runs

    part = StreamSlice("s", 10, 100)
    assert check_runs(part, 9, [10, 50], [20, 50]) == 99
    with pytest.raises(SliceCheckError, match=r"stream 's': the read of slice \[10, 100\)"):
        check_runs(part, 29, [25], [5])  # repeats 25..29
    with pytest.raises(SliceCheckError):
        check_runs(part, 9, [95], [10])  # past the slice's end
    with pytest.raises(SliceCheckError):
        check_runs(part, 3, [5], [2])  # before the slice's start
