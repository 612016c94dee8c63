"""The ``mewbase`` data source without a server: schema, shim, options, Arrow batches."""

from __future__ import annotations

import importlib

import bson
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

from streamledger.spark.mewbase_source import (
    MEWBASE_ARROW_SCHEMA,
    MEWBASE_SCHEMA_DDL,
    MewbaseDataSource,
    MewbaseReadOptions,
    to_arrow,
)
from streamledger.spark.planning import PlanningError


def test_arrow_schema_is_what_spark_derives() -> None:
    schema = StructType([
        StructField("stream", StringType()), StructField("offset", LongType()),
        StructField("timestamp", TimestampType()), StructField("body", BinaryType()),
        StructField("event_json", StringType()),
    ])
    ddl = ", ".join(f"{f.name} {f.dataType.simpleString().upper()}" for f in schema.fields)
    assert ddl.replace("BIGINT", "LONG") == MEWBASE_SCHEMA_DDL
    assert to_arrow_schema(schema, timezone="UTC").equals(MEWBASE_ARROW_SCHEMA)


def test_log_neutral_columns_come_first() -> None:
    from streamledger.spark.arrow import ARROW_SCHEMA

    # the job's verification reads stream/offset of either source alike
    assert MEWBASE_ARROW_SCHEMA.names[:2] == ARROW_SCHEMA.names[:2] == ["stream", "offset"]
    assert MEWBASE_ARROW_SCHEMA.field("offset").type == ARROW_SCHEMA.field("offset").type
    assert MEWBASE_ARROW_SCHEMA.names[3] == ARROW_SCHEMA.names[3] == "body"


def test_shim_exposes_the_source() -> None:
    shim = importlib.import_module("pyspark_streamledger_mewbase")
    assert shim.DefaultSource is MewbaseDataSource
    assert MewbaseDataSource.name() == "mewbase"
    doc = MewbaseDataSource.__doc__ or ""
    for option in ("url", "channel", "ranges", "startingOffsets", "endingOffsets", "decode", "timeout",
                   "splitsPerStream", "failOnDataLoss"):
        assert f"``{option}``" in doc, option


def test_options() -> None:
    opts = MewbaseReadOptions.parse({"url": "mewbase://u:secret@h:7451", "channel": "a, b,a",
                                     "splitsPerStream": "3", "timeout": "2.5"})
    assert opts.channels == ("a", "b") and opts.splits_per_stream == 3 and opts.timeout == 2.5
    assert opts.decode == "bson" and "secret" not in repr(opts)
    assert set(opts.bounds()) == {"a", "b"}
    ranged = MewbaseReadOptions.parse({"url": "mewbase://h:1", "ranges": '{"a": [5, 90]}', "decode": "raw"})
    assert ranged.ranges == {"a": (5, 90)} and ranged.decode == "raw"
    bad = [
        ({"channel": "a"}, "'url' is required"),
        ({"url": "rabbitmq-stream://h:5552/", "channel": "a"}, "mewbase:// URL"),
        ({"url": "mewbase://h:1"}, "give 'channel' or 'ranges'"),
        ({"url": "mewbase://h:1", "channel": "a", "ranges": '{"a": [0, 1]}'}, "drop 'channel'"),
        ({"url": "mewbase://h:1", "ranges": '{"a": [0, 1]}', "endingOffsets": "latest"}, "fixes both ends"),
        ({"url": "mewbase://h:1", "channel": "a", "decode": "amqp"}, "bson or raw"),
        ({"url": "mewbase://h:1", "channel": "a", "timeout": "0"}, "positive"),
        ({"url": "mewbase://h:1", "channel": "a", "timeout": "soon"}, "seconds"),
    ]
    for options, message in bad:
        with pytest.raises(PlanningError, match=message):
            MewbaseReadOptions.parse(options)


def test_to_arrow_keeps_bytes_and_positions() -> None:
    events = [bson.encode({"n": 1}), bson.encode({"n": 2, "b": b"\x00\xff"})]
    batch = to_arrow("orders", [8, 4096], [1_700_000_000_001, 1_700_000_000_002], events, ['{"n": 1}', "x"])
    assert batch.schema.equals(MEWBASE_ARROW_SCHEMA)
    assert batch.column("stream").to_pylist() == ["orders", "orders"]
    assert batch.column("offset").to_pylist() == [8, 4096]
    assert batch.column("body").to_pylist() == events
    raw = to_arrow("orders", [8], [1], events[:1], None)
    assert raw.column("event_json").to_pylist() == [None]


def test_rabbitmq_format_points_a_mewbase_url_to_its_own_format() -> None:
    from streamledger.spark.datasource import ReadOptions

    with pytest.raises(PlanningError, match="names a mewbase source; read it with format 'mewbase'"):
        ReadOptions.parse({"url": "mewbase://u:secret@h:7451", "stream": "orders"})


class _RepeatingLog:
    """Test double for a MewbaseLog whose read repeats a position (a server or reader bug)."""

    def __enter__(self) -> _RepeatingLog:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read_range(self, channel: str, start: int, end: int, **_: object):  # type: ignore[no-untyped-def]
        from streamledger.protocol.mewbase.events import EventBatch

        event = bson.encode({"n": 1})
        yield EventBatch(channel, [start, start + 2], [1, 1], [event, event])
        yield EventBatch(channel, [start + 2], [1], [event])


def test_a_repeated_position_never_reaches_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job counts written records without a distinct count, so a slice must refuse a repeat:
    before the mewbase source checked its positions, this slice yielded 3 rows for 2 events."""
    from streamledger.spark.datasource import SliceCheckError, StreamSlice
    from streamledger.spark.mewbase_source import read_slice

    opts = MewbaseReadOptions.parse({"url": "mewbase://h:1", "channel": "orders"})
    monkeypatch.setattr(MewbaseReadOptions, "connect", lambda self: _RepeatingLog())
    with pytest.raises(SliceCheckError, match=r"channel 'orders'.*\[12, 12\] after offset 12"):
        list(read_slice(opts, StreamSlice("orders", 10, 20)))
