"""Claims: the one claim rule, written for SQLite and for PostgreSQL side by side, and the claims'
heartbeats, listing and abandonment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import func, select, union_all, update
from sqlalchemy.orm import Session

from streamledger.ledger.errors import LedgerError
from streamledger.ledger.models import IdleRun, Pipeline, Range, Source
from streamledger.ledger.rows import check_offset, check_pipeline, chunks, snapshot, utc
from streamledger.ledger.sources import Sources
from streamledger.ledger.statements import (
    INSERT_RANGES,
    LIVE,
    OWN_REDO_SPANS,
    PG_CLAIM,
    PG_CLAIM_MANY,
    REDO_SPANS,
    tail_of,
)
from streamledger.ledger.types import (
    UNRECORDED,
    ClaimRequest,
    OffsetRange,
    RangeStatus,
    RunIdentity,
    SourceRef,
)
from streamledger.offsets import ChunkPrint
from streamledger.runs import LEDGER_DAG

_Pinned = tuple[tuple[int, int], tuple[datetime | None, datetime | None]]
"""A pinned claim's span and its interval (naive UTC, as stored; None when not given)."""


@dataclass(frozen=True, slots=True)
class _Ask:
    """One source's checked claim inside :meth:`Ledger._claim_sqlite`."""

    what: str
    source: SourceRef
    end_limit: int
    initial_start: int | None
    pinned: _Pinned | None
    record_free: tuple[int, int] | None = None


_ORIGIN = RunIdentity(LEDGER_DAG, "origin", "ledger")
"""Who holds the empty range that marks where a pinned history begins (``Ledger.claim``)."""


def _idle_run(pipeline_id: int, run: RunIdentity) -> Any:
    """The statement finding ``run``'s key recorded idle on the pipeline (migration 0014)."""
    return select(IdleRun).where(
        IdleRun.pipeline_id == pipeline_id, IdleRun.dag_id == run.dag_id, IdleRun.run_id == run.run_id,
        IdleRun.task_id == run.task_id, IdleRun.map_index == run.map_index)


def redo_spans(session: Session, source_ids: Sequence[int],
               run: RunIdentity | None = None) -> dict[int, tuple[int, int]]:
    """Per source, the span rule 2 of the claim redoes: from the lowest offset a failed range held
    that no live range covers (``statements.redo_spans_sql``). With ``run``, only the failed pinned
    claims of its key count (:meth:`Claims._own_retry_spans`). The watermark stops at its start."""
    statement, key = REDO_SPANS, {}
    if run is not None:
        statement = OWN_REDO_SPANS
        key = {"dag_id": run.dag_id, "run_id": run.run_id, "task_id": run.task_id, "map_index": run.map_index}
    return {int(sid): (int(start), int(end)) for chunk in chunks(list(source_ids))
            for sid, start, end in session.execute(statement, {"ids": chunk, **key})}


def _check_span(span: object, interval: object, stream: str) -> _Pinned | None:
    """A pinned claim's span and interval, checked before anything is claimed."""
    if span is None:
        if interval is not None:
            raise LedgerError(f"an interval for stream {stream!r} needs the span it pins (span=(start, end))")
        return None
    if not isinstance(span, tuple) or len(span) != 2:
        raise LedgerError(f"span for stream {stream!r} must be (start, end), got {span!r}")
    start = check_offset("span start", span[0], stream)
    end = check_offset("span end", span[1], stream)
    if end < start:
        raise LedgerError(f"span [{start}, {end}) of stream {stream!r} is reversed")
    if interval is None:
        return (start, end), (None, None)
    if (not isinstance(interval, tuple) or len(interval) != 2
            or not all(isinstance(t, datetime) for t in interval) or interval[1] < interval[0]):
        raise LedgerError(
            f"interval for stream {stream!r} must be (start, end) datetimes in order, got {interval!r}")
    begin, until = (utc(t).replace(tzinfo=None) for t in interval)
    return (start, end), (begin, until)


