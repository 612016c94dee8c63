"""The Spark reading kit: the ``rabbitmq_stream`` options (:class:`ReadOptions`), one task's work
(:class:`StreamSlice`, :class:`SliceGroup`) and how a task reads it (:func:`read_slice`).

Both the batch data source (:mod:`streamledger.spark.datasource`) and the streaming reader
(:mod:`streamledger.spark.streaming`) stand on it, so neither imports the other for it.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from streamledger.errors import StreamledgerError
from streamledger.offsets import DataLossError
from streamledger.protocol.rabbitmq.reader import ReadStats
from streamledger.protocol.rabbitmq.records import MAX_BUFFER_BYTES, BufferBatch
from streamledger.sources import find_kind, super_stream_partitions
from streamledger.spark.arrow import MAP_COLUMNS, STRING_MAP, buffers_to_arrow
from streamledger.spark.planning import (
    OffsetBound,
    PlannedRange,
    PlanningError,
    Selection,
    option_getter,
    parse_bool,
    parse_positive_int,
    plan_ranges,
    refuse_transform_options,
)
from streamledger.spark.pushdown import Projection, PushedFilters, with_filter_value

log = logging.getLogger(__name__)

DATA_SOURCE_NAME = "rabbitmq_stream"
DEFAULT_BATCH_ROWS = 65536


@dataclass
class StreamSlice(InputPartition):
    """One task's work: the records of one log (``stream``: a stream, a channel) with
    ``start <= offset < end``."""

    stream: str
    start: int
    end: int


@dataclass
class SliceGroup(InputPartition):
    """Several small slices read by one task, one after the other: many tiny tasks on a small
    cluster are mostly scheduling (issue 24: 100 partitions x 10 records were 100 tasks)."""

    slices: list[StreamSlice]


FIRST_BATCH_ROWS = 4096
"""A slice's first Arrow batch ends after about this many rows, each next one at twice the one
before, up to ``batchRows``: Spark's JVM converts a batch while the task reads the next, so a task
whose slice fits in one ``batchRows`` batch (a pushed window of 40,000 rows) no longer reads it all
before Spark starts on any of it (issue 44)."""

PACK_OFFSETS = 100_000
"""Slices narrower than this (in offsets) are packed into one task until the task's slices add up
to this width (option ``packOffsets``; 0 turns packing off). Wider slices keep a task each."""


def pack(slices: Sequence[StreamSlice], width: int, *, tasks: int | None = None) -> list[InputPartition]:
    """Group consecutive small slices into :class:`SliceGroup` s of at most ``width`` offsets in
    all; a slice at least ``width`` wide, or one of a range that was split (``splitsPerStream``,
    ``maxRecordsPerPartition``: the caller asked for a task per piece), stays alone. Order (and so
    every slice) is kept.

    ``tasks``: about how many tasks the small slices should make at least (e.g. two per core): the
    width shrinks until they spread over that many, so 1,000 ranges of 10 records are not one task
    reading them all on one core while the others idle."""
    per_stream = collections.Counter(piece.stream for piece in slices)
    if tasks and width > 0:
        small = sum(span for piece in slices
                    if (span := piece.end - piece.start) < width and per_stream[piece.stream] == 1)
        width = min(width, max(1, -(-small // tasks)))
    out: list[InputPartition] = []
    group: list[StreamSlice] = []
    size = 0

    def flush() -> None:
        if group:
            out.append(group[0] if len(group) == 1 else SliceGroup(list(group)))
            group.clear()

    for piece in slices:
        span = piece.end - piece.start
        if width <= 0 or span >= width or per_stream[piece.stream] > 1:
            flush()
            size = 0
            out.append(piece)
            continue
        if size + span > width:
            flush()
            size = 0
        group.append(piece)
        size += span
    flush()
    return out


@dataclass(frozen=True)
class ReadOptions(Selection):
    """The data source options, parsed and validated once (values arrive as strings). Which streams,
    their bounds and slicing are the shared :class:`Selection`; the rest is this source's own."""

    url: str = field(repr=False)  # carries credentials: never in a repr or a log line
    super_stream: str | None
    decode: Literal["amqp", "raw"]
    read_from: Literal["replica", "leader", "url"] = "replica"
    #: The map columns to fill (option ``properties``); the others stay null. Building them is ~70 %
    #: of a task's Python time (measured, 500k AMQP records), so a reader that needs bodies only
    #: says ``properties=none``.
    map_columns: tuple[str, ...] = MAP_COLUMNS
    #: Option ``packOffsets``: small slices share a task up to this many offsets (0: one task each).
    pack_offsets: int = PACK_OFFSETS
    #: The columns built and shipped (option ``columns``, or a read schema naming a subset).
    projection: Projection = field(default_factory=Projection)
    #: The filters taken from Spark (``pushFilters``): they narrow the plan and are applied exactly.
    pushed: PushedFilters = field(default_factory=PushedFilters)
    #: Option ``filterPushdown``: whether the reader offers ``pushFilters`` at all (Spark 4.2 refuses
    #: every read of a reader that has it while ``spark.sql.python.filterPushdown.enabled`` is false,
    #: its default, and a source cannot see that setting).
    filter_pushdown: bool = False
    #: Option ``filterValueProperty`` (alias ``filterValueColumn``): the application property whose
    #: value each publisher set as the stream filter value; the source then has column ``filter_value``.
    filter_property: str | None = None

    @property
    def streams(self) -> tuple[str, ...]:
        return self.names

    @classmethod
    def parse(cls, options: Any) -> ReadOptions:
        get = option_getter(options)
        refuse_transform_options(options, DATA_SOURCE_NAME)

        url = get("url")
        if not url:
            raise PlanningError(f"{DATA_SOURCE_NAME}: option 'url' is required (rabbitmq-stream://host:5552/)")
        _check_format(url)
        selection = Selection.parse_options(get, source=DATA_SOURCE_NAME, names_key="stream",
                                    group_key="superStream", default_batch_rows=DEFAULT_BATCH_ROWS)
        decode_text = (get("decode") or "amqp").strip().lower()
        if decode_text not in ("amqp", "raw"):
            raise PlanningError(
                f"{DATA_SOURCE_NAME}: option 'decode' must be amqp or raw, got {decode_text!r}"
            )
        filter_property = parse_filter_property(get)
        read_from_text = (get("readFrom") or "replica").strip().lower()
        if read_from_text not in ("replica", "leader", "url"):
            raise PlanningError(
                f"{DATA_SOURCE_NAME}: option 'readFrom' must be replica, leader or url, "
                f"got {read_from_text!r}"
            )
        return cls(
            **{f.name: getattr(selection, f.name) for f in fields(Selection)},
            url=url,
            super_stream=(get("superStream") or "").strip() or None,
            decode=decode_text,  # type: ignore[arg-type]
            read_from=read_from_text,  # type: ignore[arg-type]
            map_columns=parse_map_columns(get("properties")),
            pack_offsets=_pack_option(get("packOffsets")),
            projection=Projection.parse(get("columns"), source=DATA_SOURCE_NAME,
                                        filter_column=filter_property is not None),
            filter_pushdown=parse_bool(get("filterPushdown"), what="filterPushdown", default=False),
            filter_property=filter_property,
        )

    def bounds(self, client: Any) -> dict[str, tuple[OffsetBound, OffsetBound]]:
        """Per-stream (start, end) bounds; a super stream is expanded to its partitions here."""
        if self.super_stream and self.ranges is None:
            return self.log_bounds(super_stream_partitions(client, self.super_stream, error=PlanningError))
        return self.log_bounds()


