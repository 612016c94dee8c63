"""The ``mewbase`` PySpark data source: exact, bounded, parallel reads of mewbase channels.

A channel is an offset-addressed log like a stream partition (positions increase with gaps), so
planning is the ``rabbitmq_stream`` source's: :mod:`streamledger.spark.planning` resolves the options
to one ``[start, end)`` per channel against a :class:`~streamledger.protocol.mewbase.MewbaseLog` on the
driver side and cuts it into contiguous slices in position space. Each task opens its own connection,
reads its slice with ``MewbaseLog.read_range`` (exactly the events with ``start <= pos < end``; an end
the server does not hold fails after ``timeout`` seconds of silence, never hangs) and yields Arrow
batches.

The first four columns are the log-neutral ones every source shares (``stream``, ``offset``, a
timestamp, ``body``), so the job's verification and downstream readers treat both sources alike.
Nothing here imports the mewbase client (nor ``bson``) until a read is planned: registering the source
costs nothing for users of RabbitMQ alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from streamledger.schemas import MEWBASE_ARROW_SCHEMA, MEWBASE_SCHEMA_DDL
from streamledger.spark.arrow import stream_column, timestamp_column
from streamledger.spark.datasource import SliceReader, StreamSlice, check_runs
from streamledger.spark.planning import (
    OffsetBound,
    PlannedRange,
    PlanningError,
    Selection,
    option_getter,
    plan_ranges,
    refuse_ledger_options,
    refuse_transform_options,
)

log = logging.getLogger(__name__)

MEWBASE_SOURCE_NAME = "mewbase"
DEFAULT_BATCH_ROWS = 65536
DEFAULT_TIMEOUT = 10.0
#: Events per protocol batch: small enough to keep a task's memory flat, big enough to amortise.
READ_BATCH_EVENTS = 2000

ChannelSlice = StreamSlice
"""One task's work: the events of channel ``stream`` with ``start <= pos < end``."""


@dataclass(frozen=True)
class MewbaseReadOptions(Selection):
    """The options, parsed and validated once (values arrive as strings). Which channels, their
    bounds and slicing are the shared :class:`Selection` (the same rules as the stream source)."""

    url: str = field(repr=False)  # may carry a password: never in a repr or a log line
    decode: Literal["bson", "raw"]
    timeout: float

    @property
    def channels(self) -> tuple[str, ...]:
        return self.names

    @classmethod
    def parse(cls, options: Any) -> MewbaseReadOptions:
        get = option_getter(options)

        name = MEWBASE_SOURCE_NAME
        url = get("url")
        if not url:
            raise PlanningError(f"{name}: option 'url' is required (mewbase://[user:pass@]host:port)")
        if not url.strip().lower().startswith("mewbase://"):
            raise PlanningError(f"{name}: option 'url' must be a mewbase:// URL")
        selection = Selection.parse_options(get, source=name, names_key="channel",
                                            default_batch_rows=DEFAULT_BATCH_ROWS)
        decode = (get("decode") or "bson").strip().lower()
        if decode not in ("bson", "raw"):
            raise PlanningError(f"{name}: option 'decode' must be bson or raw, got {decode!r}")
        timeout_text = get("timeout")
        try:
            timeout = DEFAULT_TIMEOUT if timeout_text is None else float(timeout_text)
        except ValueError:
            raise PlanningError(f"{name}: option 'timeout' must be seconds, got {timeout_text!r}") from None
        if not timeout > 0:
            raise PlanningError(f"{name}: option 'timeout' must be positive, got {timeout_text!r}")
        return cls(
            **{f.name: getattr(selection, f.name) for f in fields(Selection)},
            url=url,
            decode=decode,  # type: ignore[arg-type]
            timeout=timeout,
        )

    def bounds(self) -> dict[str, tuple[OffsetBound, OffsetBound]]:
        return self.log_bounds()

    def connect(self) -> Any:
        from streamledger.protocol.mewbase import MewbaseLog

        return MewbaseLog.connect(self.url, timeout=self.timeout)


def plan(options: MewbaseReadOptions) -> list[PlannedRange]:
    """Connect once and resolve the options to one range per channel."""
    with options.connect() as mlog:
        return plan_ranges(mlog, options.bounds(), fail_on_data_loss=options.fail_on_data_loss,
                           timestamp_strategy=options.times.strategy)


def to_arrow(
    channel: str,
    positions: Sequence[int],
    timestamps: Sequence[int],
    events: Sequence[bytes],
    texts: Sequence[str] | None,
) -> pa.RecordBatch:
    """One Arrow batch with :data:`MEWBASE_ARROW_SCHEMA`; ``texts`` None leaves ``event_json`` null."""
    n = len(positions)
    return pa.RecordBatch.from_arrays(
        [
            stream_column(channel, n),
            pa.array(positions, type=pa.int64()),
            timestamp_column(timestamps),
            pa.array(events, type=pa.binary()),
            pa.nulls(n, type=pa.string()) if texts is None else pa.array(texts, type=pa.string()),
        ],
        schema=MEWBASE_ARROW_SCHEMA,
    )


