"""The audit's rules, one check each: why this module exists is that a reader looking for "how is rule
N checked" finds one short function named after it, not a stretch of a 270-line one.

Each rule follows a numbered rule of docs/ledger.md ("Audit rules") and yields its findings, each a
``(Violation, kept)`` pair: ``kept`` a violation, else a note. :data:`RULES` lists them in the order
the audit runs them (which is the order of its notes); :func:`streamledger.ledger.audit.run_audit`
assembles the report from them. What one rule learns that another needs (the failed holes the gaps
leave to rule 4.1, the watermarks rules 5 and 8 measure against, the status counts of the report) is
computed once, on the :class:`Audit` they share.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, cast

from sqlalchemy import DateTime, String, bindparam, select, text
from sqlalchemy.orm import Session

from streamledger.errors import StreamledgerError
from streamledger.ledger.findings import (
    MAX_FINDINGS_PER_CHECK,
    BrokerOffsetLookup,
    Brokers,
    OffsetQuerier,
    Violation,
    ViolationKind,
)
from streamledger.ledger.models import Source
from streamledger.ledger.rows import chunks
from streamledger.ledger.statements import (
    AUDIT_BEHIND,
    AUDIT_CHUNK_PRINTS,
    AUDIT_FAILED_IN,
    AUDIT_GAPS_OVERLAPS,
    AUDIT_HEAD_GAPS,
    AUDIT_PINNED_SINCE,
    AUDIT_PIPELINE_SCOPE,
    AUDIT_ROW_CHECKS_AND_COUNTS,
    AUDIT_ROW_DETAILS,
    AUDIT_SKIPPED,
    AUDIT_SOURCES,
    AUDIT_UNPUBLISHED,
    audit_failed_sql,
)
from streamledger.ledger.types import SKIP_RUN_DAG, SKIP_RUN_TASK, RangeStatus, Watermark, is_retired
from streamledger.offsets import ChunkPrint, same_stream
from streamledger.sources import canonical_identity

Finding = tuple[Violation, bool]
"""One finding of a rule, and whether it is kept as a violation (else it is a note)."""


@dataclass
class Audit:
    """One audit in progress, inside one read transaction: what every rule asks (the sources, the
    scope's query, the database's ``now``) and what a rule learns that another needs, computed once."""

    session: Session
    pipeline: str | None
    broker: Brokers | None
    stale_after: timedelta
    now: datetime
    watermark: Callable[[int], Watermark] | None = None
    truncated: bool = False
    params: dict[str, Any] = field(init=False)
    pipeline_param: Any = field(init=False)
    sources: dict[int, tuple[str, str, str]] = field(init=False)

    def __post_init__(self) -> None:
        self.params = {"pipeline": self.pipeline, "cap": MAX_FINDINGS_PER_CHECK}
        self.pipeline_param = bindparam("pipeline", type_=String())
        self.sources = {
            int(sid): (str(name), str(stream), str(url))
            for sid, name, stream, url in self.session.execute(
                text(AUDIT_SOURCES).bindparams(self.pipeline_param), {"pipeline": self.pipeline}
            )
        }

    def where(self, source_id: int) -> tuple[str, str, str]:
        return self.sources.get(source_id, ("?", "?", "?"))

    def violation(
        self, kind: ViolationKind, source_id: int, start: int | None, end: int | None, rid: int | None,
        why: str,
    ) -> Violation:
        name, stream, url = self.where(source_id)
        return Violation(kind, name, stream, url, start, end, rid, why)

    def query(self, template: str, **types: Any) -> Any:
        """``template`` scoped to the audited pipeline (all of them when None), with ``types`` bound."""
        scope = "TRUE" if self.pipeline is None else AUDIT_PIPELINE_SCOPE
        clause = text(template.format(scope=scope))
        binds = [bindparam(name, type_=t) for name, t in types.items()]
        if self.pipeline is not None:
            binds.append(self.pipeline_param)
        return clause.bindparams(*binds) if binds else clause

    def capped(self, statement: Any) -> Sequence[Any]:
        """All rows of ``statement`` (``LIMIT :cap``); the report says truncated when they reach the cap."""
        rows: Sequence[Any] = self.session.execute(statement, self.params).all()
        self.truncated |= len(rows) >= MAX_FINDINGS_PER_CHECK
        return rows

    @cached_property
    def failed_pieces(self) -> list[Any]:
        """Rule 4.1's pieces: every failed range nobody redid at all, and the rest of one a later
        range covers in part, once unless that very span is one already (a failed claim and the
        remainder a lost span left of it hold the same rest), named by the nearest (greatest start)."""
        failed_q = text(audit_failed_sql(self.pipeline is not None))
        if self.pipeline is not None:
            failed_q = failed_q.bindparams(self.pipeline_param)
        rows = self.capped(failed_q)
        whole = [row for row in rows if (row[2], row[3]) == (row[5], row[6])]
        nearest: dict[tuple[int, int, int], Any] = {}
        for row in rows:
            key = (int(row[1]), int(row[2]), int(row[3]))
            if (row[2], row[3]) != (row[5], row[6]) and (
                    key not in nearest or (row[5], row[0]) > (nearest[key][5], nearest[key][0])):
                nearest[key] = row
        seen = {(int(r[1]), int(r[2]), int(r[3])) for r in whole}
        return [*whole, *(r for k, r in nearest.items() if k not in seen)]

    @cached_property
    def holes(self) -> dict[int, list[tuple[int, int]]]:
        """The failed pieces per source: the only parts of gaps left to rule 4.1."""
        holes: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for _rid, sid, start, end, *_rest in self.failed_pieces:
            holes[int(sid)].append((int(start), int(end)))
        return holes

    @cached_property
    def row_scan(self) -> tuple[dict[str, int], list[int]]:
        """One grouped scan: the ranges per status (the report's counts) and the ids of the rows that
        break rule 5 (a claim not heard from within ``stale_after``) or rule 7 (counts)."""
        by_status: dict[str, int] = {}
        bad_ids: list[int] = []
        for status, bad, count in self.session.execute(
            self.query(AUDIT_ROW_CHECKS_AND_COUNTS, cutoff=DateTime()),
            {**self.params, "cutoff": self.now - self.stale_after},
        ):
            by_status[str(status)] = by_status.get(str(status), 0) + int(count)
            if bad is not None:
                bad_ids.append(int(bad))
        self.truncated |= len(bad_ids) > MAX_FINDINGS_PER_CHECK
        return by_status, bad_ids

    @cached_property
    def watermarks(self) -> dict[int, Watermark]:
        """Each source's done prefix (the ledger's one rule, ``Ledger.watermark``), when it was given."""
        return {sid: self.watermark(sid) for sid in self.sources} if self.watermark is not None else {}

    def seconds_since(self, then: datetime) -> int:
        return int((self.now.replace(tzinfo=UTC) - then).total_seconds())


def _as_utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _uncovered(low: int, high: int, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``[low, high)`` outside every span of ``spans``."""
    out: list[tuple[int, int]] = []
    at = low
    for start, end in sorted(spans):
        if end <= at or start >= high:
            continue
        if start > at:
            out.append((at, start))
        at = max(at, end)
        if at >= high:
            break
    if at < high:
        out.append((at, high))
    return out