def parse_filter_property(get: Any) -> str | None:
    """Option ``filterValueProperty`` or its alias ``filterValueColumn`` (not both): an application
    property name, or None."""
    keys = ("filterValueProperty", "filterValueColumn")
    given = [(k, v.strip()) for k in keys if (v := get(k)) is not None]
    if len(given) > 1:
        raise PlanningError(f"{DATA_SOURCE_NAME}: give 'filterValueProperty' or its alias "
                            "'filterValueColumn', not both")
    if given and not given[0][1]:
        raise PlanningError(f"{DATA_SOURCE_NAME}: option '{given[0][0]}' must name an application property")
    return given[0][1] if given else None


def _check_format(url: str) -> None:
    """A URL of another log kind (``mewbase://``) names the format that reads it; an unknown scheme is
    left to the stream client's own URL error."""
    kind = find_kind(url)
    if kind is not None and kind.spark_format != DATA_SOURCE_NAME:
        raise PlanningError(
            f"{DATA_SOURCE_NAME}: option 'url' names a {kind.name} source; read it with format "
            f"{kind.spark_format!r}"
        )


def plan(options: ReadOptions) -> list[PlannedRange]:
    """Connect once and resolve the options to one range per stream."""
    from streamledger.protocol.rabbitmq import StreamClient

    pushed = options.pushed
    with StreamClient.connect(options.url) as client:
        bounds = {s: b for s, b in options.bounds(client).items() if pushed.keeps_stream(s)}
        # With pushed filters, retention's loss is judged on what they ask for (narrow), not on the
        # options' start: a filter past the cut loses nothing; one inside it loses from its own start.
        fail = options.fail_on_data_loss
        planned = plan_ranges(client, bounds, fail_on_data_loss=fail and not pushed.narrows,
                              timestamp_strategy=options.times.strategy)
        if not pushed.narrows:
            return planned
        narrowed = pushed.narrow(client, planned)
        lost = next((r for r in narrowed if r.lost is not None), None) if fail else None
        if lost is not None and lost.lost is not None:
            raise DataLossError(lost.stream, lost.lost[0], client.first_offset(lost.stream))
        return narrowed


