"""Positions and watermarks: where a pipeline stands on its sources, read for many sources at once."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import BigInteger, case, func, literal, or_, select, true
from sqlalchemy.orm import Session

from streamledger.ledger.models import Range, Source
from streamledger.ledger.names import BrokerNames
from streamledger.ledger.rows import check_pipeline, chunks, snapshot
from streamledger.ledger.sources import Sources
from streamledger.ledger.statements import (
    ANY_PINNED,
    FIRST_REDO,
    FIRST_UNCONTINUED,
    FREE_CLAIM,
    IS_UNPUBLISHED,
    LIVE,
    ORIGIN_START,
    REDO_POINTS,
    STARTS_AT,
    any_pinned_of,
    tail_of,
)
from streamledger.ledger.types import (
    RangeStatus,
    SameBroker,
    SourcePosition,
    SourceRef,
    Watermark,
    is_retired,
)
from streamledger.offsets import ChunkPrint


class Positions(Sources, BrokerNames):
    """Watermarks (the contiguous done prefix) and positions of sources (with the one-broker records
    of their names, :class:`BrokerNames`)."""

    @staticmethod
    def _first_gap(session: Session, source_id: int, *, pinned: bool | None = None) -> int | None:
        """The first offset from the history's origin (the lowest start of any of its ranges, a
        failed first claim included: audit rule 1) that no live range covers: the origin itself
        when no non-empty range starts there, else the earliest end of a non-empty live range that
        no non-empty live range continues (the tail, when none is missing). Only pinned claims
        leave such gaps (offsets of intervals not claimed yet); for a source with pinned ranges
        this walks its ranges (O(ranges), an index-only walk)."""
        if pinned is None:
            pinned = session.scalars(ANY_PINNED, {"source_id": source_id}).first() is not None
        if not pinned:
            return None  # contiguous by the database's guard: the tail is the only end
        origin = session.scalars(ORIGIN_START, {"source_id": source_id}).first()
        if origin is None:
            return None
        if session.scalars(STARTS_AT, {"source_id": source_id, "at": origin}).first() is None:
            return int(origin)
        found = session.scalars(FIRST_UNCONTINUED, {"source_id": source_id}).first()
        return None if found is None else int(found)

    def positions(self, pipeline: str, sources: Sequence[SourceRef], *,
                  stale_after: timedelta | None = None) -> list[SourcePosition]:
        """:meth:`position` of every source, read in one transaction (one consistent view) with
        one statement per kind for all of them."""
        check_pipeline(pipeline)
        with self._tx(f"positions of {pipeline!r}", write=False) as session:
            return self._positions(session, pipeline, sources, stale_after)

    def watermarks(self, pipeline: str, sources: Sequence[SourceRef]) -> list[Watermark]:
        """:meth:`watermark` of every source, read in one transaction (a few statements for all)."""
        check_pipeline(pipeline)
        with self._tx(f"watermarks of {pipeline!r}", write=False) as session:
            srcs = self._find_sources(session, pipeline, sources)
            marks = self._watermarks(session, pipeline, [s for s in srcs if s is not None])
            return [Watermark(None, None) if s is None else marks[s.id] for s in srcs]

    def watermark(self, pipeline: str, source: SourceRef) -> Watermark:
        """The end of the source's contiguous done prefix and the last record in it (see Watermark).

        This is the one rule for the broker's stored offset: the batch stores
        ``last_record`` when the broker is behind it, and the audit checks the broker against it.
        """
        return self.watermarks(pipeline, [source])[0]

    def _watermark(self, session: Session, pipeline: str, src: Source) -> Watermark:
        return self._watermarks(session, pipeline, [src])[src.id]

    def _facts(self, session: Session, ids: Sequence[int], *, position: bool = False) -> dict[int, Any]:
        """One row per source id with what the watermark (and, with ``position``, the position)
        starts from, each a correlated subquery: the same statements as for one source, so many
        sources cost one query, not one per kind and source."""
        sid = Source.id
        cols: list[Any] = [
            sid.label("sid"),
            select(Range.id).where(Range.source_id == sid, Range.status == RangeStatus.CLAIMED.value,
                                   Range.end_offset > Range.start_offset)
            .order_by(Range.start_offset).limit(1).scalar_subquery().label("claim"),
            # The first offset the claim rule redoes (a failed range held it, nothing covers it).
            FIRST_REDO.c.redo_at.label("redo"),
            tail_of(sid).scalar_subquery().label("tail"),
            select(Range.id).where(Range.source_id == sid, IS_UNPUBLISHED).order_by(Range.start_offset)
            .limit(1).scalar_subquery().label("unpublished"),
            any_pinned_of(sid).scalar_subquery().label("pinned"),
        ]
        if position:
            cols += [
                select(func.max(Range.last_seen)).where(
                    Range.source_id == sid, Range.status == RangeStatus.COMMITTED.value,
                    Range.offset_stored.is_(True)).scalar_subquery().label("stored"),
                select(Range.status).where(Range.source_id == sid, LIVE)
                .order_by(Range.start_offset, Range.end_offset).limit(1)
                .scalar_subquery().label("first_live"),
                select(Range.id).where(Range.source_id == sid, Range.pinned,  # the partial index
                                       Range.interval_start.is_not(None))
                .limit(1).scalar_subquery().label("pinned_at"),
                select(Range.id).where(Range.source_id == sid, FREE_CLAIM).limit(1)
                .scalar_subquery().label("free_at"),
            ]
        out: dict[int, Any] = {}
        for chunk in chunks(list(ids)):
            out.update((int(r.sid), r) for r in session.execute(
                select(*cols).select_from(Source).outerjoin(FIRST_REDO, FIRST_REDO.c.source_id == sid)
                .where(sid.in_(chunk)), {"ids": chunk}))
        return out

    def _watermarks(self, session: Session, pipeline: str, srcs: Sequence[Source],
                    facts: dict[int, Any] | None = None) -> dict[int, Watermark]:
        """The watermark rule (see :class:`Watermark`) for many sources at once: a few statements
        for all of them (:meth:`_facts`, the rows they name, the last record per source)."""
        facts = facts if facts is not None else self._facts(session, [s.id for s in srcs])
        wanted = {i for f in facts.values() for i in (f.claim, f.unpublished) if i is not None}
        rows = {int(r.id): r for chunk in chunks(sorted(wanted))
                for r in session.scalars(select(Range).where(Range.id.in_(chunk)))}
        ends: dict[int, int] = {}
        for src in srcs:
            f = facts[src.id]
            gap = (self._first_gap(session, src.id, pinned=f.pinned is not None)
                   if f.tail is not None else None)
            candidates = [x for x in (
                rows[f.claim].start_offset if f.claim is not None else None,
                f.redo,
                rows[f.unpublished].start_offset if f.unpublished is not None else None,
                gap,
                f.tail,
            ) if x is not None]
            if candidates:
                ends[src.id] = int(min(candidates))
        holders: dict[int, Any] = {}
        # A done prefix that reaches the tail bounds nothing (no live range ends past the tail: they
        # never overlap), so those sources need no CASE of bounds, the costly part for many sources.
        for chunk in chunks(sorted(ends)):
            short = {i: literal(ends[i], BigInteger()) for i in chunk if ends[i] != facts[i].tail}
            bound = (Range.end_offset <= case(short, value=Source.id, else_=Range.end_offset)
                     if short else true())
            last = (select(Range.id).where(
                Range.source_id == Source.id, Range.status == RangeStatus.COMMITTED.value,
                bound, Range.last_seen.is_not(None),
            ).order_by(Range.last_seen.desc()).limit(1))
            holders.update((int(r.sid), r) for r in session.execute(select(
                Source.id.label("sid"), last.scalar_subquery().label("id"),
                last.with_only_columns(Range.last_seen).scalar_subquery().label("last_seen"),
            ).where(Source.id.in_(chunk))))
        out: dict[int, Watermark] = {}
        for src in srcs:
            if src.id not in ends:
                out[src.id] = Watermark(None, None)
                continue
            f, end = facts[src.id], ends[src.id]
            holder = holders[src.id]
            claim = rows[f.claim] if f.claim is not None else None
            unpublished = rows[f.unpublished] if f.unpublished is not None else None
            out[src.id] = Watermark(
                end=end,
                last_record=None if holder.last_seen is None else int(holder.last_seen),
                blocked_by=snapshot(claim, pipeline, src) if claim is not None and claim.start_offset == end
                else None,
                last_record_range=None if holder.id is None else int(holder.id),
                unpublished=(snapshot(unpublished, pipeline, src)
                             if unpublished is not None and unpublished.start_offset == end else None),
            )
        return out

    def position(self, pipeline: str, source: SourceRef, *,
                 stale_after: timedelta | None = None) -> SourcePosition:
        """Where ``pipeline`` stands on ``source`` (see :class:`SourcePosition`), in one transaction.

        Every poller (the batch, the Airflow sensor and triggers, the Dagster sensor and assets)
        reads the pipeline's position here, through ``streamledger.batch.position.measure``.
        """
        return self.positions(pipeline, [source], stale_after=stale_after)[0]

    def _positions(self, session: Session, pipeline: str, sources: Sequence[SourceRef],
                   stale_after: timedelta | None) -> list[SourcePosition]:
        srcs = self._find_sources(session, pipeline, sources)
        known = [s for s in srcs if s is not None]
        facts = self._facts(session, [s.id for s in known], position=True)
        marks = self._watermarks(session, pipeline, known, facts)
        ids = [s.id for s in known]
        claims: dict[int, list[Range]] = {i: [] for i in ids}
        holes: dict[int, list[Range]] = {i: [] for i in ids}
        # the ranges naming each history's kind (pinned / free) come with the open claims
        kinds = {i for f in facts.values() for i in (f.pinned_at, f.free_at) if i is not None}
        kind_rows: dict[int, Range] = {}
        for chunk in chunks(ids):
            named = sorted(i for s in chunk for i in (facts[s].pinned_at, facts[s].free_at) if i is not None)
            for row in session.scalars(select(Range).where(
                    Range.source_id.in_(chunk),
                    or_(Range.status == RangeStatus.CLAIMED.value, Range.id.in_(named)))
                    .order_by(Range.source_id, Range.start_offset)):
                if row.id in kinds:
                    kind_rows[int(row.id)] = row
                if row.status == RangeStatus.CLAIMED.value:
                    claims[row.source_id].append(row)
            # Failed ranges holding offsets the claim rule redoes (rule 2): work still to do.
            for row in session.scalars(select(Range).where(Range.id.in_(select(REDO_POINTS.c.failed_id)))
                                       .order_by(Range.source_id, Range.start_offset, Range.id),
                                       {"ids": chunk}):
                holes[row.source_id].append(row)
        prints = self._chunk_prints(session, ids)
        elsewhere, same = self._elsewhere(session, pipeline, sources)
        cutoff = (self._clock(session) - stale_after if stale_after is not None and any(claims.values())
                  else None)
        out: list[SourcePosition] = []
        for ref, src in zip(sources, srcs, strict=True):
            others = elsewhere.get((ref.broker, ref.stream), ())
            found = same.get((ref.broker, ref.stream), ())
            recorded = tuple(r for r in found if r.source.broker == ref.broker)
            joined = tuple(r for r in found if r.source.broker != ref.broker)
            if src is None:
                out.append(SourcePosition(None, 0, None, Watermark(None, None), elsewhere=others,
                                          same_broker=recorded, same_broker_joined=joined))
                continue
            f, mark = facts[src.id], marks[src.id]
            mine = claims[src.id]
            stale: frozenset[int] = frozenset()
            if cutoff is not None and mine:
                stale = frozenset(int(r.id) for r in mine if (r.heartbeat_at or r.claimed_at) < cutoff)
            done = f.first_live in (RangeStatus.COMMITTED.value, RangeStatus.LOST.value)
            out.append(SourcePosition(
                end=None if f.tail is None else int(f.tail),
                epoch=int(src.epoch),
                stored=None if f.stored is None else int(f.stored),
                watermark=mark,
                frontier=mark.end if done else None,
                open_claims=tuple(snapshot(r, pipeline, src) for r in mine),
                stale=stale,
                holes=tuple(snapshot(r, pipeline, src) for r in holes[src.id]),
                chunk=prints.get(src.id) or _seen_chunk(src),
                replaced=src.replaced,
                seen_tail=None if src.seen_tail is None else int(src.seen_tail),
                elsewhere=others,
                pinned_range=None if f.pinned_at is None else snapshot(kind_rows[f.pinned_at], pipeline, src),
                free_range=None if f.free_at is None else snapshot(kind_rows[f.free_at], pipeline, src),
                same_broker=recorded,
                same_broker_joined=joined,
            ))
        return out

    def _elsewhere(self, session: Session, pipeline: str, sources: Sequence[SourceRef]) -> tuple[
            dict[tuple[str, str], tuple[tuple[str, ChunkPrint], ...]],
            dict[tuple[str, str], tuple[SameBroker, ...]]]:
        """(broker, stream) -> the newest chunk print of the pipeline's history of that stream under
        each other live broker identity (retired epochs left out: their stream is gone), and the
        one-broker records of that name (:meth:`BrokerNames.same_broker_rows`). One query per broker
        and 500 names for both, which finds no row in the usual case (one identity per stream)."""
        theirs: dict[tuple[str, str], list[tuple[int, str]]] = {}
        marks: dict[tuple[str, str], list[Any]] = {}
        for broker in sorted({s.broker for s in sources}):
            for part in chunks(sorted({s.stream for s in sources if s.broker == broker})):
                for row in session.execute(self._names_query(pipeline, broker, part)):
                    if row.record:
                        marks.setdefault((broker, row.stream), []).append(row)
                    elif not is_retired(row.name):
                        theirs.setdefault((broker, row.stream), []).append((int(row.sid), row.name))
        same = self._records_of(session, pipeline, marks, theirs)
        if not theirs:
            return {}, same
        prints = self._chunk_prints(session, sorted({sid for v in theirs.values() for sid, _o in v}))
        out: dict[tuple[str, str], tuple[tuple[str, ChunkPrint], ...]] = {}
        for key, v in theirs.items():
            others = sorted((o, prints[sid]) for sid, o in v if sid in prints)
            if others:
                out[key] = tuple(others)
        return out, same

    @staticmethod
    def _chunk_prints(session: Session, source_ids: Sequence[int]) -> dict[int, ChunkPrint]:
        """The newest fingerprint of a committed chunk per source (by its offset): what the
        re-created-stream check reads the broker's chunk header against."""
        out: dict[int, ChunkPrint] = {}
        for part in chunks(sorted(source_ids)):
            for sid, off, ts, crc in session.execute(
                select(Range.source_id, Range.chunk_offset, Range.chunk_timestamp, Range.chunk_crc)
                .where(Range.source_id.in_(part), Range.chunk_offset.is_not(None),
                       Range.status == RangeStatus.COMMITTED.value)
                .order_by(Range.source_id, Range.chunk_offset)
            ):
                out[int(sid)] = ChunkPrint(int(off or 0), int(ts or 0), int(crc or 0))  # newest wins
        return out


def _seen_chunk(src: Source) -> ChunkPrint | None:
    """The chunk a batch saw when it first claimed from ``src`` (migration 0020): the fingerprint of
    a history whose claims were never committed with records."""
    if src.seen_chunk_offset is None:
        return None
    return ChunkPrint(int(src.seen_chunk_offset), int(src.seen_chunk_timestamp or 0),
                      int(src.seen_chunk_crc or 0))