def failed_not_retried(audit: Audit) -> Iterator[Finding]:
    """Rule 4.1: every piece of a failed range no live range covers (a hole, the rest of a failed
    range a later range covers in part, below the end or past it): a violation at once, nothing
    works on it until the claim rule redoes it."""
    for rid, sid, start, end, error, held_from, held_to in audit.failed_pieces:
        yield audit.violation(
            ViolationKind.FAILED_NOT_RETRIED,
            sid,
            start,
            end,
            rid,
            f"failed ({error or 'no reason given'}) and no later range redid it"
            + ("" if (start, end) == (held_from, held_to) else
               f": [{start}, {end}) of its span [{held_from}, {held_to}) is covered by no live range"),
        ), True


def gaps_and_overlaps(audit: Audit) -> Iterator[Finding]:
    """Rules 1-4: the history from its origin, each overlap of live ranges (rule 3) and each gap
    between them (rule 4.2; what a failed range held is rule 4.1's)."""
    session = audit.session
    rows = audit.capped(audit.query(AUDIT_GAPS_OVERLAPS))
    gaps: list[tuple[int, int, int, int]] = []  # (source, low, high, the range after it)
    for rid, sid, start, end, prev_end in rows:
        if start > prev_end:
            gaps.append((int(sid), int(prev_end), int(start), int(rid)))
        else:  # rule 3
            yield audit.violation(
                ViolationKind.OVERLAP,
                sid,
                start,
                min(end, prev_end) if end > start else start,
                rid,
                f"range {rid} [{start}, {end}) starts before an earlier range ends at {prev_end}",
            ), True
    head = audit.capped(text(AUDIT_HEAD_GAPS).bindparams(audit.pipeline_param))
    gaps += [(int(sid), int(origin), int(first), int(nxt)) for sid, origin, first, nxt in head]
    # Rule 4.2: a gap before a pinned range (bound_by_interval) is an earlier interval whose run has
    # not come yet while runs go in parallel: work in flight until the pinned range is older than
    # stale_after (by the database's clock, as ``now`` is).
    young_pinned: set[int] = set()
    if gaps:
        pinned_q = text(AUDIT_PINNED_SINCE).bindparams(bindparam("ids", expanding=True),
                                                       bindparam("cutoff", type_=DateTime()))
        young_pinned = {int(i) for (i,) in session.execute(
            pinned_q, {"ids": sorted({g[3] for g in gaps}), "cutoff": audit.now - audit.stale_after})}
    for sid, low, high, nxt in sorted(gaps):
        for a, b in _uncovered(low, high, audit.holes.get(sid, [])):
            gap = f"offsets [{a}, {b}) belong to no range (next range {nxt} starts at {high})"
            tried = session.execute(text(AUDIT_FAILED_IN), {"source_id": sid, "low": a, "high": b}).all()
            if tried:
                named = ", ".join(f"{i} [{s}, {e})" for i, s, e in tried)
                gap += f"; failed range(s) {named} held them once and cover nothing"
            if nxt in young_pinned:
                yield audit.violation(ViolationKind.GAP, sid, a, b, None,
                                      gap + "; an earlier interval's run has not come yet"), False
                continue
            yield audit.violation(ViolationKind.GAP, sid, a, b, None, gap), True