def read_slice(options: MewbaseReadOptions, part: StreamSlice) -> Iterator[pa.RecordBatch]:
    """Yield the slice's events as Arrow batches of about ``batch_rows`` rows (or ``batch_bytes`` of
    events, when set)."""
    if part.start >= part.end:
        return
    positions: list[int] = []
    timestamps: list[int] = []
    events: list[bytes] = []
    texts: list[str] | None = [] if options.decode == "bson" else None
    held = 0  # bytes of the events in hand
    most = options.batch_bytes

    def flush() -> pa.RecordBatch:
        nonlocal held
        batch = to_arrow(part.stream, positions, timestamps, events, texts)
        held = 0
        positions.clear()
        timestamps.clear()
        events.clear()
        if texts is not None:
            texts.clear()
        return batch

    # The job's manifest counts records without a distinct count: positions must strictly increase
    # inside the slice (checked like the stream source does; each event is a run of one).
    after = part.start - 1
    with options.connect() as mlog:
        start = part.start
        if not options.fail_on_data_loss:
            first = mlog.first_offset(part.stream)
            if first > start:
                log.warning(
                    "channel %r: positions [%d, %d) are gone since planning; skipped",
                    part.stream, start, min(first, part.end),
                )
                start = min(first, part.end)
        batches = mlog.read_range(
            part.stream, start, part.end, timeout=options.timeout,
            batch_events=min(options.batch_rows, READ_BATCH_EVENTS),
        )
        for batch in batches:
            after = check_runs(part, after, batch.positions, [1] * len(batch.positions), what="channel")
            positions.extend(batch.positions)
            timestamps.extend(batch.timestamps)
            events.extend(batch.events)
            if texts is not None:
                texts.extend(batch.json_texts())
            if most is not None:
                held += sum(map(len, batch.events))
            if len(positions) >= options.batch_rows or (most is not None and held >= most):
                yield flush()
    if positions:
        yield flush()


class MewbaseReader(SliceReader):
    """Plans against the mewbase server and reads each slice over its own connection."""

    noun = "channel"

    def plan(self) -> list[PlannedRange]:
        return plan(self.options)

    def read_slice(self, part: StreamSlice) -> Iterator[Any]:
        return read_slice(self.options, part)


class MewbaseDataSource(DataSource):
    """Bounded batch reads of mewbase channels, registered as ``mewbase``.

    Options (strings; keys are case-insensitive):

    * ``url`` (required): ``mewbase://[user:pass@]host:port``.
    * ``channel``: one channel or a comma list; or ``ranges``: JSON ``{"channel": [start, end], ...}``,
      exact half-open position ranges.
    * ``startingOffsets`` (default ``earliest``) / ``endingOffsets`` (default ``latest`` = last position
      + 1 at planning time): ``earliest``, ``latest``, a position, ``{"timestamp": ms}`` (the first event
      persisted at or after ``ms``) or per-channel JSON. The end is exclusive.
    * ``maxRecordsPerPartition`` / ``splitsPerStream``: cut each range into slices (position space).
    * ``failOnDataLoss`` (default ``true``): a start below the channel's first position fails; ``false``
      starts at the first position and logs the skipped span.
    * ``decode``: ``bson`` (default; ``event_json`` filled) or ``raw`` (``event_json`` null, faster).
    * ``batchRows``: Arrow batch size (default 65536). ``timeout``: seconds of silence after which a
      read whose end the server does not hold fails (default 10).

    Schema: ``stream STRING`` (the channel), ``offset LONG`` (the position), ``timestamp TIMESTAMP``
    (when the server persisted the event), ``body BINARY`` (the event's BSON document as received),
    ``event_json STRING`` (the event as relaxed Extended JSON).

    Example::

        df = (spark.read.format("mewbase").option("url", "mewbase://127.0.0.1:7451")
              .option("ranges", '{"orders": [0, 90000]}').option("splitsPerStream", 4).load())
    """

    @classmethod
    def name(cls) -> str:
        return MEWBASE_SOURCE_NAME

    def schema(self) -> str:
        return MEWBASE_SCHEMA_DDL

    def reader(self, schema: StructType) -> MewbaseReader:
        refuse_ledger_options(self.options, MEWBASE_SOURCE_NAME)
        refuse_transform_options(self.options, MEWBASE_SOURCE_NAME)
        names = [f.name for f in schema.fields]
        if names != MEWBASE_ARROW_SCHEMA.names:
            raise PlanningError(
                f"{MEWBASE_SOURCE_NAME}: the schema is fixed ({MEWBASE_SCHEMA_DDL}); got columns {names}"
            )
        return MewbaseReader(MewbaseReadOptions.parse(self.options))
