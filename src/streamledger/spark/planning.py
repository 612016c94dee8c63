"""Offset planning for bounded Spark reads: options -> exact ``[start, end)`` per stream -> slices.

Rules enforced here (see docs/interfaces.md, "Offsets"):

* Every range is half-open, ``[start, end)``. ``earliest`` is the first retained offset, ``latest`` the
  committed tail *at planning time* (so a read never waits for data), a number is taken as-is and
  ``{"timestamp": ms}`` is the first offset of the first chunk stamped at or after ``ms``.
* A range must lie at or below the committed tail and ``start <= end``; anything else is an error
  that names the stream and the offsets, because a bounded read past the tail would block.
* ``start`` below the first retained offset is data loss: an error by default
  (``failOnDataLoss=true``), otherwise the start is clamped to the first offset (never past ``end``)
  and the skipped span is reported as :attr:`PlannedRange.lost`.
* Splitting cuts ``[start, end)`` into contiguous half-open slices in *offset* space. Offsets have gaps,
  so a slice may hold fewer records than its width, but since the slices tile the range exactly, every
  record lands in exactly one slice: no loss and no duplicate at a boundary.

Planning runs once (on the driver, or in Spark's planner process); the result is small and picklable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from streamledger.errors import StreamledgerError
from streamledger.offsets import WORDS, DataLossError, OffsetSpec
from streamledger.sources import MAX_OFFSET


class PlanningError(StreamledgerError, ValueError):
    """The requested read cannot be planned (bad option, range past the tail, start after end)."""


OffsetBound = OffsetSpec
"""Where a range starts or ends, before it is resolved against a stream: the one offset vocabulary
(:class:`streamledger.offsets.OffsetSpec`). In the Spark options ``earliest`` is ``first`` and
``latest`` is ``next`` (the committed tail), Kafka's names; ``last`` and ``tail`` mean the tail there
too (:func:`parse_bound`), never the last record."""


def bound_text(bound: OffsetSpec) -> str:
    """A bound as the Spark options spell it: ``earliest``, ``latest``, an offset, ``{"timestamp": ms}``."""
    if bound.kind in ("first", "next"):
        return "earliest" if bound.kind == "first" else "latest"
    if bound.kind == "offset":
        return str(bound.value)
    if bound.kind == "timestamp":
        return json.dumps({"timestamp": bound.value})
    return str(bound)


@dataclass(frozen=True, slots=True)
class PlannedRange:
    """One stream's resolved range; ``start`` is where reading begins (after any clamping)."""

    stream: str
    start: int
    end: int
    requested_start: int

    @property
    def lost(self) -> tuple[int, int] | None:
        """The span ``[requested_start, start)`` that retention removed, if any."""
        return (self.requested_start, self.start) if self.start > self.requested_start else None

    @property
    def empty(self) -> bool:
        return self.start >= self.end


class OffsetSource(Protocol):
    """The part of the stream client planning needs (``StreamClient`` satisfies it)."""

    def first_offset(self, name: str) -> int: ...

    def committed_tail(self, name: str) -> int: ...

    def resolve_offset(self, name: str, spec: Any) -> int: ...