def stuck_claims_and_counts(audit: Audit) -> Iterator[Finding]:
    """Rules 5 (claims heard from within ``stale_after``) and 7 (counts), from one scan."""
    _by_status, bad_ids = audit.row_scan
    details = text(AUDIT_ROW_DETAILS).bindparams(bindparam("ids", expanding=True))
    rows = (
        audit.session.execute(details, {"ids": sorted(bad_ids)[:MAX_FINDINGS_PER_CHECK]}).all()
        if bad_ids else []
    )
    for rid, sid, start, end, status, claimed_at, records, first, last, dag, run, task, idx in rows:
        if status == RangeStatus.CLAIMED:
            claimed = _as_utc(claimed_at)
            age = (audit.now.replace(tzinfo=UTC) - claimed) if claimed else timedelta(0)
            yield audit.violation(
                ViolationKind.STUCK_CLAIM,
                sid,
                start,
                end,
                rid,
                f"claimed by {dag}/{run}/{task}[{idx}], not heard from for {int(age.total_seconds())} s "
                "and never committed or failed (release it with `streamledger ledger release-stale`)",
            ), True
        else:
            yield audit.violation(
                ViolationKind.RECORD_COUNT,
                sid,
                start,
                end,
                rid,
                f"records={records} disagrees with first_seen={first} last_seen={last} in [{start}, {end})",
            ), True


