"""What an audit finds: the kinds of finding, one finding, the report, and the broker lookups the
audit asks. Types only, apart from the checks (:mod:`streamledger.ledger.audit`) that make them, so the
batch's proof, the sinks' audits and the HTML page can name them without the audit's SQL."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

BrokerOffsetLookup = Callable[[str, str], int | None]
"""``(stream, reference) -> stored offset`` (inclusive: the last processed record), None when unset."""


class OffsetQuerier(Protocol):
    """Anything with the stream client's ``query_offset(stream, reference)`` (e.g. ``StreamClient``)."""

    def query_offset(self, stream: str, reference: str) -> int | None: ...


Brokers = BrokerOffsetLookup | OffsetQuerier | Mapping[str, BrokerOffsetLookup | OffsetQuerier]
"""What the audit compares stored offsets with: one lookup asked about every source, or a mapping
from broker identity (``SourceRef.broker``) to that broker's lookup, so each source is asked of its
own broker and sources of brokers not in the mapping are skipped with a note."""


MAX_FINDINGS_PER_CHECK = 10_000


class ViolationKind(enum.StrEnum):
    """What an audit finding is about."""

    GAP = "gap"
    OVERLAP = "overlap"
    STUCK_CLAIM = "stuck_claim"
    FAILED_NOT_RETRIED = "failed_not_retried"
    RECORD_COUNT = "record_count"
    BROKER_DRIFT = "broker_drift"
    BROKER_ERROR = "broker_error"
    BEHIND_OPEN_CLAIM = "behind_open_claim"
    UNPUBLISHED = "unpublished"
    OUTPUT_MISSING = "output_missing"
    OUTPUT_MISMATCH = "output_mismatch"
    BROKER_NOT_GIVEN = "broker_not_given"
    SKIPPED = "skipped"
    STREAM_REPLACED = "stream_replaced"
    NAMED_TWICE = "named_twice"
    TRANSFORMED = "transformed"
    """A note, never a finding: which transform produced a run of committed ranges, and what it wrote."""
    UNREAD = "unread"


@dataclass(frozen=True, slots=True)
class Violation:
    """One finding: which pipeline/stream, which offsets (and range, when one row is to blame), and why."""

    kind: ViolationKind
    pipeline: str
    stream: str
    broker: str
    start: int | None
    end: int | None
    range_id: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "pipeline": self.pipeline,
            "stream": self.stream,
            "broker": self.broker,
            "start": self.start,
            "end": self.end,
            "range_id": self.range_id,
            "detail": self.detail,
        }

    def to_text(self) -> str:
        span = f" [{self.start}, {self.end})" if self.start is not None and self.end is not None else ""
        rid = f" range {self.range_id}" if self.range_id is not None else ""
        return f"{self.kind.value:<18} {self.pipeline} {self.stream}{span}{rid}: {self.detail}"


@dataclass(frozen=True, slots=True)
class AuditReport:
    """The audit's verdict: ``clean`` is True when there is no violation of any kind."""

    violations: list[Violation]
    pipelines: list[str]
    sources: int
    ranges: int
    by_status: dict[str, int]
    checked_at: datetime
    stale_after: timedelta
    broker_checked: bool
    truncated: bool = False
    elapsed_s: float = 0.0
    notes: tuple[Violation, ...] = ()
    """Findings that do not make the ledger wrong: work in flight (e.g. committed ranges waiting
    behind a claim that is still beating; they become violations once the claim is stale), spans
    recorded as deliberately skipped, and sources whose broker was not given to the audit."""
    outputs_checked: bool = False
    """Whether the published outputs were compared with the ledger (``streamledger.batch.audit_outputs``)."""

    @property
    def clean(self) -> bool:
        return not self.violations

    def with_findings(self, violations: Sequence[Violation], notes: Sequence[Violation] = (),
                      *, outputs_checked: bool = False) -> AuditReport:
        """This report plus findings of a check made outside the database (the published outputs)."""
        found = sorted([*self.violations, *violations],
                       key=lambda v: (v.pipeline, v.stream, v.broker, v.start if v.start is not None else -1))
        return dataclasses.replace(self, violations=found, notes=(*self.notes, *notes),
                                   outputs_checked=self.outputs_checked or outputs_checked)

    def of_kind(self, kind: ViolationKind) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "checked_at": self.checked_at.isoformat(),
            "pipelines": self.pipelines,
            "sources": self.sources,
            "ranges": self.ranges,
            "by_status": self.by_status,
            "stale_after_s": self.stale_after.total_seconds(),
            "broker_checked": self.broker_checked,
            "outputs_checked": self.outputs_checked,
            "truncated": self.truncated,
            "elapsed_s": round(self.elapsed_s, 3),
            "violation_counts": {k.value: len(self.of_kind(k)) for k in ViolationKind if self.of_kind(k)},
            "violations": [v.to_dict() for v in self.violations],
            "notes": [v.to_dict() for v in self.notes],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_text(self) -> str:
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(self.by_status.items())) or "no ranges"
        skipped = sum(1 for n in self.notes if n.kind == ViolationKind.BROKER_NOT_GIVEN)
        checked = "checked" if self.broker_checked else "not checked (no broker given)"
        if skipped:
            checked += f" ({skipped} source(s) of brokers not given were not compared)"
        lines = [
            f"ledger audit at {self.checked_at.isoformat(timespec='seconds')}: "
            f"{len(self.pipelines)} pipeline(s), {self.sources} source(s), "
            f"{self.ranges} range(s) ({statuses})",
            f"broker offsets: {checked}; claims older than {self.stale_after} count as stuck; "
            f"published outputs: {'checked' if self.outputs_checked else 'not checked'}",
        ]
        if self.clean:
            lines.append(
                "CLEAN: no gaps, overlaps, stuck claims, unretried failures, unpublished or missing outputs, "
                "count or broker disagreements"
            )
        else:
            lines.append(f"VIOLATIONS: {len(self.violations)}" + (" (truncated)" if self.truncated else ""))
            lines.extend("  " + v.to_text() for v in self.violations)
        if self.notes:
            lines.append(f"NOTES (work in flight, skipped spans, brokers not given): {len(self.notes)}")
            lines.extend("  " + v.to_text() for v in self.notes)
        return "\n".join(lines)