def _as_int(value: Any, what: str) -> int:
    """An offset (or timestamp) in ``0..MAX_OFFSET``: an int, or a string of ASCII digits (``str.isdigit``
    alone would take Arabic-Indic or full-width digits, and ``int()`` underscores)."""
    if isinstance(value, bool):
        raise PlanningError(f"{what}: expected an integer offset, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and _ASCII_INT.fullmatch(value.strip()):
        digits = value.strip()
        if len(digits.lstrip("-")) > len(str(MAX_OFFSET)):
            raise PlanningError(f"{what}: offsets are at most 2**63-1, got {len(digits)} digits")
        n = int(digits)
    else:
        shown = value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "..."
        raise PlanningError(f"{what}: expected an integer offset, got {shown!r}")
    if n < 0:
        raise PlanningError(f"{what}: offsets are >= 0, got {n}")
    if n > MAX_OFFSET:
        raise PlanningError(f"{what}: offsets are at most 2**63-1, got {n}")
    return n


_ASCII_INT = re.compile(r"-?[0-9]+")


def _json(text: str, what: str, *, show: bool = True) -> Any:
    """``json.loads`` whose every failure is a one-line PlanningError naming ``what``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanningError(f"{what}: not valid JSON ({exc.msg})" + (f": {text!r}" if show else "")) from None
    except ValueError:  # Python's cap on the digits of an integer literal
        raise PlanningError(f"{what}: a number has too many digits (offsets are at most 2**63-1)") from None


def parse_bound(value: Any, *, what: str) -> OffsetBound:
    """``earliest`` | ``latest`` (or any word of :data:`streamledger.offsets.WORDS`; ``last`` is the
    tail here) | an offset | ``{"timestamp": ms}`` (or its JSON text) -> bound."""
    if isinstance(value, OffsetBound):
        return value
    if isinstance(value, str):
        text = value.strip()
        low = text.lower()
        if low in WORDS:
            # a bound's "last" is the tail, as Spark's latest: an end there reads every record
            return OffsetSpec("next" if low == "last" else WORDS[low])
        if text.startswith("{"):
            value = _json(text, what)
        else:
            return OffsetBound.offset(_as_int(text, what))
    if isinstance(value, dict):
        if set(value) == {"timestamp"}:
            return OffsetBound.timestamp(_as_int(value["timestamp"], f"{what} timestamp"))
        if set(value) == {"offset"}:
            return OffsetBound.offset(_as_int(value["offset"], what))
        raise PlanningError(f"{what}: expected {{\"timestamp\": ms}} or {{\"offset\": n}}, got {value!r}")
    return OffsetBound.offset(_as_int(value, what))


def parse_bounds(
    text: str | None, streams: Sequence[str], *, default: OffsetBound, what: str
) -> dict[str, OffsetBound]:
    """One bound for all streams, or per-stream JSON ``{"s-0": 10, "s-1": "earliest"}``.

    Streams missing from a per-stream object get ``default``; naming an unknown stream is an error.
    """
    if text is None or not str(text).strip():
        return {s: default for s in streams}
    raw = str(text).strip()
    if raw.startswith("{"):
        obj = _json(raw, what)
        if not isinstance(obj, dict):
            raise PlanningError(f"{what}: expected a JSON object, got {raw!r}")
        if set(obj) in ({"timestamp"}, {"offset"}):
            bound = parse_bound(obj, what=what)
            return {s: bound for s in streams}
        unknown = sorted(set(obj) - set(streams))
        if unknown:
            raise PlanningError(f"{what}: unknown stream(s) {unknown}; the read covers {list(streams)}")
        return {s: parse_bound(obj[s], what=f"{what}[{s}]") if s in obj else default for s in streams}
    bound = parse_bound(raw, what=what)
    return {s: bound for s in streams}


def parse_ranges(value: str | Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """``{"stream": [start, end], ...}`` (JSON text or a mapping) -> validated half-open ranges."""
    obj = _json(value, "ranges", show=False) if isinstance(value, str) else dict(value)
    if not isinstance(obj, dict) or not obj:
        raise PlanningError('ranges: expected a non-empty JSON object {"stream": [start, end]}')
    out: dict[str, tuple[int, int]] = {}
    for stream, pair in obj.items():
        if not isinstance(stream, str) or not stream:
            raise PlanningError(f"ranges: stream names must be non-empty strings, got {stream!r}")
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise PlanningError(f"ranges[{stream}]: expected [start, end], got {pair!r}")
        start = _as_int(pair[0], f"ranges[{stream}] start")
        end = _as_int(pair[1], f"ranges[{stream}] end")
        if start > end:
            raise PlanningError(f"ranges[{stream}]: start {start} is after end {end}")
        out[stream] = (start, end)
    return out


def parse_stream_list(text: str | None) -> list[str]:
    """``"a, b,c"`` -> ``["a", "b", "c"]`` (duplicates removed, order kept)."""
    if not text:
        return []
    seen: dict[str, None] = {}
    for part in str(text).split(","):
        name = part.strip()
        if name:
            seen[name] = None
    return list(seen)


def parse_bool(value: str | bool | None, *, what: str, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise PlanningError(f"{what}: expected true or false, got {value!r}")


def parse_positive_int(value: str | int | None, *, what: str) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise PlanningError(f"{what}: expected a positive integer, got {value!r}") from None
    if n <= 0:
        raise PlanningError(f"{what}: expected a positive integer, got {n}")
    return n


def split_range(
    start: int, end: int, *, max_records: int | None = None, parts: int | None = None
) -> list[tuple[int, int]]:
    """Cut ``[start, end)`` into contiguous half-open slices.

    ``parts`` asks for that many slices whose widths differ by at most one (fewer when the range is
    narrower than ``parts``); ``max_records`` then caps each slice's width (offsets have gaps, so a
    slice holds at most that many records). An empty range gives no slice.
    """
    width = end - start
    if width <= 0:
        return []
    pieces = [(start, end)]
    if parts is not None and parts > 1:
        n = min(parts, width)
        q, r = divmod(width, n)
        pieces, s = [], start
        for i in range(n):
            e = s + q + (1 if i < r else 0)
            pieces.append((s, e))
            s = e
    if max_records is None:
        return pieces
    return [(s, min(e, s + max_records)) for a, e in pieces for s in range(a, e, max_records)]


TimestampStrategy = Literal["error", "latest"]


def resolve_bound(
    client: OffsetSource, stream: str, bound: OffsetBound, *, first: int, tail: int,
    past_tail: TimestampStrategy = "latest",
) -> int:
    """A bound as a concrete offset of ``stream`` (``first``/``tail`` already fetched once).

    A timestamp no committed chunk reaches resolves to the tail, or is an error when ``past_tail`` is
    ``error`` (option ``startingOffsetsByTimestampStrategy``, Kafka's: a start there would silently
    wait for data the user did not ask for)."""
    if bound.kind == "first":
        return first
    if bound.kind == "next":
        return tail
    if bound.kind == "offset":
        assert bound.value is not None
        return bound.value
    if bound.kind == "last":  # the last record's offset (an OffsetSpec built in code: no option says it)
        return int(client.resolve_offset(stream, bound))
    assert bound.value is not None
    offset = int(client.resolve_offset(stream, OffsetSpec.timestamp(bound.value)))
    if offset >= tail:
        if past_tail == "error":
            raise PlanningError(
                f"stream {stream!r}: no committed chunk is stamped at or after {bound.value} ms (tail "
                f"{tail}); set startingOffsetsByTimestampStrategy=latest to start at the tail"
            )
        return tail
    return offset


def _how(bound: OffsetBound) -> str:
    return "" if bound.kind == "offset" else f" ({bound_text(bound)})"


def plan_ranges(
    client: OffsetSource,
    bounds: Mapping[str, tuple[OffsetBound, OffsetBound]],
    *,
    fail_on_data_loss: bool = True,
    timestamp_strategy: TimestampStrategy = "latest",
) -> list[PlannedRange]:
    """Resolve each stream's (start, end) bounds against the broker once, applying the rules above
    (``timestamp_strategy``: a start timestamp past the tail, see :func:`resolve_bound`)."""
    planned: list[PlannedRange] = []
    names = list(bounds)
    # Both ends of every stream at once where the client can (one pipelined StreamStats round),
    # else per stream.
    many = getattr(client, "retained_spans", None)
    spans = many(names) if many is not None and names else {}
    for stream, (start_bound, end_bound) in bounds.items():
        first, tail = (int(spans[stream][0]), int(spans[stream][1])) if stream in spans else (
            int(client.first_offset(stream)), int(client.committed_tail(stream)))
        start = resolve_bound(client, stream, start_bound, first=first, tail=tail,
                              past_tail=timestamp_strategy)
        end = resolve_bound(client, stream, end_bound, first=first, tail=tail)
        if end > tail:
            raise PlanningError(
                f"stream {stream!r}: end offset {end}{_how(end_bound)} is past the committed tail {tail}; "
                "a bounded read can only cover committed records"
            )
        if start > end:
            raise PlanningError(
                f"stream {stream!r}: start offset {start}{_how(start_bound)} is after "
                f"end offset {end}{_how(end_bound)}"
            )
        effective = start
        if start < first and start < end:
            if fail_on_data_loss:
                raise DataLossError(stream, start, first)
            effective = min(first, end)
        planned.append(PlannedRange(stream, effective, end, start))
    return planned


@dataclass(frozen=True)
class TimestampOptions:
    """Spark's Kafka-source timestamp options, parsed: one timestamp for every log, or one per log
    (``{"log": ms}``), for each end; and what a start timestamp past the tail means."""

    starting: int | None = None
    starting_by: dict[str, int] | None = None
    ending: int | None = None
    ending_by: dict[str, int] | None = None
    strategy: TimestampStrategy = "error"

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.starting, self.starting_by, self.ending, self.ending_by))

    @classmethod
    def parse(cls, get: Callable[[str], str | None]) -> TimestampOptions:
        strategy = (get("startingOffsetsByTimestampStrategy") or "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise PlanningError(
                f"startingOffsetsByTimestampStrategy: expected error or latest, got {strategy!r}"
            )
        return cls(
            starting=_timestamp(get("startingTimestamp"), "startingTimestamp"),
            starting_by=_per_log_timestamps(get("startingOffsetsByTimestamp"), "startingOffsetsByTimestamp"),
            ending=_timestamp(get("endingTimestamp"), "endingTimestamp"),
            ending_by=_per_log_timestamps(get("endingOffsetsByTimestamp"), "endingOffsetsByTimestamp"),
            strategy=strategy,  # type: ignore[arg-type]
        )

    @staticmethod
    def apply(
        base: dict[str, OffsetBound], every: int | None, by: dict[str, int] | None, what: str
    ) -> dict[str, OffsetBound]:
        if every is not None:
            return {s: OffsetBound.timestamp(every) for s in base}
        if by is None:
            return base
        unknown = sorted(set(by) - set(base))
        if unknown:
            raise PlanningError(f"{what}: unknown stream(s) {unknown}; the read covers {list(base)}")
        return {s: OffsetBound.timestamp(by[s]) if s in by else b for s, b in base.items()}


def _timestamp(value: str | None, what: str) -> int | None:
    if value is None or not value.strip():
        return None
    return _as_int(value, what)


def _per_log_timestamps(value: str | None, what: str) -> dict[str, int] | None:
    if value is None or not value.strip():
        return None
    obj = _json(value.strip(), what)
    if not isinstance(obj, dict) or not obj:
        raise PlanningError(f'{what}: expected a JSON object {{"stream": ms}}, got {value.strip()!r}')
    return {str(k): _as_int(v, f"{what}[{k}]") for k, v in obj.items()}


def option_getter(options: Any) -> Callable[[str], str | None]:
    """``get(key)`` over a data source's options: the value as a string, or None when unset (Spark
    passes every option as a string; tests pass ints too)."""

    def get(key: str) -> str | None:
        value = options.get(key)
        return None if value is None else str(value)

    return get


LEDGER_OPTIONS = ("ledger", "ledgerUrl", "pipeline", "ledgerOutput")
"""The options of ledger-recorded streaming (:mod:`streamledger.spark.streaming`)."""


def refuse_ledger_options(options: Any, source: str) -> None:
    """A plain ``spark.read`` records nothing in the ledger: refuse its ledger options in one line
    rather than let a read that looks recorded go by unrecorded."""
    get = option_getter(options)
    given = [key for key in LEDGER_OPTIONS if (get(key) or "").strip()]
    if given:
        named = ", ".join(map(repr, given))
        raise PlanningError(f"{source}: option(s) {named} are for ledger-recorded reads, "
                            "and a plain spark.read records nothing: ledger-recorded reads are streaming "
                            "queries (spark.readStream) or run_batch")


TRANSFORM_OPTIONS = ("sql", "sqlFile", "sql_file", "transform", "bodyFormat", "body_format", "bodySchema",
                     "body_schema", "onBadRecord", "on_bad_record")
"""A pipeline spec's transform settings, which a Spark source does nothing with."""


