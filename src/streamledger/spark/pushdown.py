"""What a query needs from ``rabbitmq_stream``: the columns (projection) and the pushed filters.

pyspark 4.2 tells a Python source its filters (``DataSourceReader.pushFilters``, batch reads) but not
the columns a query uses (Spark's Python scan builder pushes filters only), so the projection comes
from a user schema that is a subset of the source's columns, or option ``columns``.

Filters on ``stream`` prune streams before planning; on ``offset`` and ``chunk_timestamp`` they narrow
each stream's planned range before any chunk is read (a chunk timestamp resolves to an offset through
the broker). Every pushed filter is then applied exactly to each Arrow batch (chunk timestamps need not
be monotone across a stream), so the rows are always those Spark would keep: pushing only saves reading.

Stream filtering: option ``filterValueProperty`` names the application property whose value each
publisher also set as the message's stream filter value; the source then has a column ``filter_value``
(that property's value as text). ``=``/``IN`` on it are pushed to the broker (``filter.N`` and
``match-unfiltered`` on each subscription: chunks ruled out by their Bloom filter are skipped) and then
applied exactly to the rows, so Bloom false positives and unfiltered messages never leak through.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamledger.spark.arrow import ARROW_SCHEMA, SPARK_SCHEMA_DDL
from streamledger.spark.planning import OffsetSource, PlannedRange, PlanningError

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_DDL = dict(part.split(" ", 1) for part in SPARK_SCHEMA_DDL.split(", "))

#: The column a declared filter property adds (option ``filterValueProperty``), last in the schema.
FILTER_VALUE = pa.field("filter_value", pa.string())
_DDL[FILTER_VALUE.name] = "STRING"


def _source_fields(filter_column: bool) -> list[pa.Field]:
    return [*ARROW_SCHEMA, FILTER_VALUE] if filter_column else list(ARROW_SCHEMA)


def with_filter_value(batch: pa.RecordBatch, prop: str) -> pa.RecordBatch:
    """A full-schema batch with column ``filter_value``: application property ``prop`` of each row
    (the map column's text, the same text the publisher's ``filter_property`` took as filter value)."""
    column = pc.map_lookup(batch.column("application_properties"), query_key=prop, occurrence="first")
    return pa.RecordBatch.from_arrays([*batch.columns, column],
                                      schema=batch.schema.append(FILTER_VALUE))


@dataclass(frozen=True)
class Projection:
    """The source's columns a read builds and ships, in the order the read's schema names them."""

    columns: tuple[str, ...] = tuple(ARROW_SCHEMA.names)

    @property
    def full(self) -> bool:
        return self.columns == tuple(ARROW_SCHEMA.names)

    @property
    def filter_value(self) -> bool:
        """Whether the read keeps column ``filter_value`` (only a source with a filter property has it)."""
        return FILTER_VALUE.name in self.columns

    def map_columns(self, asked: Sequence[str]) -> tuple[str, ...]:
        """The map columns to decode: those asked for (option ``properties``) that the read keeps."""
        return tuple(c for c in asked if c in self.columns)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch if self.full else batch.select(list(self.columns))

    @property
    def ddl(self) -> str:
        """The Spark schema of the kept columns (what ``DataSource.schema()`` declares)."""
        return ", ".join(f"{c} {_DDL[c]}" for c in self.columns)

    @classmethod
    def parse(cls, text: str | None, *, source: str, filter_column: bool = False) -> Projection:
        """Option ``columns``: a comma list of the source's columns (default: all; ``filter_column``:
        the source has ``filter_value`` too)."""
        known = [f.name for f in _source_fields(filter_column)]
        if text is None or not text.strip():
            return cls(tuple(known))
        names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise PlanningError(
                f"{source}: option 'columns' names unknown columns {unknown}; the source has "
                f"{', '.join(known)}"
            )
        return cls(names)

    @classmethod
    def of_schema(cls, fields: Sequence[tuple[str, pa.DataType]], *, source: str,
                  filter_column: bool = False) -> Projection:
        """A read schema given as (name, Arrow type) pairs: each must be one of the source's columns
        with its type (the batches are built for exactly those)."""
        known = {f.name: f.type for f in _source_fields(filter_column)}
        names = []
        for name, kind in fields:
            if known.get(name) != kind:
                raise PlanningError(
                    f"{source}: schema column {name} {kind} is not one of the source's columns "
                    f"({', '.join(f'{n} {t}' for n, t in known.items())})"
                )
            names.append(name)
        if len(set(names)) != len(names) or not names:
            raise PlanningError(f"{source}: the schema must name distinct columns of the source, got {names}")
        return cls(tuple(names))


def _micros(value: Any) -> int | None:
    """A filter literal on ``chunk_timestamp`` as microseconds since the epoch (naive = UTC)."""
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int((value - _EPOCH) // dt.timedelta(microseconds=1))


def _ceil_ms(us: int) -> int:
    return -((-us) // 1000)


@dataclass(frozen=True)
class PushedFilters:
    """The filters the source took from Spark, as bounds: ``streams`` (None: all), offsets in
    ``[offset_from, offset_to)`` (and in ``offsets`` when an IN or = named them), chunk timestamps in
    ``[time_from, time_to)`` milliseconds, ``filter_values`` (None: any) the values of column
    ``filter_value`` a row may have. ``nothing``: a pushed filter no row can pass."""

    streams: frozenset[str] | None = None
    offset_from: int = 0
    offset_to: int | None = None
    offsets: frozenset[int] | None = None
    time_from: int | None = None
    time_to: int | None = None
    filter_values: frozenset[str] | None = None
    nothing: bool = False

    @property
    def narrows(self) -> bool:
        return self != PushedFilters()

    def accept(self, f: Any) -> PushedFilters | None:
        """This record with filter ``f`` added, or None when the source cannot take it (Spark keeps it)."""
        from pyspark.sql.datasource import (
            EqualNullSafe,
            EqualTo,
            GreaterThan,
            GreaterThanOrEqual,
            In,
            IsNotNull,
            IsNull,
            LessThan,
            LessThanOrEqual,
        )

        path = getattr(f, "attribute", None)  # Not(...) has a child instead: left to Spark
        column = path[0] if path is not None and len(path) == 1 else None
        if column == FILTER_VALUE.name:
            return self._filter_values(f, isinstance(f, (EqualTo, EqualNullSafe)), isinstance(f, In))
        if column not in ("stream", "offset", "chunk_timestamp"):
            return None
        if isinstance(f, IsNotNull):  # these columns are never null
            return self
        if isinstance(f, IsNull):
            return replace(self, nothing=True)
        value: Any = getattr(f, "value", None)
        equal = isinstance(f, (EqualTo, EqualNullSafe))
        if column == "stream":
            if equal and isinstance(value, str):
                return self._streams({value})
            if isinstance(f, In) and all(isinstance(v, str) for v in value):
                return self._streams(set(value))
            return None
        if column == "offset":
            if equal or isinstance(f, In):
                values = [value] if equal else list(value)
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                    return None
                wanted = frozenset(values) if self.offsets is None else self.offsets & frozenset(values)
                low, high = (min(wanted), max(wanted) + 1) if wanted else (0, 0)
                return self._offsets(low, high, wanted)
            if not isinstance(value, int) or isinstance(value, bool):
                return None
            bounds = {GreaterThan: (value + 1, None), GreaterThanOrEqual: (value, None),
                      LessThan: (0, value), LessThanOrEqual: (0, value + 1)}.get(type(f))
            return None if bounds is None else self._offsets(bounds[0], bounds[1], self.offsets)
        us = _micros(value)
        if us is None or isinstance(f, In):
            return None
        # chunk timestamps are whole milliseconds: ms*1000 >= us <=> ms >= ceil(us/1000), and so on
        window = {GreaterThan: (us // 1000 + 1, None), GreaterThanOrEqual: (_ceil_ms(us), None),
                  LessThan: (None, _ceil_ms(us)), LessThanOrEqual: (None, us // 1000 + 1),
                  EqualTo: (_ceil_ms(us), us // 1000 + 1), EqualNullSafe: (_ceil_ms(us), us // 1000 + 1),
                  }.get(type(f))
        if window is None:
            return None
        low = window[0] if self.time_from is None or window[0] is None else max(self.time_from, window[0])
        high = window[1] if self.time_to is None or window[1] is None else min(self.time_to, window[1])
        return replace(self, time_from=low if low is not None else self.time_from,
                       time_to=high if high is not None else self.time_to)

    def _filter_values(self, f: Any, equal: bool, is_in: bool) -> PushedFilters | None:
        """``filter_value = v`` or ``IN (...)`` of strings; anything else (IS NOT NULL too: the column
        is null for a message without the property) stays with Spark."""
        values = [f.value] if equal else list(f.value) if is_in else None
        if not values or not all(isinstance(v, str) for v in values):
            return None
        kept = frozenset(values) if self.filter_values is None else self.filter_values & set(values)
        return replace(self, filter_values=kept, nothing=self.nothing or not kept)

    def _streams(self, names: set[str]) -> PushedFilters:
        kept = frozenset(names) if self.streams is None else self.streams & names
        return replace(self, streams=kept)

    def _offsets(self, low: int, high: int | None, wanted: frozenset[int] | None) -> PushedFilters:
        top = self.offset_to if high is None else high if self.offset_to is None else min(high,
                                                                                           self.offset_to)
        return replace(self, offset_from=max(self.offset_from, low), offset_to=top, offsets=wanted)

    @classmethod
    def split(cls, filters: Iterable[Any]) -> tuple[PushedFilters, list[Any]]:
        """The filters the source takes, and the rest for Spark (the same objects, as pushFilters needs)."""
        pushed, rest = cls(), []
        for f in filters:
            taken = pushed.accept(f)
            if taken is None:
                rest.append(f)
            else:
                pushed = taken
        return pushed, rest

    def keeps_stream(self, stream: str) -> bool:
        return not self.nothing and (self.streams is None or stream in self.streams)

    def narrow(self, client: OffsetSource, planned: Sequence[PlannedRange]) -> list[PlannedRange]:
        """Each planned range cut to the pushed offsets and chunk timestamps (a timestamp bound is the
        first offset of the first chunk stamped at or after it, asked of the broker for every stream
        in one round: :meth:`_times`); ranges of pruned streams become empty.

        Retention: a range's ``start`` above its ``requested_start`` is the cut retention made. The lost
        span kept is the part of ``[requested_start, start)`` the filters asked for: from the first
        offset they want up to the cut (or up to their end, when they end before it; the range is then
        empty), none when they start past the cut or prune the stream. A chunk-timestamp start that
        resolves past the cut wants none of it (what retention removed is stamped earlier)."""
        by_offset = []  # each range cut to the pushed streams and offsets, before the chunk timestamps
        for r in planned:
            cut = r.start  # the first offset retention left (requested_start when nothing was lost)
            start, end = max(cut, self.offset_from), r.end
            if self.offset_to is not None:
                end = min(end, self.offset_to)
            wanted_from = max(r.requested_start, self.offset_from)
            lost_to = min(cut, max(end, wanted_from))
            if not self.keeps_stream(r.stream):
                end, lost_to = start, wanted_from
            by_offset.append((start, end, wanted_from, lost_to))
        times = self._times(client, [r.stream for r, (start, end, *_) in zip(planned, by_offset, strict=True)
                                     if start < end])
        out = []
        for r, (start, end, wanted_from, lost_to) in zip(planned, by_offset, strict=True):
            cut = r.start
            since, until = times.get(r.stream, (None, None))
            if start < end and since is not None:
                start = max(start, since)
                if start > cut:
                    lost_to = wanted_from
            if start < end and until is not None:
                end = min(end, until)
            start = min(start, r.end)
            if wanted_from < lost_to:  # retention removed offsets the filters ask for
                begin = lost_to if start >= end else start  # a non-empty range starts at the cut
                out.append(PlannedRange(r.stream, begin, max(begin, end), wanted_from))
            else:
                out.append(PlannedRange(r.stream, start, max(start, end), start))
        return out

    def _times(self, client: OffsetSource, streams: Sequence[str]
               ) -> dict[str, tuple[int | None, int | None]]:
        """The first offset of the first chunk stamped at or after ``time_from`` and ``time_to`` in each
        stream (None: no such bound), asked of the broker in one pipelined round where the client can
        (``resolve_offsets``: a window over a super stream's partitions is one round, not two per
        partition), else one stream and bound at a time."""
        from streamledger.offsets import OffsetSpec

        bounds = [b for b in (self.time_from, self.time_to) if b is not None]
        names = list(dict.fromkeys(streams))
        if not bounds or not names:
            return {}
        specs = [OffsetSpec.timestamp(b) for b in bounds]
        many = getattr(client, "resolve_offsets", None)
        got = (many(names, specs) if many is not None
               else {n: [client.resolve_offset(n, spec) for spec in specs] for n in names})
        out: dict[str, tuple[int | None, int | None]] = {}
        for name in names:
            answers = iter(int(o) for o in got[name])
            out[name] = (next(answers) if self.time_from is not None else None,
                         next(answers) if self.time_to is not None else None)
        return out

    def keep(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Exactly the rows of a full-schema batch the pushed filters pass (with ``filter_values``, the
        batch carries column ``filter_value``); the batch itself, not a copy, when every row passes
        (a window's batches mostly do: its range already ends at the chunks its bounds resolved to)."""
        if not self.narrows or batch.num_rows == 0:
            return batch
        mask = None

        def both(m: Any) -> None:
            nonlocal mask
            mask = m if mask is None else pc.and_(mask, m)

        offsets = batch.column("offset")
        if self.nothing:
            return batch.slice(0, 0)
        if self.streams is not None:
            both(pc.is_in(batch.column("stream"), value_set=pa.array(sorted(self.streams), pa.string())))
        if self.offset_from:
            both(pc.greater_equal(offsets, self.offset_from))
        if self.offset_to is not None:
            both(pc.less(offsets, self.offset_to))
        if self.offsets is not None:
            both(pc.is_in(offsets, value_set=pa.array(sorted(self.offsets), pa.int64())))
        if self.filter_values is not None:
            values = pa.array(sorted(self.filter_values), pa.string())
            both(pc.fill_null(pc.is_in(batch.column(FILTER_VALUE.name), value_set=values), False))
        if self.time_from is not None or self.time_to is not None:
            ms = pc.divide(batch.column("chunk_timestamp").cast(pa.int64()), 1000)
            if self.time_from is not None:
                both(pc.greater_equal(ms, self.time_from))
            if self.time_to is not None:
                both(pc.less(ms, self.time_to))
        if mask is None or pc.all(mask, skip_nulls=False).as_py():
            return batch
        return batch.filter(mask)
