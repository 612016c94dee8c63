"""The ``rabbitmq_stream`` PySpark data source: exact, bounded, parallel reads of RabbitMQ streams.

Planning (``partitions()``) runs once, in Spark's planner process on the driver side: it connects, resolves
the options to one ``[start, end)`` per stream (:mod:`streamledger.spark.planning`), splits each range
into contiguous slices and returns them as small picklable :class:`StreamSlice` partitions. Each task
then opens its own connection, reads only its slice with ``StreamClient.read_range`` (which yields
exactly the user records with ``start <= offset < end``) and yields Arrow batches, never Python tuples.
The reader object itself is pickled to the executors, so it holds options only, no connection.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from streamledger.spark.planning import PlannedRange, option_getter, refuse_ledger_options
from streamledger.spark.pushdown import Projection, PushedFilters
from streamledger.spark.reading import (  # the reading kit, below this module and streaming
    DATA_SOURCE_NAME,
    DEFAULT_BATCH_ROWS,
    PACK_OFFSETS,
    ReadOptions,
    SliceCheckError,
    SliceGroup,
    StreamSlice,
    check_runs,
    pack,
    parse_filter_property,
    parse_map_columns,
    plan,
    read_slice,
    read_slices,
    slices_for,
)
from streamledger.spark.summaries import with_summaries

__all__ = [  # the kit's names stay importable from here
    "DATA_SOURCE_NAME",
    "DEFAULT_BATCH_ROWS",
    "PACK_OFFSETS",
    "FilteringReader",
    "RabbitMQStreamDataSource",
    "RabbitMQStreamReader",
    "ReadOptions",
    "SliceCheckError",
    "SliceGroup",
    "SliceReader",
    "StreamSlice",
    "check_runs",
    "pack",
    "parse_map_columns",
    "plan",
    "read_slice",
    "read_slices",
    "slices_for",
    "with_schema",
]

log = logging.getLogger(__name__)


class SliceReader(DataSourceReader):
    """What every log format's reader does: plan once on the driver side (``plan``), cut the planned
    ranges into :class:`StreamSlice` s, read one slice per task (``read_slice``). ``noun`` names the
    format's logs in log lines (stream, channel)."""

    noun = "stream"

    def __init__(self, options: Any) -> None:
        self.options = options

    def plan(self) -> list[PlannedRange]:
        raise NotImplementedError

    def read_slice(self, part: StreamSlice) -> Iterator[Any]:
        raise NotImplementedError

    def read_group(self, parts: Sequence[StreamSlice]) -> Iterator[Any]:
        """A packed task's slices one after the other (a format may share its connection)."""
        return (batch for part in parts for batch in self.read_slice(part))

    def bounded(self, batch_bytes: int) -> SliceReader:
        """This reader with its batches cut at about ``batch_bytes`` of record bodies too (or the
        options' own ``batchBytes`` when smaller): what a task that writes as it reads holds of
        the read at once, whatever the size of its records."""
        own = self.options.batch_bytes
        return type(self)(replace(self.options, batch_bytes=min(own, batch_bytes) if own else batch_bytes))

    def partitions(self) -> list[InputPartition]:
        planned = self.plan()
        for r in planned:
            if r.lost is not None:
                log.warning(
                    "%s %r: offsets [%d, %d) were removed before the read; reading [%d, %d) "
                    "(failOnDataLoss=false)", self.noun, r.stream, r.lost[0], r.lost[1], r.start, r.end,
                )
        return self.tasks(planned)

    def tasks(self, planned: Sequence[PlannedRange], *, spread: int | None = None) -> list[InputPartition]:
        """The read tasks of ranges planned already: slices, small ones packed (the job's Arrow
        writer hands these to its own Spark tasks without planning twice); ``spread``: about how
        many tasks small slices make at least (:func:`pack`)."""
        slices = slices_for(planned, self.options)
        return pack(slices, getattr(self.options, "pack_offsets", PACK_OFFSETS), tasks=spread)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, SliceGroup):
            batches = self.read_group(partition.slices)
        elif isinstance(partition, StreamSlice):
            batches = self.read_slice(partition)
        else:
            # Spark substitutes a placeholder partition when planning returned none (all ranges empty).
            return iter(())
        return with_summaries(batches) if self.options.slice_summaries else batches


class RabbitMQStreamReader(SliceReader):
    """Plans against the broker (a super stream is expanded there) and reads with ``read_range``."""

    def plan(self) -> list[PlannedRange]:
        return plan(self.options)

    def read_slice(self, part: StreamSlice) -> Iterator[Any]:
        return read_slice(self.options, part)

    def read_group(self, parts: Sequence[StreamSlice]) -> Iterator[Any]:
        return read_slices(self.options, parts)