def refuse_transform_options(options: Any, source: str) -> None:
    """A source given a pipeline's transform settings would read raw records and ignore them: refuse
    in one line (the transform is the batch's, ``run_batch``; a streaming query transforms its
    DataFrame itself)."""
    get = option_getter(options)
    given = [key for key in TRANSFORM_OPTIONS if (get(key) or "").strip()]
    if given:
        raise PlanningError(f"{source}: option(s) {', '.join(map(repr, given))} are a pipeline's transform, "
                            "which the source does not run: give them to run_batch (or an operator, asset "
                            "or batch run), or transform the DataFrame yourself")


@dataclass(frozen=True)
class Selection:
    """The options every source format shares: which logs (named, or exact ``ranges``), their bounds,
    how to cut them into slices, and the Arrow batch size. Parsed here once, so a RabbitMQ stream and a
    mewbase channel are selected by the same rules and the same error texts."""

    names: tuple[str, ...]
    ranges: dict[str, tuple[int, int]] | None
    starting: str | None
    ending: str | None
    max_records_per_partition: int | None
    splits_per_stream: int | None
    fail_on_data_loss: bool
    batch_rows: int
    #: Option ``batchBytes``: a batch also ends at about this many bytes of record bodies (None: rows
    #: only), so a reader that writes as it reads holds that much at once whatever the record size.
    batch_bytes: int | None
    #: Option ``sliceSummaries`` (the job's, not for readers): see :mod:`streamledger.spark.summaries`.
    slice_summaries: bool
    #: Kafka's timestamp options, which win over ``starting``/``ending`` (see :meth:`start_bounds`).
    times: TimestampOptions

    @classmethod
    def parse_options(
        cls, get: Any, *, source: str, names_key: str, default_batch_rows: int, group_key: str | None = None
    ) -> Selection:
        """``get(key)`` -> string or None. ``names_key`` lists logs (``stream``, ``channel``);
        ``group_key`` names an option that stands for a set of logs (``superStream``), if the source
        has one; the caller expands it."""
        names = parse_stream_list(get(names_key))
        group = (get(group_key) or "").strip() if group_key else ""
        ranges = parse_ranges(get("ranges") or "") if get("ranges") else None
        either = f"'{names_key}'" + (f"/'{group_key}'" if group_key else "")
        if ranges is not None and (names or group):
            raise PlanningError(f"{source}: 'ranges' names its {names_key}s; drop {either}")
        if ranges is None and not names and not group:
            give = f"'{names_key}', '{group_key}' or 'ranges'" if group_key else f"'{names_key}' or 'ranges'"
            raise PlanningError(f"{source}: give {give}")
        if names and group:
            raise PlanningError(f"{source}: give either '{names_key}' or '{group_key}', not both")
        starting, ending = get("startingOffsets"), get("endingOffsets")
        times = TimestampOptions.parse(get)
        if ranges is not None and (starting or ending or times.given):
            raise PlanningError(
                f"{source}: 'ranges' fixes both ends; drop 'startingOffsets'/'endingOffsets' and the "
                "timestamp options"
            )
        return cls(
            names=tuple(names),
            ranges=ranges,
            starting=starting,
            ending=ending,
            max_records_per_partition=parse_positive_int(
                get("maxRecordsPerPartition"), what="maxRecordsPerPartition"
            ),
            splits_per_stream=parse_positive_int(get("splitsPerStream"), what="splitsPerStream"),
            fail_on_data_loss=parse_bool(get("failOnDataLoss"), what="failOnDataLoss", default=True),
            batch_rows=parse_positive_int(get("batchRows"), what="batchRows") or default_batch_rows,
            batch_bytes=parse_positive_int(get("batchBytes"), what="batchBytes"),
            slice_summaries=parse_bool(get("sliceSummaries"), what="sliceSummaries", default=False),
            times=times,
        )

    def log_bounds(self, names: Sequence[str] | None = None) -> dict[str, tuple[OffsetBound, OffsetBound]]:
        """Per-log (start, end) bounds; ``names`` overrides the listed logs (an expanded group)."""
        if self.ranges is not None:
            return {s: (OffsetBound.offset(a), OffsetBound.offset(b)) for s, (a, b) in self.ranges.items()}
        logs = list(self.names if names is None else names)
        starts = self.start_bounds(logs, default=OffsetBound.earliest())
        ends = self.end_bounds(logs)
        return {s: (starts[s], ends[s]) for s in logs}

    def start_bounds(self, logs: Sequence[str], *, default: OffsetBound) -> dict[str, OffsetBound]:
        """Where each log starts, Kafka's precedence: ``startingTimestamp`` over
        ``startingOffsetsByTimestamp`` over ``startingOffsets`` (``default`` when none names a log:
        ``earliest`` for batch reads, ``latest`` for a new streaming query)."""
        base = parse_bounds(self.starting, logs, default=default, what="startingOffsets")
        times = self.times
        return times.apply(base, times.starting, times.starting_by, "startingOffsetsByTimestamp")

    def end_bounds(self, logs: Sequence[str]) -> dict[str, OffsetBound]:
        """Where each log ends (batch reads): the same precedence with the ``ending`` options."""
        base = parse_bounds(self.ending, logs, default=OffsetBound.latest(), what="endingOffsets")
        return self.times.apply(base, self.times.ending, self.times.ending_by, "endingOffsetsByTimestamp")

    def slices(self, planned: Sequence[PlannedRange]) -> list[tuple[str, int, int]]:
        """``(log, start, end)`` contiguous slices of every non-empty planned range."""
        return [
            (r.stream, start, end)
            for r in planned
            for start, end in split_range(
                r.start, r.end, max_records=self.max_records_per_partition, parts=self.splits_per_stream
            )
        ]