def slices_for(planned: Sequence[PlannedRange], options: ReadOptions) -> list[StreamSlice]:
    """Contiguous slices of every non-empty planned range (the batch and the streaming reader's tasks)."""
    return [StreamSlice(*piece) for piece in options.slices(planned)]


def _pack_option(value: str | None) -> int:
    if value is None or not value.strip():
        return PACK_OFFSETS
    if value.strip() == "0":
        return 0
    return parse_positive_int(value, what="packOffsets") or PACK_OFFSETS


def parse_map_columns(value: str | None) -> tuple[str, ...]:
    """Option ``properties``: ``all`` (default), ``none`` or a comma list of map column names."""
    text = (value or "all").strip().lower()
    if text == "all":
        return MAP_COLUMNS
    if text == "none":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in MAP_COLUMNS]
    if unknown:
        raise PlanningError(
            f"{DATA_SOURCE_NAME}: option 'properties' names unknown columns {unknown}; use all, none or "
            f"a comma list of {', '.join(MAP_COLUMNS)}"
        )
    return names


def read_slices(options: ReadOptions, parts: Sequence[StreamSlice], stats: ReadStats | None = None
                ) -> Iterator[Any]:
    """Several slices in one task (a :class:`SliceGroup`): one client, their subscriptions in flight
    together (``StreamClient.read_ranges``: a few broker round trips per window of slices instead
    of about four per slice); a filtered read (broker-side filter values) reads slice by slice, the
    member connection kept from one to the next (``pooled_reads``)."""
    live = [p for p in parts if p.start < p.end]
    if not live:
        return
    from streamledger.protocol.rabbitmq import StreamClient

    shape = _Shape.of(options)
    with StreamClient.connect(options.url) as client, client.pooled_reads():
        if len(live) < 2 or shape.values is not None:
            for part in live:
                yield from read_slice(options, part, client, stats)
            return
        starts = _retained_starts(options, client, live)
        asked = [(part, start) for part, start in zip(live, starts, strict=True) if start < part.end]
        after = {i: start - 1 for i, (_part, start) in enumerate(asked)}  # the last offset handed out
        for i, batch in client.read_ranges(
            [(part.stream, start, part.end) for part, start in asked], decode=options.decode,
            max_batch_records=options.batch_rows, prefer=options.read_from, layout="buffers",
            maps=bool(shape.decoded), stats=stats, max_batch_bytes=batch_bytes(options),
        ):
            assert isinstance(batch, BufferBatch)
            after[i] = check_runs(asked[i][0], after[i], batch.run_starts, batch.run_lengths)
            yield shape.arrow(options, batch)