def skipped(audit: Audit) -> Iterator[Finding]:
    """Rule 6: deliberately skipped spans cover their offsets and are listed, never silent."""
    skip_q = audit.query(AUDIT_SKIPPED, skip_dag=String(), skip_task=String())
    for rid, sid, start, end, reason in audit.session.execute(
            skip_q, {**audit.params, "skip_dag": SKIP_RUN_DAG, "skip_task": SKIP_RUN_TASK}):
        yield audit.violation(ViolationKind.SKIPPED, sid, start, end, rid,
                              f"recorded as deliberately skipped ({reason or 'no reason given'}); "
                              "nobody reads these offsets"), False


def unpublished(audit: Audit) -> Iterator[Finding]:
    """Rule 9, the ledger's half (the outputs themselves: streamledger.batch.proof): a committed range
    with records whose output is not published, a note while its publish lease is renewed."""
    for rid, sid, start, end, publisher, beat, committed in audit.capped(audit.query(AUDIT_UNPUBLISHED)):
        last = _as_utc(beat) or _as_utc(committed)
        quiet = audit.seconds_since(last) if last else 0
        name, _stream, url = audit.where(sid)
        who = f"publish lease of {publisher}, renewed {quiet} s ago" if publisher else "no publisher"
        retired = is_retired(url)  # a retired epoch's history: no run publishes it any more
        then = ("no run publishes it (a retired epoch's history): publish its staging copy by hand"
                if retired else f"the next run of {name} publishes it from its staging copy")
        finding = audit.violation(
            ViolationKind.UNPUBLISHED, sid, start, end, rid,
            f"committed but its output is not published ({who}); {then}",
        )
        yield finding, retired or quiet > audit.stale_after.total_seconds() or not publisher


def behind_open_claim(audit: Audit) -> Iterator[Finding]:
    """Rule 5: committed ranges behind an open claim, a note while the claim beats."""
    for sid, mark in audit.watermarks.items():
        claim = mark.blocked_by
        if claim is None or mark.end is None:
            continue
        count, low, high = audit.session.execute(
            text(AUDIT_BEHIND), {"source_id": sid, "mark": mark.end}).one()
        if not count:
            continue
        beat = claim.heartbeat_at or claim.claimed_at
        quiet = audit.seconds_since(beat)
        held_for = audit.seconds_since(claim.claimed_at)
        finding = audit.violation(
            ViolationKind.BEHIND_OPEN_CLAIM,
            sid,
            int(low),
            int(high),
            claim.id,
            f"{count} committed range(s) in [{low}, {high}) wait behind claim {claim.id} "
            f"[{claim.start}, {claim.end}) of {claim.run}, claimed {held_for} s ago, last heartbeat "
            f"{quiet} s ago; the broker offset cannot pass it until it commits or fails",
        )
        yield finding, quiet > audit.stale_after.total_seconds()


