"""Sources and epochs: find and lock a source row, where its history ends, range lookups, a new epoch for
a re-created stream and a broker's new identity.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from streamledger.ledger.errors import LedgerError
from streamledger.ledger.models import Pipeline, Range, Source
from streamledger.ledger.names import rename_in_records
from streamledger.ledger.rows import check_pipeline, chunks, clip, snapshot
from streamledger.ledger.session import LedgerSession
from streamledger.ledger.statements import (
    IS_UNPUBLISHED,
    KEEP_SEEN_CHUNK,
    LOAD,
    LOAD_LOCKED,
    LOAD_MANY,
    RAISE_SEEN_TAIL,
    SOURCE_BY_NAME,
    TAIL,
)
from streamledger.ledger.types import OffsetRange, RangeStatus, RunIdentity, SourceRef, retired_broker
from streamledger.offsets import ChunkPrint
from streamledger.runs import LEDGER_DAG
from streamledger.sources import canonical_identity

log = logging.getLogger(__name__)


class Sources(LedgerSession):
    """Source rows: found, created and locked; ranges loaded by id; epochs and broker renames."""

    def _insert(self) -> Callable[[Any], Any]:
        return postgresql.insert if self.dialect == "postgresql" else sqlite.insert

    def _lock_source(self, session: Session, pipeline: str, src: SourceRef) -> Source:
        """The source row, created on first use and locked for the rest of the transaction."""
        return self._make_sources(session, pipeline, [src])[0]

    def _make_sources(self, session: Session, pipeline: str, sources: Sequence[SourceRef]) -> list[Source]:
        """The rows of ``sources`` (in their order), the missing ones created together, all locked for
        the rest of the transaction: a first batch over 1,000 partitions costs a few statements, not
        a handful per source. The rows that exist are locked first, in id order (as every
        multi-source locker does), then the new ones inserted in name order, so two batches over the
        same sources never deadlock. The rows are read again once locked (by name: a row another
        transaction retired meanwhile, :meth:`new_epoch`, is not the one returned)."""
        pg = self.dialect == "postgresql"
        one = len({s.broker for s in sources}) == 1 and len(sources) <= 500
        found = self._find_sources(session, pipeline, sources, lock=one)  # one statement: id order
        locked = {int(row.id) for row in found if row is not None}
        if not one:
            self._lock_sources(session, sorted(locked))
        missing = sorted({(s.broker, s.stream): s for s, row in zip(sources, found, strict=True)
                          if row is None}.items())
        if missing:
            now = self._clock(session)
            insert = self._insert()
            session.execute(insert(Pipeline).values(name=pipeline, created_at=now)
                            .on_conflict_do_nothing(index_elements=["name"]))
            pipeline_id = session.scalars(select(Pipeline.id).where(Pipeline.name == pipeline)).one()
            for chunk in chunks([ref for _name, ref in missing]):
                session.execute(insert(Source).values([
                    {"pipeline_id": pipeline_id, "broker": s.broker, "stream": s.stream,
                     "super_stream": s.super_stream, "created_at": now} for s in chunk])
                    .on_conflict_do_nothing(index_elements=["pipeline_id", "broker", "stream"]))
        if missing or (pg and not one):
            found = self._find_sources(session, pipeline, sources, lock=one)
            self._lock_sources(session, sorted({int(r.id) for r in found if r is not None} - locked))
        made = [row for row in found if row is not None]
        if len(made) != len(found):
            raise LedgerError(f"sources of pipeline {pipeline!r}: a source row was retired while this "
                              "transaction locked it; try again")
        return made

    def _lock_sources(self, session: Session, source_ids: list[int]) -> None:
        """Take the claim lock of these sources (in id order, so two lockers never deadlock)."""
        if self.dialect != "postgresql" or not source_ids:
            return  # SQLite: BEGIN IMMEDIATE already holds the database's single write lock
        session.execute(
            select(Source.id).where(Source.id.in_(source_ids)).order_by(Source.id).with_for_update()
        ).all()

    def _find_source(self, session: Session, pipeline: str, src: SourceRef) -> Source | None:
        names = {"pipeline": pipeline, "broker": src.broker, "stream": src.stream}
        return session.scalars(SOURCE_BY_NAME, names).one_or_none()

    @staticmethod
    def _tail(session: Session, source_id: int) -> int | None:
        """Exclusive end of the source's live ranges (contiguous, so: the one with the greatest start)."""
        return session.scalars(TAIL, {"source_id": source_id}).first()

    def _find_sources(self, session: Session, pipeline: str, sources: Sequence[SourceRef], *,
                      lock: bool = False) -> list[Source | None]:
        """The source rows of ``sources`` (None where there is none yet), as they stand now, one query
        per broker and 500 names; ``lock``: locked in id order (PostgreSQL) within each query."""
        found: dict[tuple[str, str], Source] = {}
        for broker in sorted({s.broker for s in sources}):
            names = [s.stream for s in sources if s.broker == broker]
            for chunk in chunks(names):
                query = (select(Source).join(Pipeline, Pipeline.id == Source.pipeline_id)
                         .where(Pipeline.name == pipeline, Source.broker == broker, Source.stream.in_(chunk)))
                if lock and self.dialect == "postgresql":
                    query = query.order_by(Source.id).with_for_update(of=Source)
                query = query.execution_options(populate_existing=True)
                for src in session.scalars(query):
                    found[(broker, src.stream)] = src
        return [found.get((s.broker, s.stream)) for s in sources]

    def rename_broker(self, old: str, new: str, *, pipeline: str | None = None) -> int:
        """Move sources from broker identity ``old`` to ``new`` (one history per broker).

        Used when a broker's identity changes form (0.1 named it by the URL's host and port; now by
        the cluster name it reports): the first batch that reaches the broker adopts the old rows.
        Refuses when ``new`` already has a history for the same pipeline and stream (two histories
        cannot be merged blindly). The one-broker records (migration 0015) follow the name: a pair
        naming ``old`` names ``new``, and a pair of ``old`` and ``new`` is cleared (one name now).
        Returns the number of sources moved.
        """
        if not old or not new:
            raise LedgerError("rename_broker needs both the old and the new broker identity")
        if old == new:
            return 0
        with self._tx(f"rename broker {old!r} to {new!r}") as session:
            query = select(Source).where(Source.broker == old)
            if pipeline is not None:
                query = query.where(
                    Source.pipeline_id.in_(select(Pipeline.id).where(Pipeline.name == pipeline))
                )
            moving = session.scalars(query.with_for_update()).all()
            for src in moving:
                clash = session.scalars(
                    select(Source.id).where(
                        Source.pipeline_id == src.pipeline_id,
                        Source.broker == new,
                        Source.stream == src.stream,
                    )
                ).first()
                if clash is not None:
                    raise LedgerError(
                        f"stream {src.stream!r} already has a history under broker {new!r} and another "
                        f"under {old!r}; merge them by hand"
                    )
                src.broker = new
            scope = None
            if pipeline is not None:
                scope = list(session.scalars(select(Pipeline.id).where(Pipeline.name == pipeline)))
            rename_in_records(session, old, new, scope)
            self._sources.clear()
            return len(moving)

    def adopt_identity(self, pipeline: str, identity: str, *, legacy: str | None = None) -> int:
        """Move the pipeline's sources recorded under another spelling of broker ``identity`` to it
        (the one rule, :func:`streamledger.sources.canonical_identity`: ``…/%2f`` and ``…/`` are
        ``…/%2F``), and those under ``legacy`` (0.1 named a broker by the URL's host and port);
        a retired epoch's keep their ``#epoch<N>``. One read when there is nothing to move; a
        stream with a history under two spellings is refused (:meth:`rename_broker`: histories are
        never merged blindly). Every writer of a pipeline's history (the batch, ledger-recorded
        streaming) calls it before it reads its position. Returns the number of sources moved."""
        check_pipeline(pipeline)
        with self._tx(f"broker identities of {pipeline!r}", write=False) as session:
            recorded = sorted(session.scalars(
                select(Source.broker).distinct().join(Pipeline, Pipeline.id == Source.pipeline_id)
                .where(Pipeline.name == pipeline)))
        moved = 0
        for old in recorded:
            base, hash_, suffix = old.partition("#")  # a quoted identity holds no raw '#'
            new = identity + hash_ + suffix
            if old != new and (base == legacy or canonical_identity(base) == identity):
                moved += self.rename_broker(old, new, pipeline=pipeline)
        return moved

    def streams_of(self, pipeline: str) -> list[str] | None:
        """The streams ``pipeline`` has a history of (sorted), or None when the ledger knows no such
        pipeline: what a command naming one by hand checks it against."""
        check_pipeline(pipeline)
        with self._tx(f"streams of {pipeline!r}", write=False) as session:
            pid = session.scalars(select(Pipeline.id).where(Pipeline.name == pipeline)).first()
            if pid is None:
                return None
            return sorted(set(session.scalars(select(Source.stream).where(Source.pipeline_id == pid))))

    def pipelines_of(self, stream: str) -> list[str]:
        """The pipelines with a history of ``stream`` (sorted; empty when none has): what a command
        naming a stream without a pipeline checks it against."""
        with self._tx(f"pipelines of stream {stream!r}", write=False) as session:
            return sorted(set(session.scalars(
                select(Pipeline.name).join(Source, Source.pipeline_id == Pipeline.id)
                .where(Source.stream == stream))))

    def last_end(self, pipeline: str, source: SourceRef) -> int | None:
        """Where the next new range would start (None before the first range of this source)."""
        check_pipeline(pipeline)
        with self._tx(f"last_end of {pipeline!r} {source.stream!r}", write=False) as session:
            src = self._find_source(session, pipeline, source)
            return None if src is None else self._tail(session, src.id)

    def _load(self, session: Session, range_id: int, *, lock: bool) -> tuple[Range, str, Source]:
        if not isinstance(range_id, int) or isinstance(range_id, bool):
            raise LedgerError(f"range id must be an integer, got {range_id!r}")
        found = session.execute(LOAD_LOCKED if lock else LOAD, {"range_id": range_id}).one_or_none()
        if found is None:
            raise LedgerError(f"range {range_id} does not exist in the ledger")
        return found[0], found[2], found[1]

    def _load_many(self, session: Session, range_ids: Sequence[int], *,
                   lock: bool) -> dict[int, tuple[Range, str, Source]]:
        """:meth:`_load` of many ranges: their rows (locked in id order), a statement per 500."""
        ids = sorted({i for i in range_ids if isinstance(i, int) and not isinstance(i, bool)})
        found: dict[int, tuple[Range, str, Source]] = {}
        for chunk in chunks(ids):
            query = LOAD_MANY.execution_options(populate_existing=True)
            for row, src, pipeline in session.execute(
                    query.with_for_update(of=Range) if lock else query, {"ids": chunk}):
                found[int(row.id)] = (row, str(pipeline), src)
        return found

    def get(self, range_id: int) -> OffsetRange:
        """The current state of one range."""
        with self._tx(f"read range {range_id}", write=False) as session:
            row, pipeline, src = self._load(session, range_id, lock=False)
            return snapshot(row, pipeline, src)

    def _source_info(self, session: Session, source_id: int) -> tuple[str, SourceRef]:
        """Pipeline name and source of a source id (sources never change, so cached per Ledger)."""
        known = self._sources.get(source_id)
        if known is None:
            name, broker, stream, super_stream = session.execute(
                select(Pipeline.name, Source.broker, Source.stream, Source.super_stream)
                .join(Pipeline, Pipeline.id == Source.pipeline_id)
                .where(Source.id == source_id)
            ).one()
            known = (name, SourceRef(broker, stream, super_stream))
            self._sources[source_id] = known
        return known

    def saw_tails(self, pipeline: str, tails: Mapping[SourceRef, int],
                  prints: Mapping[SourceRef, ChunkPrint] | None = None) -> None:
        """Remember the greatest committed tail a batch saw on each source's stream (sources with a
        history only): if the stream is deleted, :meth:`new_epoch` records what the old stream held
        past the history's end as lost instead of letting it vanish (audit rule 10). ``prints``: a
        user chunk each stream held, kept for a source that has none yet (its first claim's evidence
        of which stream it claimed: :meth:`positions` gives it as ``chunk`` until a commit records a
        newer one, so a stream re-created before that commit is refused, migration 0020)."""
        check_pipeline(pipeline)
        if not tails and not prints:
            return
        with self._tx(f"tails seen by pipeline {pipeline!r}") as session:
            refs = list(tails)
            rows = [{"sid": src.id, "tail": int(tails[ref])}
                    for ref, src in zip(refs, self._find_sources(session, pipeline, refs), strict=True)
                    if src is not None and (src.seen_tail is None or src.seen_tail < int(tails[ref]))]
            if rows:  # one executemany; the condition again, for a batch that raised it meanwhile
                session.connection().execute(RAISE_SEEN_TAIL, rows)
            given = dict(prints or {})
            found = self._find_sources(session, pipeline, list(given))
            firsts = [{"sid": src.id, "offset": p.offset, "timestamp": p.timestamp, "crc": p.crc}
                      for p, src in zip(given.values(), found, strict=True)
                      if src is not None and src.seen_chunk_offset is None]
            if firsts:  # the first evidence is kept: a later one would not be the claimed stream's
                session.connection().execute(KEEP_SEEN_CHUNK, firsts)

    def mark_replaced(self, pipeline: str, source: SourceRef, why: str) -> None:
        """Remember that a batch found the broker holding another stream than the source's history
        (``why``, one line): the signs may vanish later (retention rolls the fingerprinted chunk out,
        the new stream grows past the ledger's end), so every later batch refuses on this record
        until :meth:`new_epoch` starts a new history. The first reason is kept."""
        check_pipeline(pipeline)
        with self._tx(f"stream {source.stream!r} of pipeline {pipeline!r} replaced") as session:
            src = self._find_source(session, pipeline, source)
            if src is not None:
                session.execute(update(Source).where(Source.id == src.id, Source.replaced.is_(None))
                                .values(replaced=clip(why)).execution_options(synchronize_session=False))

    def new_epoch(self, pipeline: str, source: SourceRef, *, reason: str = "") -> tuple[int, int]:
        """Start a new history for a stream that was deleted and re-created (offsets from 0 again).

        The old history is kept, under the broker identity ``<broker>#epoch<N>`` (so neither a
        claim nor a broker check ever mixes the two streams; the audit still covers it), and the
        new epoch begins with an empty committed range ``[0, 0)``: the next batch reads the new
        stream from its first offset. What the old history left unread is recorded ``lost``,
        naming the re-created stream (audit rule 10): the spans failed ranges left that no live
        range redid, and what the old stream held past the history's end (up to the greatest tail a
        batch saw, :meth:`saw_tails`). Nobody can read those offsets any more, and a failure nothing
        can retry would be a finding for ever. Returns ``(old_epoch, new_epoch)``.

        Refused while the history has open claims, or committed ranges whose output is not
        published: once retired, no run publishes them (a batch publishes its current sources'
        ranges only) and they would stay "unpublished" for ever. Refused rather than published
        here because publishing needs the pipeline's sink, output file system and publish lease,
        which only the batch has; the batch that refuses a re-created stream publishes them from
        their staging copies first, so the usual order (a batch refuses, then a new epoch) goes
        through without a step in between.
        """
        check_pipeline(pipeline)
        what = f"new epoch for pipeline {pipeline!r} stream {source.stream!r}"
        with self._tx(what) as session:
            src = self._find_source(session, pipeline, source)
            if src is None:
                raise LedgerError(f"{what}: the ledger has no history for this stream on {source.broker}")
            self._lock_sources(session, [src.id])
            old = int(src.epoch)
            retired = retired_broker(src.broker, old)
            if session.scalars(select(Source.id).where(
                    Source.pipeline_id == src.pipeline_id, Source.broker == retired,
                    Source.stream == src.stream)).first() is not None:
                raise LedgerError(f"{what}: a retired history {retired!r} already exists; refusing to merge")
            open_claims = session.scalars(select(Range.id).where(
                Range.source_id == src.id, Range.status == RangeStatus.CLAIMED.value)).all()
            if open_claims:
                raise LedgerError(
                    f"{what}: claims {sorted(open_claims)} are still open; let them finish or fail them "
                    "(`streamledger ledger release-stale`) first"
                )
            unpublished = session.scalars(select(Range).where(Range.source_id == src.id, IS_UNPUBLISHED)
                                          .order_by(Range.start_offset)).all()
            if unpublished:
                spans = ", ".join(f"[{r.start_offset}, {r.end_offset})" for r in unpublished[:10])
                more = f" and {len(unpublished) - 10} more" if len(unpublished) > 10 else ""
                raise LedgerError(
                    f"{what}: committed ranges {spans}{more} are not published yet and no run would "
                    f"publish them once this history is retired; run a batch of {pipeline!r} first (it "
                    "publishes them from their staging copies before refusing the re-created stream)"
                )
            src.broker = retired
            session.flush()
            now = self._clock(session)
            marker = RunIdentity(LEDGER_DAG, f"new-epoch-{old + 1}", "ledger")
            for start, end in self._unread(session, src.id, src.seen_tail):
                row = self._new_row(src.id, start, end, RangeStatus.LOST, marker, now, error=clip(
                    f"stream deleted and re-created (epoch {old + 1}) before [{start}, {end}) was read"))
                row.pinned = True  # it may lie between pinned ranges (an interval whose run never came)
                session.add(row)
                log.warning("%s: [%d, %d) of the retired history was never read: recorded lost",
                            what, start, end)
            fresh = Source(pipeline_id=src.pipeline_id, broker=source.broker, stream=source.stream,
                           super_stream=source.super_stream, created_at=now, epoch=old + 1)
            session.add(fresh)
            session.flush()
            row = self._new_row(fresh.id, 0, 0, RangeStatus.COMMITTED, marker, now,
                                error=clip(f"epoch {old + 1} begins: {reason}") if reason else None)
            row.records, row.committed_at = 0, now
            session.add(row)
            self._sources.clear()
            return old, old + 1

    @staticmethod
    def _unread(session: Session, source_id: int, seen_tail: int | None) -> list[tuple[int, int]]:
        """The spans of a source no live range covers that the old stream held, from the history's
        origin: those failed ranges left (holes, and failed ranges past its end), the gaps of a
        pinned history (an interval whose run never claimed: none can come once it is retired), and
        ``[end, seen_tail)`` past the end of its live ranges (from its origin when none is live).
        Once the stream is deleted nobody can read them again. A span below the end and one past it
        are two ranges (the contiguity rule)."""
        rows = session.execute(select(Range.start_offset, Range.end_offset, Range.status)
                               .where(Range.source_id == source_id, Range.end_offset > Range.start_offset)
                               .order_by(Range.start_offset)).all()
        live = sorted((int(a), int(b)) for a, b, st in rows if st != RangeStatus.FAILED.value)
        failed_end = max((int(b) for _a, b, st in rows if st == RangeStatus.FAILED.value), default=None)
        bounds = session.execute(select(
            func.max(Range.end_offset).filter(Range.status != RangeStatus.FAILED.value),
            func.min(Range.start_offset)).where(Range.source_id == source_id)).one()
        if bounds[1] is None:
            return []
        origin = int(bounds[1])
        cut = int(bounds[0]) if bounds[0] is not None else origin  # holes and gaps lie below it
        top = max([cut, *(t for t in (seen_tail, failed_end) if t is not None)])
        spans: list[tuple[int, int]] = []
        at = origin
        for a, b in [*live, (top, top)]:
            for x, y in ((at, min(a, cut)), (max(at, cut), a)):
                if x < y:
                    spans.append((x, y))
            at = max(at, b)
        return spans

    @staticmethod
    def _new_row(
        source_id: int,
        start: int,
        end: int,
        status: RangeStatus,
        run: RunIdentity,
        now: datetime,
        *,
        error: str | None = None,
    ) -> Range:
        return Range(
            source_id=source_id,
            start_offset=start,
            end_offset=end,
            status=status.value,
            dag_id=run.dag_id,
            run_id=run.run_id,
            task_id=run.task_id,
            map_index=run.map_index,
            try_number=run.try_number,
            offset_stored=False,
            offset_verified=False,
            error=error,
            claimed_at=now,
            updated_at=now,
        )