def _pinned_answer(what: str, got: OffsetRange, run: RunIdentity, pinned: _Pinned | None) -> OffsetRange:
    """A pinned span another run holds claimed is not processed twice: refused until it is done or
    its holder is gone (abandoned, or failed by the batch's ``holder_alive`` check)."""
    key = (run.dag_id, run.run_id, run.task_id, run.map_index)
    held = got.run
    if pinned is not None and got.status == RangeStatus.CLAIMED and (
            held.dag_id, held.run_id, held.task_id, held.map_index) != key:
        beat = got.heartbeat_at or got.claimed_at
        raise LedgerError(
            f"{what}: [{got.start}, {got.end}) is claimed by {got.run} (heard from at {beat.isoformat()}); "
            "a pinned span is processed by one run at a time"
        )
    return got


def _held_by(session: Session, source_ids: Sequence[int], run: RunIdentity) -> dict[int, Range]:
    """The range ``run``'s key holds on each source: a claimed range first, else the first committed one."""
    held: dict[int, Range] = {}
    for chunk in chunks(list(source_ids)):
        for row in session.scalars(select(Range).where(
                Range.source_id.in_(chunk), Range.dag_id == run.dag_id, Range.run_id == run.run_id,
                Range.task_id == run.task_id, Range.map_index == run.map_index,
                Range.status.in_((RangeStatus.CLAIMED.value, RangeStatus.COMMITTED.value)),
        ).order_by(Range.id)):
            now_held = held.get(row.source_id)
            if now_held is None or (now_held.status != RangeStatus.CLAIMED.value
                                    and row.status == RangeStatus.CLAIMED.value):
                held[row.source_id] = row  # a claimed range first, else the first committed one
    return held


def _free_span(ask: _Ask, tail: int | None, max_span: int | None) -> tuple[int, int]:
    """A free claim's span on a source with no failed span to redo: from its tail (or the first
    claim's ``initial_start``) up to the end limit, at most ``max_span`` offsets."""
    start_or_none = tail if tail is not None else ask.initial_start
    if start_or_none is None:
        raise LedgerError(
            f"{ask.what}: the ledger has no range for this stream yet, so the first claim must "
            "give initial_start (the first offset to read)"
        )
    start = int(start_or_none)
    end = max(start, ask.end_limit)
    if max_span is not None:
        end = min(end, start + max_span)
    return start, end


def _range_values(source_id: int, start: int, end: int, run: RunIdentity, now: datetime, *, settled: bool,
                  pinned: _Pinned | None) -> dict[str, Any]:
    """The row a claim inserts: claimed, or committed at once with no records when ``settled``."""
    return {
        "source_id": source_id,
        "start_offset": start,
        "end_offset": end,
        "status": RangeStatus.COMMITTED.value if settled else RangeStatus.CLAIMED.value,
        "dag_id": run.dag_id,
        "run_id": run.run_id,
        "task_id": run.task_id,
        "map_index": run.map_index,
        "try_number": run.try_number,
        "records": 0 if settled else None,
        "first_seen": None,
        "last_seen": None,
        "output": None,
        "offset_stored": False,
        "offset_verified": False,
        "error": None,
        "claimed_at": now,
        "committed_at": now if settled else None,
        "updated_at": now,
        "heartbeat_at": now,
        "staging": None,
        "pinned": pinned is not None,
        "interval_start": None if pinned is None else pinned[1][0],
        "interval_end": None if pinned is None else pinned[1][1],
    }