def marks(audit: Audit) -> Iterator[Finding]:
    """Rule 11: each live source a batch marked ``replaced`` (every batch refuses it, and what the old
    stream held past the ledger's end, up to the tail a batch saw, is unread until ``new-epoch``
    records it lost): a violation naming the cure. A tail a batch saw past the end of the live ranges
    on a source not so marked is a note (offsets on the broker not read yet)."""
    from sqlalchemy import func, or_, select

    from streamledger.ledger.models import Range, Source
    from streamledger.ledger.rows import chunks

    session, sources = audit.session, audit.sources
    live = sorted(sid for sid, (_n, _s, url) in sources.items() if not is_retired(url))
    for chunk in chunks(live):
        marked = session.execute(select(Source.id, Source.replaced, Source.seen_tail).where(
            Source.id.in_(chunk), or_(Source.replaced.is_not(None), Source.seen_tail.is_not(None)))).all()
        if not marked:
            continue
        ends = {int(sid): int(end) for sid, end in session.execute(
            select(Range.source_id, func.max(Range.end_offset)).where(
                Range.source_id.in_([m[0] for m in marked]), Range.status != RangeStatus.FAILED.value)
            .group_by(Range.source_id))}
        for sid, replaced, seen in marked:
            name, stream, url = sources[sid]
            end = ends.get(sid)
            unread = (int(end), int(seen)) if end is not None and seen is not None and seen > end else None
            span = f"; [{unread[0]}, {unread[1]}) a batch saw on it is not read" if unread else ""
            low, high = unread if unread is not None else (None, None)
            if replaced is not None:
                yield (Violation(
                    ViolationKind.STREAM_REPLACED, name, stream, url, low, high, None,
                    f"marked replaced by a batch ({replaced}){span}; every batch refuses it until "
                    f"`streamledger ledger new-epoch --pipeline {name} --stream {stream} --broker {url}` "
                    "(which records what was not read as lost; it refuses a stream the broker still holds)"),
                    True)
            elif unread is not None:
                yield (Violation(
                    ViolationKind.UNREAD, name, stream, url, low, high, None,
                    f"the broker held offsets up to {unread[1]} when a batch last looked; the next batch "
                    "reads them"), False)


def _drift(stored: int | None, mark: Watermark) -> str | None:
    """Why the broker's stored offset disagrees with the watermark, or None when it agrees.

    The broker stores the last processed record (inclusive). It must cover every committed record
    of the done prefix (not behind ``last_record``: a consumer resuming from it would read them
    again) and must not pass the prefix (not beyond ``end - 1``: a consumer would skip offsets no
    range has committed). Between the two lie only offsets without user records.
    """
    if mark.accepts(stored):
        return None
    shown = "no offset" if stored is None else f"offset {stored}"
    if stored is None and mark.last_record is not None:
        return (
            f"the broker stores no offset although the ledger's done prefix ends at {mark.end} with last "
            f"record {mark.last_record}: the stream was deleted and re-created, or the offset reset; "
            "`streamledger ledger new-epoch` starts a new history for a new stream"
        )
    seen = f"last record {mark.last_record}" if mark.last_record is not None else "no record"
    if stored is not None and mark.end is not None and stored > mark.end - 1:
        return (
            f"the broker stores {shown}, AHEAD of the watermark: offsets from {mark.end} are not done "
            f"(ledger: {seen}, done prefix ends at {mark.end}); a consumer resuming from the broker "
            "would skip them"
        )
    return (
        f"the broker stores {shown}, BEHIND the ledger's {seen} of the done prefix (ends at "
        f"{mark.end}); a consumer resuming from the broker would read committed records again"
    )


def _as_lookup(broker: BrokerOffsetLookup | OffsetQuerier) -> BrokerOffsetLookup:
    query = getattr(broker, "query_offset", None)
    if callable(query):
        return cast(BrokerOffsetLookup, query)
    if callable(broker):
        return broker
    raise TypeError(f"broker must be callable(stream, reference) or have query_offset(), got {broker!r}")


def _given(broker: Brokers, identity: str) -> BrokerOffsetLookup | OffsetQuerier | None:
    """What was given for the broker of a source recorded under ``identity``: a mapping's entry
    for it in any spelling (the one rule, :func:`streamledger.sources.canonical_identity`), or the
    single lookup asked about every source (the 0.x API); None: its broker was not given."""
    if not isinstance(broker, Mapping):
        return broker
    own = broker.get(identity)
    if own is None:
        canonical = canonical_identity(identity)
        own = next((v for k, v in broker.items() if canonical_identity(k) == canonical), None)
    return own


def _lookup_for(broker: Brokers, identity: str) -> BrokerOffsetLookup | None:
    """The lookup a source of broker ``identity`` is checked against; None: its broker was not given."""
    own = _given(broker, identity)
    return None if own is None else _as_lookup(own)