def batch_bytes(options: ReadOptions) -> int:
    """The client's cut of a batch by body bytes: option ``batchBytes``, else only the int32 bound."""
    return min(options.batch_bytes or MAX_BUFFER_BYTES, MAX_BUFFER_BYTES)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a slice's batches are turned into: the map columns asked for, those decoded (the
    ``filter_value`` column needs application_properties), the filter values pushed to the broker."""

    maps: tuple[str, ...]
    decoded: tuple[str, ...]
    with_fv: bool
    values: list[str] | None

    @classmethod
    def of(cls, options: ReadOptions) -> _Shape:
        project, keep, prop = options.projection, options.pushed, options.filter_property
        maps = tuple(project.map_columns(options.map_columns))
        with_fv = prop is not None and (project.filter_value or keep.filter_values is not None)
        decoded = ((*maps, "application_properties") if with_fv and "application_properties" not in maps
                   else maps)
        values = sorted(keep.filter_values) if keep.filter_values is not None and with_fv else None
        return cls(maps, decoded, with_fv, values)

    def arrow(self, options: ReadOptions, batch: Any) -> pa.RecordBatch:
        arrow = buffers_to_arrow(batch, self.decoded)
        if self.with_fv:
            prop = options.filter_property
            assert prop is not None
            arrow = with_filter_value(arrow, prop)  # read from application_properties
            if self.decoded != self.maps:  # decoded for filter_value only: the column stays as asked (null)
                i = arrow.schema.get_field_index("application_properties")
                arrow = arrow.set_column(i, arrow.schema.field(i), pa.nulls(len(arrow), STRING_MAP))
        return options.projection.apply(options.pushed.keep(arrow))


def _retained_starts(options: ReadOptions, client: Any, parts: Sequence[StreamSlice]) -> list[int]:
    """Each slice's start; with ``failOnDataLoss=false``, moved up to what retention still holds
    (it may have moved since planning; like the planner, skip what is gone)."""
    if options.fail_on_data_loss:
        return [p.start for p in parts]
    firsts = client.first_offsets(list(dict.fromkeys(p.stream for p in parts)))
    out = []
    for part in parts:
        start = part.start
        if firsts[part.stream] > start:
            log.warning("stream %r: offsets [%d, %d) were removed by retention after planning; skipped",
                        part.stream, start, min(firsts[part.stream], part.end))
            start = min(firsts[part.stream], part.end)
        out.append(start)
    return out


def read_slice(options: ReadOptions, part: StreamSlice, client: Any = None, stats: ReadStats | None = None
               ) -> Iterator[Any]:
    """Yield the slice's records as Arrow batches of at most ``batch_rows`` rows (over ``client``
    when given, else a connection of its own; ``stats`` adds up the chunks and bytes the broker sent).

    A pushed ``filter_value`` filter subscribes with the broker's stream filtering (only chunks whose
    Bloom filter admits a value, or that hold unfiltered messages); the rows are then filtered exactly.

    The client hands out :class:`BufferBatch` es already cut at ``batch_rows`` (flat body buffers,
    offsets as runs), which :func:`buffers_to_arrow` wraps without a Python object per record; the map
    columns are decoded only when option ``properties`` asks for them.
    """
    if part.start >= part.end:
        return
    if client is None:
        from streamledger.protocol.rabbitmq import StreamClient

        with StreamClient.connect(options.url) as own:
            yield from read_slice(options, part, own, stats)
        return
    (start,) = _retained_starts(options, client, [part]) if not options.fail_on_data_loss else (part.start,)
    if start >= part.end:
        return
    after = start - 1  # the last offset handed out
    shape = _Shape.of(options)
    for batch in client.read_range(
        part.stream, start, part.end, decode=options.decode, max_batch_records=options.batch_rows,
        prefer=options.read_from, layout="buffers", maps=bool(shape.decoded), filter_values=shape.values,
        stats=stats, max_batch_bytes=batch_bytes(options), first_batch_records=FIRST_BATCH_ROWS,
    ):
        if len(batch):
            after = check_runs(part, after, batch.run_starts, batch.run_lengths)
            yield shape.arrow(options, batch)


class SliceCheckError(StreamledgerError):
    """A task was about to hand Spark a record outside its slice or out of order (a reader bug)."""


def check_runs(
    part: StreamSlice, after: int, starts: Sequence[int], lengths: Sequence[int], *, what: str = "stream"
) -> int:
    """Check that the runs of offsets continue strictly increasing after ``after`` inside the slice;
    return the new last offset. O(chunks), and what lets the job's manifest count records without a
    distinct count: offsets cannot repeat within a task, and slices of a stream are disjoint. Every
    source format the job reads must call it (``what`` names its logs: stream, channel)."""
    for first, n in zip(starts, lengths, strict=True):
        if not n:
            continue
        last = first + n - 1
        if first <= after or first < part.start or last >= part.end:
            raise SliceCheckError(
                f"{what} {part.stream!r}: the read of slice [{part.start}, {part.end}) produced offsets "
                f"[{first}, {last}] after offset {after}; refusing to hand them to Spark"
            )
        after = last
    return after