class FilteringReader(RabbitMQStreamReader):
    """The reader with filter pushdown (option ``filterPushdown=true``; Spark's
    ``spark.sql.python.filterPushdown.enabled`` must be true too)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        """Take the filters on ``stream``, ``offset`` and ``chunk_timestamp`` (:mod:`.pushdown`);
        the others stay with Spark."""
        pushed, rest = PushedFilters.split(filters)
        self.options = replace(self.options, pushed=pushed)
        return iter(rest)


class RabbitMQStreamDataSource(DataSource):
    """Bounded batch reads of RabbitMQ streams, registered as ``rabbitmq_stream``.

    Options (all strings; keys are case-insensitive):

    * ``url`` (required): ``rabbitmq-stream://user:pass@host:5552/vhost``.
    * ``stream``: one stream or a comma list, or ``superStream``: all partitions of a super stream.
    * ``ranges``: JSON ``{"stream": [start, end], ...}``, exact half-open ranges (then ``stream`` /
      ``superStream`` / the offset options are not needed).
    * ``startingOffsets`` (default ``earliest``) / ``endingOffsets`` (default ``latest`` = the committed
      tail at planning time): ``earliest``, ``latest``, an offset, ``{"timestamp": ms}`` (first chunk at or
      after ``ms``), or per-stream JSON ``{"s-0": 10, "s-1": "earliest"}``. The end is exclusive.
    * ``maxRecordsPerPartition``: split each range into slices at most this wide (offset space);
      ``splitsPerStream``: split each range into that many slices.
    * ``failOnDataLoss`` (default ``true``): fail when a start is below retention; ``false`` clamps it
      to the first retained offset and logs the lost span.
    * ``decode``: ``amqp`` (default; body = AMQP data, maps filled) or ``raw`` (body = stored record,
      maps null). ``batchRows``: Arrow batch size (default 65536).
    * ``readFrom``: which member of a stream serves a partition's read: ``replica`` (default; the
      advertised address from Metadata, as the Java client reads), ``leader``, or ``url`` (the URL's own
      node, e.g. behind a load balancer whose nodes advertise unreachable addresses).
    * ``packOffsets`` (default 100000): slices narrower than this share a task, up to this many
      offsets per task (many tiny tasks are mostly scheduling); ``0`` gives every slice its own task.
    * ``properties``: which map columns to fill, ``all`` (default), ``none`` or a comma list of
      ``properties``, ``application_properties``, ``message_annotations``; the others are null.

    * Kafka's ``startingTimestamp`` / ``endingTimestamp``, ``startingOffsetsByTimestamp`` /
      ``endingOffsetsByTimestamp``, ``startingOffsetsByTimestampStrategy``; ``columns`` (projection)
      and ``filterPushdown`` (:mod:`streamledger.spark.pushdown`): docs/spark.md, "Options at a glance".

    Schema: ``stream STRING, offset LONG, chunk_timestamp TIMESTAMP, body BINARY,
    properties / application_properties / message_annotations MAP<STRING,STRING>``.

    Streaming (``spark.readStream``) takes the same options except ``ranges``/``endingOffsets``, plus
    ``maxOffsetsPerTrigger`` and the opt-in ledger recording: :mod:`streamledger.spark.streaming`.

    Example::

        spark.dataSource.register(RabbitMQStreamDataSource)   # or rely on the pyspark_streamledger shim
        df = (spark.read.format("rabbitmq_stream")
              .option("url", "rabbitmq-stream://guest:guest@127.0.0.1:5552/")
              .option("superStream", "orders")
              .option("startingOffsets", "earliest").option("endingOffsets", "latest")
              .option("maxRecordsPerPartition", 500000)
              .load())
    """

    @classmethod
    def name(cls) -> str:
        return DATA_SOURCE_NAME

    def schema(self) -> str:
        get = option_getter(self.options)
        return Projection.parse(get("columns"), source=DATA_SOURCE_NAME,
                                filter_column=parse_filter_property(get) is not None).ddl

    def reader(self, schema: StructType) -> RabbitMQStreamReader:
        refuse_ledger_options(self.options, DATA_SOURCE_NAME)
        options = with_schema(ReadOptions.parse(self.options), schema)
        return (FilteringReader if options.filter_pushdown else RabbitMQStreamReader)(options)

    def streamReader(self, schema: StructType) -> Any:
        """``spark.readStream``: see :mod:`streamledger.spark.streaming` (docs/spark.md, "Streaming")."""
        from streamledger.spark.streaming import RabbitMQStreamMicroBatchReader, StreamingOptions

        options = StreamingOptions.parse(self.options)
        return RabbitMQStreamMicroBatchReader(replace(options, read=with_schema(options.read, schema)))


def with_schema(options: ReadOptions, schema: StructType) -> ReadOptions:
    """The read's schema decides the projection: the source's columns (or a subset of them, with
    their types, in any order; ``.schema("offset LONG, body BINARY")``); the Arrow batches are built
    for exactly that schema."""
    from pyspark.sql.pandas.types import to_arrow_type

    fields = [(f.name, to_arrow_type(f.dataType, timezone="UTC")) for f in schema.fields]
    declared = options.filter_property is not None
    return replace(options, projection=Projection.of_schema(fields, source=DATA_SOURCE_NAME,
                                                            filter_column=declared))