class Claims(Sources):
    """Claiming ranges (both dialects), heartbeats and open claims."""

    def claim(
        self,
        pipeline: str,
        source: SourceRef,
        end_limit: int,
        run: RunIdentity,
        *,
        initial_start: int | None = None,
        max_span: int | None = None,
        abandon_after: timedelta | None = None,
        span: tuple[int, int] | None = None,
        interval: tuple[datetime, datetime] | None = None,
        record_free: tuple[int, int] | None = None,
    ) -> OffsetRange:
        """The range ``run`` processes next for ``pipeline`` and ``source``: the one claim rule.

        In one transaction, under the source's lock:

        1. the range ``run``'s key already holds (claimed or committed), whatever ``end_limit``
           says; a claimed one gets its ``try_number`` and heartbeat refreshed, a committed one
           keeps its try and a later try is recorded with the run (:meth:`_record_idle`, migration
           0017, so :meth:`last_try` counts it); a key that holds no
           range of the source but was answered "nothing new" before (on any source of the
           pipeline: ``streamledger_idle_run``) gets nothing again, at the tail;
        2. else, after failing every other claim not heard from for ``abandon_after`` (its holder
           is gone), the lowest offset a failed range held that no live range covers, redone up to
           the end of that failed range or the next live range (a failed range nobody redid comes
           back with exactly its span; the rest of one a later range covers in part comes back
           too: :func:`~streamledger.ledger.statements.redo_spans_sql`);
        3. else ``[tail, min(max(tail, end_limit), tail + max_span))``; ``initial_start`` is the
           tail of a source without ranges (required then, ignored afterwards).

        A *pinned* claim (``span=(start, end)``, a data interval's offsets; ``interval`` is recorded
        with it) replaces 2 and 3: the live range with exactly this span if one exists (committed or
        lost by any run: an idempotent rerun; claimed by another run: refused, it is processed once),
        else exactly ``span``, wherever no live range covers it (overlaps are refused by the
        database). Holes are never taken (a failed interval waits for its own retry), and that
        retry gets back what its failed claim held and no live range covers
        (:meth:`_own_retry_spans`), whatever span it asks for; ``end_limit``/``max_span`` do not
        apply. On a source's first claim an ``initial_start`` before the span is recorded as the
        history's origin (an empty committed range), so offsets from there to the first pinned
        range are a gap the watermark stops at, whichever interval runs first.

        An empty result on a source with a history is answered, not stored (its id is
        :data:`~streamledger.ledger.types.UNRECORDED`; the run is recorded once, for rule 1), so
        idle batches do not grow the ledger; a source's first range is stored even when empty (it
        fixes where the history begins), and so are pinned ones. A range inside ``record_free``
        (offsets the caller probed to hold no user record: tracking chunks) is stored already
        committed with 0 records. Callers never re-derive this rule: they ask here and process what
        they get.
        """
        check_pipeline(pipeline)
        what, pinned = self._claim_checked(pipeline, source, end_limit, run, initial_start, max_span,
                                           abandon_after, span, interval, record_free)
        if self.dialect == "postgresql":
            pinned = self._retry_pinned(pipeline, source, run, pinned)
            got = self._claim_pg(what, pipeline, source, end_limit, run, initial_start, max_span,
                                 abandon_after, pinned, record_free)
            return _pinned_answer(what, got, run, pinned)
        with self._tx(what) as session:
            ask = _Ask(what, source, end_limit, initial_start, pinned, record_free)
            return self._claim_sqlite(session, pipeline, [ask], run, max_span, abandon_after)[0]

    @staticmethod
    def _claim_checked(pipeline: str, source: SourceRef, end_limit: int, run: RunIdentity,
                       initial_start: int | None, max_span: int | None, abandon_after: timedelta | None,
                       span: tuple[int, int] | None, interval: tuple[datetime, datetime] | None,
                       record_free: tuple[int, int] | None = None) -> tuple[str, _Pinned | None]:
        """A claim's arguments checked (before anything is written): its label and pinned span."""
        check_offset("end_limit", end_limit, source.stream)
        if record_free is not None:
            if not isinstance(record_free, tuple) or len(record_free) != 2:
                raise LedgerError(f"record_free for stream {source.stream!r} must be (start, end), "
                                  f"got {record_free!r}")
            if check_offset("record_free end", record_free[1], source.stream) < check_offset(
                    "record_free start", record_free[0], source.stream):
                raise LedgerError(f"record_free {record_free!r} of stream {source.stream!r} is reversed")
        if initial_start is not None:
            check_offset("initial_start", initial_start, source.stream)
        if max_span is not None and (not isinstance(max_span, int) or max_span < 1):
            raise LedgerError(
                f"max_span for stream {source.stream!r} must be a positive integer, got {max_span!r}"
            )
        if abandon_after is not None and abandon_after < timedelta(0):
            raise LedgerError(f"abandon_after must not be negative, got {abandon_after}")
        pinned = _check_span(span, interval, source.stream)
        return f"claim for pipeline {pipeline!r} stream {source.stream!r} by {run}", pinned

    @staticmethod
    def _own_retry_spans(session: Session, source_ids: Sequence[int],
                         run: RunIdentity) -> dict[int, tuple[int, int]]:
        """Per source, what a failed pinned claim of ``run``'s key held and no live range covers
        (from its lowest such offset, :func:`redo_spans`): the run's retry claims exactly it,
        whatever span it asks for. It may ask for less (retention dropped the head, the schedule
        changed); reading the narrower span would leave the head neither read nor recorded lost
        (issue 30, defect 1). It may ask for more than is left when another run covered part of
        the span since; it gets the rest, never an overlap refused for ever."""
        return redo_spans(session, source_ids, run)

    def _retry_pinned(self, pipeline: str, source: SourceRef, run: RunIdentity,
                      pinned: _Pinned | None) -> _Pinned | None:
        """PostgreSQL: a pinned claim's span, replaced by the span its failed claim held
        (:meth:`_own_retry_spans`), read just before the server-side claim (in the caller's
        transaction when there is one). Only this run's key claims that span, so nothing takes it
        in between (another run's overlapping claim is refused by the database)."""
        if pinned is None:
            return None
        with self._tx(f"retry span of {run} for {source.stream!r}", write=False) as session:
            src = self._find_source(session, pipeline, source)
            spans = {} if src is None else self._own_retry_spans(session, [src.id], run)
        return pinned if src is None or src.id not in spans else (spans[src.id], pinned[1])

    def _claim_sqlite(self, session: Session, pipeline: str, asks: Sequence[_Ask], run: RunIdentity,
                      max_span: int | None, abandon_after: timedelta | None) -> list[OffsetRange]:
        """The claim rule (see :meth:`claim`) on SQLite for one or many sources, in the caller's
        transaction (``BEGIN IMMEDIATE`` holds the database's write lock): what it reads is read
        for all sources at once (one statement per kind), then each source is decided by the same
        code and its range inserted."""
        srcs = self._make_sources(session, pipeline, [a.source for a in asks])
        ids = [s.id for s in srcs]
        now = self._clock(session)
        held = _held_by(session, ids, run)
        # A pinned run whose failed claim still holds uncovered pieces claims the next one even when
        # it committed an earlier piece (rule 1 then answers with a claimed range only).
        pinned_ids = [s.id for s, a in zip(srcs, asks, strict=True) if a.pinned is not None and (
            s.id not in held or held[s.id].status != RangeStatus.CLAIMED.value)]
        retry = self._own_retry_spans(session, pinned_ids, run)
        for sid in retry:
            held.pop(sid, None)
        # Rule 1 for a run answered "nothing new" before: nothing again where its key holds no range.
        again = self._idle_again(session, srcs[0].pipeline_id, [
            s.id for s, a in zip(srcs, asks, strict=True) if a.pinned is None and s.id not in held], run)
        fresh = [i for i in ids if i not in held and i not in again]
        if abandon_after is not None and fresh:
            self._abandon(session, fresh, now - abandon_after, now)
        free = [s.id for s, a in zip(srcs, asks, strict=True)
                if s.id not in held and s.id not in again and a.pinned is None]
        redo = redo_spans(session, free)
        tails = self._tails(session, [i for i in free if i not in redo])
        out: list[OffsetRange | None] = []
        made: list[tuple[int, dict[str, Any]]] = []  # (place in out, row): inserted together below
        idle = False  # an empty answer left unstored: the run is recorded (rule 1)
        retried = False  # a committed range handed back to a later try: that try is recorded (0017)
        for ask, src in zip(asks, srcs, strict=True):
            what, source, pinned = ask.what, ask.source, ask.pinned
            mine = held.get(src.id)
            tail = again.get(src.id)
            if mine is not None:
                if mine.status == RangeStatus.CLAIMED.value:
                    mine.try_number = run.try_number
                    mine.heartbeat_at = now
                    mine.updated_at = now
                    session.flush()
                elif run.try_number > mine.try_number:
                    retried = True  # the committed range keeps the try that committed it
                out.append(_pinned_answer(what, snapshot(mine, pipeline, src), run, pinned))
                continue
            if pinned is not None:
                if src.id in retry:
                    pinned = (retry[src.id], pinned[1])
                (start, end), _when = pinned
                done = session.scalars(select(Range).where(
                    Range.source_id == src.id, LIVE, Range.start_offset == start, Range.end_offset == end,
                    Range.end_offset > Range.start_offset)).first()
                if done is not None:
                    out.append(_pinned_answer(what, snapshot(done, pipeline, src), run, pinned))
                    continue
                self._origin_before(session, src.id, ask.initial_start, start, now)
            elif tail is not None:
                start = end = tail  # rule 1: nothing again
            elif src.id in redo:
                start, end = redo[src.id]
            else:
                tail = tails[src.id]
                start, end = _free_span(ask, tail, max_span)
            empty = start == end
            # Nothing to process: committed (0 records) at once, no claim left open. So are offsets
            # the caller probed to hold no user record (tracking chunks).
            settled = empty or (pinned is None and ask.record_free is not None
                             and ask.record_free[0] <= start and end <= ask.record_free[1])
            values = _range_values(src.id, start, end, run, now, settled=settled, pinned=pinned)
            self._sources[src.id] = (pipeline, source)
            if empty and pinned is None and tail is not None:
                # Nothing new on a source with a history: answered, not stored (rule 1 keeps it).
                idle = True
                out.append(snapshot(SimpleNamespace(**values, id=UNRECORDED), pipeline, src))
                continue
            made.append((len(out), values))
            out.append(None)
        if idle or retried:
            self._record_idle(session, srcs[0].pipeline_id, run, now)
        for chunk in chunks(made):
            rows = session.execute(INSERT_RANGES, [v for _i, v in chunk])
            new_ids = {int(sid): int(rid) for sid, rid in rows}
            for i, values in chunk:
                values["id"] = new_ids[values["source_id"]]
                ask, src = asks[i], srcs[i]
                out[i] = _pinned_answer(ask.what, snapshot(SimpleNamespace(**values), pipeline, src), run,
                                        ask.pinned)
        answers = [r for r in out if r is not None]
        assert len(answers) == len(asks)
        return answers

    def _origin_before(self, session: Session, source_id: int, initial_start: int | None, start: int,
                       now: datetime) -> None:
        """A pinned history's origin: the empty marker at ``initial_start`` a first claim records when
        it starts after it (audit rule 1), so the offsets between are a hole of the history."""
        if initial_start is not None and initial_start < start and session.scalars(
                select(Range.id).where(Range.source_id == source_id).limit(1)).first() is None:
            first = initial_start
            origin = self._new_row(source_id, first, first, RangeStatus.COMMITTED, _ORIGIN, now,
                                   error="origin of pinned ranges")
            origin.records, origin.committed_at = 0, now
            session.add(origin)
            session.flush()

    @staticmethod
    def _tails(session: Session, source_ids: Sequence[int]) -> dict[int, int | None]:
        """The tail of each source (None: no live range yet)."""
        tails: dict[int, int | None] = {}
        for chunk in chunks(list(source_ids)):
            tails.update((int(r.sid), None if r.tail is None else int(r.tail)) for r in session.execute(
                select(Source.id.label("sid"), tail_of(Source.id).scalar_subquery().label("tail"))
                .where(Source.id.in_(chunk))))
        return tails

    def _idle_again(self, session: Session, pipeline_id: int, source_ids: Sequence[int],
                    run: RunIdentity) -> dict[int, int]:
        """Sources (of ``source_ids``, with a history) where rule 1 answers ``run`` "nothing new"
        again, with their tails: its key was answered so before on the pipeline
        (:meth:`_record_idle`) and holds no range of the source, whatever its status."""
        if not source_ids or session.scalars(_idle_run(pipeline_id, run)).first() is None:
            return {}
        own: set[int] = set()
        for chunk in chunks(list(source_ids)):
            own.update(int(i) for i in session.scalars(select(Range.source_id).where(
                Range.source_id.in_(chunk), Range.dag_id == run.dag_id, Range.run_id == run.run_id,
                Range.task_id == run.task_id, Range.map_index == run.map_index).distinct()))
        tails = self._tails(session, [i for i in source_ids if i not in own])
        return {i: t for i, t in tails.items() if t is not None}

    @staticmethod
    def _record_idle(session: Session, pipeline_id: int, run: RunIdentity, now: datetime) -> None:
        """Record once that ``run``'s key was answered "nothing new" on the pipeline (rule 1), with
        the highest try answered so (migration 0015: :meth:`last_try` counts it).

        Since 0017 a later try handed back a range its key committed is recorded here too: the
        range keeps the try that committed it (coverage, lost ranges and the audit name that
        attempt), and this row is the one place :meth:`last_try` reads a run's tries beside its
        ranges. Rule 1 is unchanged for the run's sources: each holds its range; a source the
        key never claimed answers that retry "nothing new", as it answered the attempt that
        committed (a retry redoes its run's work, it takes no new work)."""
        row = session.scalars(_idle_run(pipeline_id, run)).first()
        if row is None:
            session.add(IdleRun(pipeline_id=pipeline_id, dag_id=run.dag_id, run_id=run.run_id,
                                task_id=run.task_id, map_index=run.map_index, claimed_at=now,
                                try_number=run.try_number))
        elif row.try_number < run.try_number:
            row.try_number = run.try_number
        else:
            return
        session.flush()

    @staticmethod
    def _abandon(session: Session, source_ids: Sequence[int], before: datetime, now: datetime) -> None:
        """Fail the sources' claims whose holder has not beaten since ``before`` (SQLite path)."""
        seen = func.coalesce(Range.heartbeat_at, Range.claimed_at)
        for chunk in chunks(list(source_ids)):
            for row in session.scalars(
                select(Range).where(
                    Range.source_id.in_(chunk), Range.status == RangeStatus.CLAIMED.value, seen < before
                )
            ):
                last = row.heartbeat_at or row.claimed_at
                row.status = RangeStatus.FAILED.value
                row.error = f"abandoned: no heartbeat since {last}"
                row.updated_at = now
        session.flush()

    def _claim_pg(
        self,
        what: str,
        pipeline: str,
        source: SourceRef,
        end_limit: int,
        run: RunIdentity,
        initial_start: int | None,
        max_span: int | None,
        abandon_after: timedelta | None,
        pinned: _Pinned | None = None,
        record_free: tuple[int, int] | None = None,
    ) -> OffsetRange:
        """PostgreSQL: the same rule in one server-side call (migration 0008), one round trip; its
        ``now`` and abandonment cutoff are the server's clock (:meth:`_clock`)."""
        span, when = pinned if pinned is not None else ((None, None), (None, None))
        params = {
            "pipeline": pipeline,
            "broker": source.broker,
            "stream": source.stream,
            "super_stream": source.super_stream,
            "end_limit": end_limit,
            "dag_id": run.dag_id,
            "run_id": run.run_id,
            "task_id": run.task_id,
            "map_index": run.map_index,
            "try_number": run.try_number,
            "initial": initial_start,
            "max_span": max_span,
            "abandon_secs": None if abandon_after is None else abandon_after.total_seconds(),
            "span_start": span[0],
            "span_end": span[1],
            "interval_start": when[0],
            "interval_end": when[1],
            "free_start": None if record_free is None else record_free[0],
            "free_end": None if record_free is None else record_free[1],
        }
        outer = self._outer()
        if outer is not None:
            with self._errors(what):
                row = outer.execute(PG_CLAIM, params).first()
        else:
            with self._errors(what), self._engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT")  # the call is its own transaction
                row = conn.execute(PG_CLAIM, params).first()
        if row is None:
            raise LedgerError(
                f"{what}: the ledger has no range for this stream yet, so the first claim must give "
                "initial_start (the first offset to read)"
            )
        self._sources[row.source_id] = (pipeline, source)
        return snapshot(row, pipeline, source)

    def claim_many(
        self,
        pipeline: str,
        requests: Sequence[ClaimRequest],
        run: RunIdentity,
        *,
        max_span: int | None = None,
        abandon_after: timedelta | None = None,
        tails: Mapping[SourceRef, int] | None = None,
        prints: Mapping[SourceRef, ChunkPrint] | None = None,
    ) -> list[OffsetRange]:
        """:meth:`claim` for every source of a batch in one transaction (answers in request order).

        Each source gets exactly what :meth:`claim` would give it (the same code decides); the
        claims take effect together, or, when one is refused, none does. Sources that exist already
        are locked first in id order (as every other multi-source locker does), so two batches over
        the same sources never deadlock. ``tails``, the committed tail the batch saw on each
        source's stream, are recorded (:meth:`saw_tails`) in the same transaction: a batch that
        dies right after its claims leaves them known to :meth:`new_epoch` (audit rule 10); so are
        ``prints``, a chunk each stream held, for the sources without one (:meth:`saw_tails`): a
        batch that dies before its first commit leaves evidence of which stream it claimed.
        """
        if not tails and not prints:
            return self._claim_many(pipeline, requests, run, max_span, abandon_after)
        with self._joined(f"claims of pipeline {pipeline!r} by {run} and the tails it saw"):
            got = self._claim_many(pipeline, requests, run, max_span, abandon_after)
            self.saw_tails(pipeline, tails or {}, prints)
            return got

    def _claim_many(self, pipeline: str, requests: Sequence[ClaimRequest], run: RunIdentity,
                    max_span: int | None, abandon_after: timedelta | None) -> list[OffsetRange]:
        check_pipeline(pipeline)
        if len({(r.source.broker, r.source.stream) for r in requests}) != len(requests):
            raise LedgerError(f"claim_many for pipeline {pipeline!r}: a source is named twice")
        if not requests:
            return []
        asks = []
        for r in requests:  # every request checked before anything is claimed
            what, pinned = self._claim_checked(pipeline, r.source, r.end_limit, run, r.initial_start,
                                               max_span, abandon_after, r.span, r.interval, r.record_free)
            asks.append(_Ask(what, r.source, r.end_limit, r.initial_start, pinned, r.record_free))
        if self.dialect != "postgresql":
            with self._tx(f"claims of pipeline {pipeline!r} by {run}") as session:
                return self._claim_sqlite(session, pipeline, asks, run, max_span, abandon_after)
        with self._joined(f"claims of pipeline {pipeline!r} by {run}") as session:
            srcs = self._make_sources(session, pipeline, [r.source for r in requests])  # created, locked
            # a pinned retry gets back what its failed claim held (as claim() does: _retry_pinned)
            retry = self._own_retry_spans(session, [s.id for s, a in zip(srcs, asks, strict=True)
                                                    if a.pinned is not None], run)
            asks = [a if a.pinned is None or s.id not in retry
                    else dataclasses.replace(a, pinned=(retry[s.id], a.pinned[1]))
                    for a, s in zip(asks, srcs, strict=True)]
            return self._claim_pg_many(session, pipeline, asks, srcs, run, max_span, abandon_after)

    def _claim_pg_many(self, session: Session, pipeline: str, asks: Sequence[_Ask], srcs: Sequence[Source],
                       run: RunIdentity, max_span: int | None,
                       abandon_after: timedelta | None) -> list[OffsetRange]:
        """PostgreSQL: :meth:`_claim_pg` of every source in one round trip (migration 0013's
        ``streamledger_claim_many`` calls ``streamledger_claim`` per source), in the caller's
        transaction, the sources created and locked already (:meth:`claim_many`)."""
        def each(pick: Any) -> list[Any]:
            return [pick(a) for a in asks]

        params = {
            "pipeline": pipeline,
            "brokers": each(lambda a: a.source.broker),
            "streams": each(lambda a: a.source.stream),
            "super_streams": each(lambda a: a.source.super_stream),
            "end_limits": each(lambda a: a.end_limit),
            "dag_id": run.dag_id,
            "run_id": run.run_id,
            "task_id": run.task_id,
            "map_index": run.map_index,
            "try_number": run.try_number,
            "initials": each(lambda a: a.initial_start),
            "max_span": max_span,
            "abandon_secs": None if abandon_after is None else abandon_after.total_seconds(),
            "span_starts": each(lambda a: None if a.pinned is None else a.pinned[0][0]),
            "span_ends": each(lambda a: None if a.pinned is None else a.pinned[0][1]),
            "interval_starts": each(lambda a: None if a.pinned is None else a.pinned[1][0]),
            "interval_ends": each(lambda a: None if a.pinned is None else a.pinned[1][1]),
            "free_starts": each(lambda a: None if a.record_free is None else a.record_free[0]),
            "free_ends": each(lambda a: None if a.record_free is None else a.record_free[1]),
        }
        got = {int(row.source_id): row for row in session.execute(PG_CLAIM_MANY, params)}
        out = []
        for ask, src in zip(asks, srcs, strict=True):
            row = got.get(int(src.id))
            if row is None:
                raise LedgerError(
                    f"{ask.what}: the ledger has no range for this stream yet, so the first claim must give "
                    "initial_start (the first offset to read)"
                )
            self._sources[int(src.id)] = (pipeline, ask.source)
            out.append(_pinned_answer(ask.what, snapshot(row, pipeline, ask.source), run, ask.pinned))
        return out

    def own_redo_left(self, pipeline: str, sources: Sequence[SourceRef], run: RunIdentity) -> list[bool]:
        """Per source, whether failed pinned claims of ``run``'s key still hold offsets no live range
        covers: the run's next claim takes the lowest such piece (a failed span a narrower range
        split in two comes back piece by piece), so its batch claims again until none is left."""
        check_pipeline(pipeline)
        with self._tx(f"pieces left to redo by {run}", write=False) as session:
            found = self._find_sources(session, pipeline, list(sources))
            left = redo_spans(session, [s.id for s in found if s is not None], run)
            return [s is not None and s.id in left for s in found]

    def last_try(self, pipeline: str, run: RunIdentity) -> int:
        """The highest try the ledger holds of ``run``'s key on ``pipeline`` (0: none), so a retry
        is numbered past every earlier attempt: its ranges' tries, and since migration 0015 the try
        of an attempt answered "nothing new", which left no range (``streamledger_idle_run``), and
        since 0017 the try of a retry handed back a committed range (recorded in the same row)."""
        check_pipeline(pipeline)
        ranges = (select(Range.try_number.label("try_number"))
                  .join(Source, Source.id == Range.source_id)
                  .join(Pipeline, Pipeline.id == Source.pipeline_id)
                  .where(Pipeline.name == pipeline, Range.dag_id == run.dag_id, Range.run_id == run.run_id,
                         Range.task_id == run.task_id, Range.map_index == run.map_index))
        idle = (select(IdleRun.try_number.label("try_number"))
                .join(Pipeline, Pipeline.id == IdleRun.pipeline_id)
                .where(Pipeline.name == pipeline, IdleRun.dag_id == run.dag_id, IdleRun.run_id == run.run_id,
                       IdleRun.task_id == run.task_id, IdleRun.map_index == run.map_index))
        tries = union_all(ranges, idle).subquery()
        with self._tx(f"last try of {run}", write=False) as session:
            return int(session.scalar(select(func.coalesce(func.max(tries.c.try_number), 0))) or 0)

    def heartbeat(self, range_ids: list[int], run: RunIdentity) -> list[int]:
        """Refresh the heartbeat of ``run``'s claims; returns the ids it still holds.

        A range missing from the answer was taken from ``run`` (abandoned and re-claimed, or
        failed by an operator): the caller has lost it and its commit will be refused.
        """
        if not range_ids:
            return []
        now = self._clock_sql()
        with self._tx(f"heartbeat of {run}") as session:
            held = session.scalars(
                update(Range)
                .where(
                    Range.id.in_(list(range_ids)),
                    Range.status == RangeStatus.CLAIMED.value,
                    Range.dag_id == run.dag_id,
                    Range.run_id == run.run_id,
                    Range.task_id == run.task_id,
                    Range.map_index == run.map_index,
                )
                .values(heartbeat_at=now, updated_at=now)
                .returning(Range.id)
                .execution_options(synchronize_session=False)
            ).all()
            return sorted(int(i) for i in held)

    def open_claims(self, pipeline: str, source: SourceRef) -> list[OffsetRange]:
        """The source's claims that are not committed or failed yet (few: one per running batch)."""
        check_pipeline(pipeline)
        with self._tx(f"open claims of {pipeline!r} {source.stream!r}", write=False) as session:
            src = self._find_source(session, pipeline, source)
            if src is None:
                return []
            rows = session.scalars(
                select(Range)
                .where(Range.source_id == src.id, Range.status == RangeStatus.CLAIMED.value)
                .order_by(Range.start_offset)
            ).all()
            return [snapshot(r, pipeline, src) for r in rows]