def broker_offsets(audit: Audit) -> Iterator[Finding]:
    """Rule 8: the broker's stored offset against the watermark of published ranges, and the broker's
    chunk at the source's newest fingerprint against the one the ledger committed."""
    broker = audit.broker
    if broker is None:
        return
    prints: dict[int, ChunkPrint] = {}
    for sid, off, ts, crc in audit.session.execute(audit.query(AUDIT_CHUNK_PRINTS), audit.params):
        prints[int(sid)] = ChunkPrint(int(off), int(ts), int(crc))  # the newest one per source wins
    unprinted = [sid for sid in audit.sources if sid not in prints]
    for part in chunks(unprinted):  # a history never committed with records: the chunk its claim saw
        for sid, off, ts, crc in audit.session.execute(
                select(Source.id, Source.seen_chunk_offset, Source.seen_chunk_timestamp,
                       Source.seen_chunk_crc)
                .where(Source.id.in_(part), Source.seen_chunk_offset.is_not(None))):
            prints[int(sid)] = ChunkPrint(int(off or 0), int(ts or 0), int(crc or 0))
    for sid, (name, stream, url) in audit.sources.items():
        if is_retired(url):  # a re-created stream's old history: no broker holds it any more
            continue
        lookup = _lookup_for(broker, url)
        if lookup is None:
            skip = f"broker {url} was not given to the audit: its stored offset is not compared"
            yield Violation(ViolationKind.BROKER_NOT_GIVEN, name, stream, url, None, None, None, skip), False
            continue
        try:
            stored = lookup(stream, name)
        except StreamledgerError as exc:
            yield audit.violation(
                ViolationKind.BROKER_ERROR, sid, None, None, None, f"cannot read the stored offset: {exc}"
            ), True
            continue
        chunk = prints.get(sid)
        try:
            same = None if chunk is None else same_stream(_given(broker, url), stream, chunk)
        except StreamledgerError as exc:
            yield audit.violation(
                ViolationKind.BROKER_ERROR, sid, None, None, None, f"cannot read a chunk header: {exc}"), True
            continue
        if same is False and chunk is not None:
            yield audit.violation(
                ViolationKind.STREAM_REPLACED, sid, chunk.offset, None, None,
                f"the broker's chunk at offset {chunk.offset} is not the one the ledger committed "
                f"(timestamp {chunk.timestamp}, CRC {chunk.crc:#010x}): the stream was deleted and "
                "re-created; `streamledger ledger new-epoch` starts a new history for the new stream"), True
            continue
        why = _drift(stored, audit.watermarks.get(sid) or Watermark(None, None))
        if why is not None:
            yield audit.violation(ViolationKind.BROKER_DRIFT, sid, None, None, None, why), True


@dataclass(frozen=True)
class Rule:
    """One numbered rule of docs/ledger.md ("Audit rules"), the kinds of finding it yields, its check."""

    number: str
    kinds: tuple[ViolationKind, ...]
    check: Callable[[Audit], Iterator[Finding]]


RULES: tuple[Rule, ...] = (
    Rule("4.1", (ViolationKind.FAILED_NOT_RETRIED,), failed_not_retried),
    Rule("1-4", (ViolationKind.OVERLAP, ViolationKind.GAP), gaps_and_overlaps),
    Rule("5, 7", (ViolationKind.STUCK_CLAIM, ViolationKind.RECORD_COUNT), stuck_claims_and_counts),
    Rule("6", (ViolationKind.SKIPPED,), skipped),
    Rule("9", (ViolationKind.UNPUBLISHED,), unpublished),
    Rule("5", (ViolationKind.BEHIND_OPEN_CLAIM,), behind_open_claim),
    Rule("11", (ViolationKind.STREAM_REPLACED, ViolationKind.UNREAD), marks),
    Rule("8", (ViolationKind.BROKER_NOT_GIVEN, ViolationKind.BROKER_ERROR, ViolationKind.STREAM_REPLACED,
               ViolationKind.BROKER_DRIFT), broker_offsets),
)
"""The audit's rules in the order it runs them (the order of the report's notes)."""
