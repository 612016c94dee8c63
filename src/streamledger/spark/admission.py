"""How much one streaming trigger admits: the Kafka-named trigger options and the Spark 4.2 read limits.

Spark 4.2 hands a Python streaming reader one :class:`ReadLimit` per ``latestOffset`` call, never a
composite, and :class:`ReadMinRows` carries no trigger delay. So the options are kept here as a typed
record (:class:`TriggerOptions`), the reader announces the strongest of them as its default limit, and
:meth:`TriggerOptions.budget` applies all of them together with the limit Spark passed (docs/spark.md,
"Streaming"; docs/interfaces.md, issue 34).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
)

from streamledger.spark.planning import PlanningError, parse_positive_int

#: Kafka's default for ``maxTriggerDelay``.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

_UNITS_MS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_UNITS_BYTES = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2,
                "g": 1024**3, "gb": 1024**3}
_AMOUNT = re.compile(r"([0-9]+)\s*([a-z]*)")


def _amount(value: str | None, units: Mapping[str, int], what: str) -> int | None:
    """``"15m"`` / ``"500"`` / ``"64mb"`` -> an integer in the unit's base (ms, bytes)."""
    if value is None or not value.strip():
        return None
    m = _AMOUNT.fullmatch(value.strip().lower())
    if m is None or m.group(2) not in units or int(m.group(1)) <= 0:
        raise PlanningError(f"{what}: expected a positive amount with an optional unit "
                            f"({', '.join(u for u in units if u)}), got {value!r}")
    return int(m.group(1)) * units[m.group(2)]


@dataclass(frozen=True)
class Budget:
    """What one trigger may admit: offsets at most, bytes at most, and offsets at least (0: none)."""

    max_offsets: int | None = None
    max_bytes: int | None = None
    min_offsets: int = 0


@dataclass(frozen=True)
class TriggerOptions:
    """The streaming admission options, parsed once (Kafka's names; ``maxRecordsPerTrigger`` is the
    JVM connector's name for ``maxOffsetsPerTrigger``)."""

    max_offsets: int | None = None
    min_offsets: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    max_bytes: int | None = None

    @classmethod
    def parse(cls, get: Callable[[str], str | None]) -> TriggerOptions:
        offsets = parse_positive_int(get("maxOffsetsPerTrigger"), what="maxOffsetsPerTrigger")
        records = parse_positive_int(get("maxRecordsPerTrigger"), what="maxRecordsPerTrigger")
        if offsets is not None and records is not None and offsets != records:
            raise PlanningError(
                "rabbitmq_stream: give maxOffsetsPerTrigger or maxRecordsPerTrigger, not both "
                "(records are bounded by offsets: each record takes one offset)"
            )
        low = parse_positive_int(get("minOffsetsPerTrigger"), what="minOffsetsPerTrigger")
        high = offsets if offsets is not None else records
        if low is not None and high is not None and low > high:
            raise PlanningError(
                f"rabbitmq_stream: minOffsetsPerTrigger {low} is above maxOffsetsPerTrigger {high}"
            )
        delay = _amount(get("maxTriggerDelay"), _UNITS_MS, "maxTriggerDelay")
        if delay is not None and low is None:
            raise PlanningError("rabbitmq_stream: maxTriggerDelay needs minOffsetsPerTrigger")
        return cls(
            max_offsets=high,
            min_offsets=low,
            max_trigger_delay_ms=delay if delay is not None else DEFAULT_MAX_TRIGGER_DELAY_MS,
            max_bytes=_amount(get("maxBytesPerTrigger"), _UNITS_BYTES, "maxBytesPerTrigger"),
        )

    def default_limit(self) -> ReadLimit:
        """The one limit Spark is told about (it can hold only one): the others apply anyway."""
        if self.min_offsets is not None:
            return ReadMinRows(self.min_offsets)
        if self.max_offsets is not None:
            return ReadMaxRows(self.max_offsets)
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def budget(self, limit: ReadLimit, *, available_now: bool) -> Budget:
        """Every configured limit plus the one Spark passed. ``ReadAllAvailable`` while a limit is
        configured is Spark overriding them (admit everything); under AvailableNow a minimum is
        ignored, as Kafka does (the run must reach its target and stop)."""
        configured = self.default_limit()
        if isinstance(limit, ReadAllAvailable) and not isinstance(configured, ReadAllAvailable):
            return Budget()
        max_offsets = _least(self.max_offsets, limit.max_rows if isinstance(limit, ReadMaxRows) else None)
        max_bytes = _least(self.max_bytes, limit.max_bytes if isinstance(limit, ReadMaxBytes) else None)
        low = self.min_offsets or 0
        if isinstance(limit, ReadMinRows):
            low = max(low, limit.min_rows)
        return Budget(max_offsets, max_bytes, 0 if available_now else low)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def admit_bytes(
    starts: Mapping[str, int], ends: Mapping[str, int], bytes_per_offset: Mapping[str, float], max_bytes: int
) -> dict[str, int]:
    """Cut the admitted ``[start, end)`` of every stream so that their estimated bytes add up to at
    most ``max_bytes``, each stream keeping the same share of its admitted offsets; a non-empty
    admission keeps at least one offset (a soft limit: one record larger than the limit still moves)."""
    sizes = {s: (ends[s] - starts[s]) * max(bytes_per_offset.get(s, 0.0), 0.0) for s in starts}
    total = sum(sizes.values())
    if total <= max_bytes:
        return dict(ends)
    fraction = max_bytes / total
    out = {}
    for s in starts:
        width = ends[s] - starts[s]
        if width <= 0 or sizes[s] == 0:  # nothing admitted, or no size known: left as it is
            out[s] = ends[s]
        else:
            out[s] = starts[s] + max(1, int(width * fraction))
    return out
