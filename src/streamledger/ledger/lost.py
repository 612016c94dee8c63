"""Lost and stale ranges: spans retention removed, spans deliberately skipped, claims whose holder is
gone, and the ranges listing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import and_, func, select, update
from sqlalchemy.orm import Session

from streamledger.ledger.errors import LedgerError
from streamledger.ledger.models import Pipeline, Range, Source
from streamledger.ledger.rows import check_offset, check_pipeline, clip, snapshot
from streamledger.ledger.sources import Sources
from streamledger.ledger.statements import LIVE, ORIGIN_START
from streamledger.ledger.types import (
    ClaimRequest,
    OffsetRange,
    RangeStatus,
    RunIdentity,
    SourceRef,
    skip_identity,
)


def _first_live_over(session: Session, source_id: int, start: int, end: int) -> Range | None:
    """The lowest live, non-empty range of the source overlapping ``[start, end)``: what forbids
    recording any of that span lost or skipped."""
    return session.scalars(select(Range).where(
        Range.source_id == source_id, LIVE, Range.end_offset > Range.start_offset,
        Range.start_offset < end, Range.end_offset > start,
    ).order_by(Range.start_offset).limit(1)).first()


class LostAndStale(Sources):
    """Recording lost and skipped spans, releasing stale claims, listing ranges."""

    @staticmethod
    def _hole_at(session: Session, source_id: int, start: int) -> Range | None:
        """The failed range starting at ``start`` that no live range overlaps, if any."""
        for failed in session.scalars(
            select(Range)
            .where(
                Range.source_id == source_id,
                Range.status == RangeStatus.FAILED.value,
                Range.start_offset == start,
                Range.end_offset > Range.start_offset,
            )
            .order_by(Range.end_offset.desc())
        ):
            overlapping = session.scalars(
                select(Range.id)
                .where(
                    Range.source_id == source_id,
                    LIVE,
                    Range.start_offset < failed.end_offset,
                    Range.end_offset > failed.start_offset,
                    Range.end_offset > Range.start_offset,
                )
                .limit(1)
            ).first()
            if overlapping is None:
                return failed
        return None

    def record_lost(
        self, pipeline: str, source: SourceRef, start: int, end: int, run: RunIdentity, reason: str
    ) -> OffsetRange:
        """Record ``[start, end)`` as lost (retention removed it) instead of failing the pipeline.

        Allowed at the start of the range ``run`` holds claimed (that claim fails; whatever it
        covered beyond ``end`` is left as a failed remainder, which the next claim redoes), else
        wherever no live range covers any of it and it starts where the covered history stops: at
        the source's tail, at the history's origin, at the end of a live range (a gap of a pinned
        history, the uncovered rest of a failed range partly covered by a later range) or inside a
        failed range (a hole; the rest of the failed range stays to redo). A lost span never opens
        a gap before itself.
        """
        check_pipeline(pipeline)
        check_offset("start", start, source.stream)
        check_offset("end", end, source.stream)
        if end <= start:
            raise LedgerError(f"lost span [{start}, {end}) of stream {source.stream!r} is empty or reversed")
        what = f"record lost [{start}, {end}) for pipeline {pipeline!r} stream {source.stream!r}"
        with self._tx(what) as session:
            src = self._lock_source(session, pipeline, source)
            now = self._clock(session)
            mine = session.scalars(
                select(Range).where(
                    Range.source_id == src.id,
                    Range.dag_id == run.dag_id,
                    Range.run_id == run.run_id,
                    Range.task_id == run.task_id,
                    Range.map_index == run.map_index,
                    Range.status == RangeStatus.CLAIMED.value,
                )
            ).one_or_none()
            split: Range | None = None
            pinned = False
            if mine is not None and mine.start_offset == start and end <= mine.end_offset:
                mine.status = RangeStatus.FAILED.value
                mine.error = clip(f"lost: {reason}")
                mine.updated_at = now
                session.flush()
                split = mine
            else:
                hole = self._hole_at(session, src.id, start)
                tail = self._tail(session, src.id)
                if hole is not None and end <= hole.end_offset:
                    split = hole
                elif tail is not None and tail != start:
                    pinned = self._lost_in_gap(session, src.id, start, end, tail, what)
            lost = self._new_row(src.id, start, end, RangeStatus.LOST, run, now, error=clip(reason))
            lost.pinned = pinned
            session.add(lost)
            if split is not None and end < split.end_offset:
                remainder_run = RunIdentity(
                    split.dag_id, split.run_id, split.task_id, split.map_index, split.try_number
                )
                session.add(
                    self._new_row(
                        src.id,
                        end,
                        split.end_offset,
                        RangeStatus.FAILED,
                        remainder_run,
                        now,
                        error=f"remainder of range {split.id} after lost span [{start}, {end})",
                    )
                )
            session.flush()
            return snapshot(lost, pipeline, src)

    @staticmethod
    def _lost_in_gap(session: Session, source_id: int, start: int, end: int, tail: int, what: str) -> bool:
        """Check a lost span away from the tail (:meth:`record_lost`): no live range covers any of
        it, and it starts at the history's origin, at the end of a live range or inside a failed
        range. Returns whether the row must be pinned to pass the database's contiguity guard (it
        lies outside any failed range that holds all of it: a gap of a pinned history)."""
        covering = _first_live_over(session, source_id, start, end)
        if covering is not None:
            raise LedgerError(
                f"{what}: range {covering.id} [{covering.start_offset}, {covering.end_offset}) "
                f"({covering.status}) covers part of it")
        origin = session.scalars(ORIGIN_START, {"source_id": source_id}).first()
        failed = select(Range.id).where(Range.source_id == source_id,
                                        Range.status == RangeStatus.FAILED.value,
                                        Range.start_offset <= start).limit(1)
        stops_here = (start == origin
                      or session.scalars(select(Range.id).where(
                          Range.source_id == source_id, LIVE, Range.end_offset == start).limit(1)).first()
                      or session.scalars(failed.where(Range.end_offset > start)).first())
        if not stops_here:
            raise LedgerError(
                f"{what}: a lost span must start at the ledger's tail {tail}, at the history's origin, at "
                "the end of a live range, inside a failed range, or at the start of the claim this run holds")
        inside = session.scalars(failed.where(Range.end_offset >= end)).first() is not None
        return not inside

    def lost_before(self, pipeline: str, requests: Sequence[ClaimRequest],
                   firsts: Sequence[int]) -> list[list[tuple[int, int]]]:
        """Per pinned claim request, the spans of its history that no range holds (live or failed:
        a failed range's own retry answers for its span) and that lie below ``firsts`` (the first
        offset the broker still has): nobody read them and nobody can any more. The history runs
        from its origin (the request's ``initial_start`` for a source without ranges) to where it
        ends once the request's span is claimed; the span itself is the claim's to settle."""
        check_pipeline(pipeline)
        out: list[list[tuple[int, int]]] = []
        with self._tx(f"unread offsets below retention of {pipeline!r}", write=False) as session:
            found = self._find_sources(session, pipeline, [r.source for r in requests])
            for req, first, src in zip(requests, firsts, found, strict=True):
                span = req.span
                rows: list[tuple[int, int, str, bool]] = []
                if src is not None:
                    rows = [(int(a), int(b), str(st), bool(pin)) for a, b, st, pin in session.execute(
                        select(Range.start_offset, Range.end_offset, Range.status, Range.pinned)
                        .where(Range.source_id == src.id).order_by(Range.start_offset))]
                origin = min((a for a, _b, _s, _p in rows), default=req.initial_start)
                if span is None or origin is None or first <= origin:
                    out.append([])
                    continue
                ends = [b for _a, b, st, _p in rows if st != RangeStatus.FAILED.value]
                bound = min(first, max([*ends, origin, span[1]]))
                # a pinned failed range is its interval's (its retry settles it); an unpinned one
                # over such offsets is an earlier refusal (record_refused): still to decide
                held = sorted([(a, b) for a, b, st, pin in rows
                               if a < b and (st != RangeStatus.FAILED.value or pin)] + [span])
                pieces: list[tuple[int, int]] = []
                at = origin
                for a, b in held:
                    if a > at and at < bound:
                        pieces.append((at, min(a, bound)))
                    at = max(at, b)
                if at < bound:
                    pieces.append((at, bound))
                out.append(pieces)
        return out

    def record_refused(self, pipeline: str, source: SourceRef, start: int, end: int, run: RunIdentity,
                       reason: str) -> None:
        """Record that ``run`` refused to go on over ``[start, end)`` (retention took it before anyone
        read it and ``on_data_loss="fail"``): a failed range, so the span is a finding of the audit
        (``failed_not_retried``, rule 4.1) until it is recorded lost or skipped, while nothing is
        claimed. Not recorded again while a failed range holds all of it."""
        check_pipeline(pipeline)
        what = f"record refused [{start}, {end}) for pipeline {pipeline!r} stream {source.stream!r}"
        if end <= start:
            raise LedgerError(f"{what}: the span is empty or reversed")
        with self._tx(what) as session:
            src = self._lock_source(session, pipeline, source)
            if session.scalars(select(Range.id).where(
                    Range.source_id == src.id, Range.status == RangeStatus.FAILED.value,
                    Range.start_offset <= start, Range.end_offset >= end).limit(1)).first() is not None:
                return
            session.add(self._new_row(src.id, start, end, RangeStatus.FAILED, run, self._clock(session),
                                      error=clip(reason)))
            session.flush()

    def record_skipped(self, pipeline: str, source: SourceRef, start: int, end: int, *,
                       reason: str, tail: int | None = None) -> OffsetRange:
        """Record ``[start, end)`` as deliberately skipped: a span nobody will read (a DAG that does
        not catch up, poison records replayed by hand), so it is audited as such (audit rule 6),
        never left a silent gap. A ``lost`` range held by :func:`skip_identity`, pinned (it may lie
        between pinned ranges); the watermark passes it like any lost span.

        Refused unless no live range covers any of it and it starts where the covered history
        stops (at the history's origin, or at the end of a live range), so a skip never opens a gap
        before itself. ``tail``, the broker's committed tail of the stream when the caller asked it
        (``streamledger ledger skip`` does): a span reaching past it is refused, and so is one
        reaching past the greatest tail a batch saw (``seen_tail``) when no tail is given: offsets
        the stream does not hold yet would put the ledger's end past the broker's, and every later
        batch would refuse the stream as replaced.
        """
        check_pipeline(pipeline)
        check_offset("start", start, source.stream)
        check_offset("end", end, source.stream)
        what = f"skip [{start}, {end}) of pipeline {pipeline!r} stream {source.stream!r} on {source.broker}"
        if end <= start:
            raise LedgerError(f"{what}: the span is empty or reversed")
        if not isinstance(reason, str) or not reason.strip():
            raise LedgerError(f"{what}: give the reason nobody reads it")
        with self._tx(what) as session:
            src = self._find_source(session, pipeline, source)
            if src is None:
                raise LedgerError(f"{what}: the ledger has no history of this source (name the pipeline, "
                                  "stream and broker identity as its ranges do)")
            self._lock_sources(session, [src.id])
            bound, named = ((tail, "the broker's committed tail") if tail is not None
                            else (src.seen_tail, "the greatest committed tail a batch saw"))
            if bound is not None and end > bound:
                raise LedgerError(
                    f"{what}: the span reaches past {named} {bound}; only offsets the stream holds are "
                    "skipped (a ledger end past the tail makes every later batch refuse the stream)")
            now = self._clock(session)
            covering = _first_live_over(session, src.id, start, end)
            if covering is not None:
                raise LedgerError(
                    f"{what}: range {covering.id} [{covering.start_offset}, {covering.end_offset}) "
                    f"({covering.status}) covers part of it; only offsets no live range covers are skipped")
            origin = session.scalars(ORIGIN_START, {"source_id": src.id}).first()
            stops_here = session.scalars(select(Range.id).where(
                Range.source_id == src.id, LIVE, Range.end_offset == start).limit(1)).first()
            if start != origin and stops_here is None:
                raise LedgerError(
                    f"{what}: a skip must start where the covered history stops (its origin {origin} or the "
                    "end of a live range); skipping from here would leave the offsets before it uncovered")
            row = self._new_row(src.id, start, end, RangeStatus.LOST, skip_identity(start, end), now,
                                error=clip(reason.strip()))
            row.pinned = True
            session.add(row)
            session.flush()
            return snapshot(row, pipeline, src)

    def release_stale(self, older_than: timedelta, *, pipeline: str | None = None) -> list[OffsetRange]:
        """Fail every claim not heard from for ``older_than`` (its holder is gone), so its span is redone.

        "Heard from" is the claim's heartbeat (a running batch refreshes it), so a long job is never
        released just for being long; a claim that never beat counts from when it was claimed.
        """
        if older_than < timedelta(0):
            raise LedgerError(f"older_than must not be negative, got {older_than}")
        with self._tx("release stale claims") as session:
            now = self._clock(session)
            cutoff = now - older_than
            query = (
                select(Range, Source, Pipeline.name)
                .join(Source, Source.id == Range.source_id)
                .join(Pipeline, Pipeline.id == Source.pipeline_id)
                .where(
                    Range.status == RangeStatus.CLAIMED.value,
                    func.coalesce(Range.heartbeat_at, Range.claimed_at) < cutoff,
                )
                .order_by(Range.id)
            )
            if pipeline is not None:
                query = query.where(Pipeline.name == pipeline)
            candidates = session.execute(query).all()
            if not candidates:
                return []
            self._lock_sources(session, sorted({src.id for _r, src, _n in candidates}))
            rows = session.execute(query.with_for_update(of=Range)).all()
            if not rows:
                return []
            ids = [r[0].id for r in rows]
            session.execute(
                update(Range)
                .where(and_(Range.id.in_(ids), Range.status == RangeStatus.CLAIMED.value))
                .values(
                    status=RangeStatus.FAILED.value,
                    error=f"released: no heartbeat for {older_than}",
                    updated_at=now,
                )
                .execution_options(synchronize_session=False)
            )
            out = []
            for row, src, name in rows:
                session.refresh(row)
                out.append(snapshot(row, name, src))
            return out

    def ranges(self, pipeline: str | None = None, *, stream: str | None = None) -> list[OffsetRange]:
        """All ranges (optionally of one pipeline / stream) ordered by pipeline, stream, start, id."""
        with self._tx("list ranges", write=False) as session:
            query = (
                select(Range, Source, Pipeline.name)
                .join(Source, Source.id == Range.source_id)
                .join(Pipeline, Pipeline.id == Source.pipeline_id)
                .order_by(Pipeline.name, Source.stream, Source.broker, Range.start_offset, Range.id)
            )
            if pipeline is not None:
                query = query.where(Pipeline.name == pipeline)
            if stream is not None:
                query = query.where(Source.stream == stream)
            return [snapshot(row, name, src) for row, src, name in session.execute(query)]
