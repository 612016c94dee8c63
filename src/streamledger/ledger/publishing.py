"""Publish leases: who may move a committed range's staged output to its final place, and the record
that it is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select, update

from streamledger.ledger.errors import LedgerError
from streamledger.ledger.models import Range, Source
from streamledger.ledger.rows import check_pipeline, chunks, clip, snapshot
from streamledger.ledger.sources import Sources
from streamledger.ledger.statements import IS_UNPUBLISHED
from streamledger.ledger.types import OffsetRange, RangeStatus, SourceRef


class PublishLeases(Sources):
    """Taking, renewing and releasing publish leases; marking outputs published."""

    def unpublished_many(self, pipeline: str, sources: Sequence[SourceRef]) -> list[OffsetRange]:
        """The committed ranges with records whose output is not published yet, of every source in one
        query (by source, then start)."""
        check_pipeline(pipeline)
        with self._tx(f"unpublished ranges of {pipeline!r}", write=False) as session:
            srcs = {s.id: s for s in self._find_sources(session, pipeline, sources) if s is not None}
            out: list[OffsetRange] = []
            for chunk in chunks(sorted(srcs)):
                out += [snapshot(r, pipeline, srcs[r.source_id]) for r in session.scalars(
                    select(Range).where(Range.source_id.in_(chunk), IS_UNPUBLISHED)
                    .order_by(Range.source_id, Range.start_offset))]
            return out

    def take_publish_many(self, requests: Sequence[tuple[int, str | None]], publisher: str, *,
                          lease: timedelta) -> list[OffsetRange | None]:
        """:meth:`take_publish` of several ranges (``(range_id, replace)`` each) in one transaction;
        answers in request order, each decided exactly as :meth:`take_publish` decides it."""
        if not requests:
            return []
        if lease < timedelta(0):
            raise LedgerError(f"lease must not be negative, got {lease}")
        with self._joined(f"take the publish leases of {publisher}") as session:
            # The rows locked and read together, each decided in request order by the rule
            # take_publish applies, written back in one flush: 1,000 ranges were 1,000 loads and
            # flushes (issue 44). Locked in one global order (by id) before any is decided: two
            # batches publishing each other's stranded ranges (each its own first) would otherwise
            # each hold one row and wait for the other's (PostgreSQL: "deadlock detected"; issue 30,
            # defect 5). SQLite's write lock already serialises them.
            loaded = self._load_many(session, [i for i, _r in requests], lock=True)
            now = self._clock(session)
            out = []
            for i, replace in requests:
                if i not in loaded:
                    self._load(session, i, lock=True)  # raises: not an id, or no such range
                row, pipeline, src = loaded[i]
                out.append(self._lease_row(row, pipeline, src, publisher, replace, lease, now))
            session.flush()
            return out

    def mark_published_many(self, range_ids: Sequence[int], publisher: str) -> list[OffsetRange]:
        """:meth:`mark_published` of several ranges in one transaction (all or none): the rows locked
        and read together (id order, a statement per 500), each decided in request order by
        :meth:`_publish_row`, the rule :meth:`mark_published` applies (the same errors), the changed
        rows written back in a batched UPDATE, not one per range."""
        if not range_ids:
            return []
        with self._joined(f"mark ranges published by {publisher}") as session:
            loaded = self._load_many(session, list(range_ids), lock=True)
            now = self._clock(session)
            out = []
            for i in range_ids:
                if i not in loaded:
                    self._load(session, i, lock=True)  # raises: not an id, or no such range
                row, pipeline, src = loaded[i]
                out.append(self._publish_row(row, pipeline, src, publisher, now))
            session.flush()
            return out

    def take_publish(self, range_id: int, publisher: str, *, lease: timedelta,
                     replace: str | None = None) -> OffsetRange | None:
        """Take (or keep) the publish lease of a committed, unpublished range; None if another
        attempt holds a lease renewed within ``lease``, or there is nothing to publish.

        Only the lease holder publishes: a zombie attempt and its retry, or two runs finding the
        same stranded range, never copy into one directory at once. The lease moves only when its
        holder stopped renewing it (:meth:`renew_publish`) for ``lease``, or when the caller
        names the holder in ``replace`` (it knows that holder is gone or superseded: a
        compare-and-swap, so a third attempt that took the lease meanwhile keeps it).
        """
        if lease < timedelta(0):
            raise LedgerError(f"lease must not be negative, got {lease}")
        with self._tx(f"take the publish lease of range {range_id}") as session:
            row, pipeline, src = self._load(session, range_id, lock=True)
            taken = self._lease_row(row, pipeline, src, publisher, replace, lease, self._clock(session))
            session.flush()
            return taken

    @staticmethod
    def _lease_row(row: Range, pipeline: str, src: Source, publisher: str, replace: str | None,
                   lease: timedelta, now: datetime) -> OffsetRange | None:
        """The rule of :meth:`take_publish` on a locked row (the caller flushes)."""
        if row.status != RangeStatus.COMMITTED.value or not row.records or row.published_at is not None:
            return None
        beat = row.publish_beat
        if row.publisher not in (None, publisher, replace) and beat is not None and beat >= now - lease:
            return None
        row.publisher, row.publish_beat, row.updated_at = publisher, now, now
        return snapshot(row, pipeline, src)

    def renew_publish(self, range_ids: list[int], publisher: str) -> list[int]:
        """Renew ``publisher``'s publish leases; returns the ids it still holds (unpublished)."""
        if not range_ids:
            return []
        now = self._clock_sql()
        with self._tx(f"renew publish leases of {publisher}") as session:
            held = session.scalars(
                update(Range)
                .where(
                    Range.id.in_(list(range_ids)),
                    Range.publisher == publisher,
                    Range.published_at.is_(None),
                )
                .values(publish_beat=now)
                .returning(Range.id)
                .execution_options(synchronize_session=False)
            ).all()
            return sorted(int(i) for i in held)

    def release_publish(self, range_id: int, publisher: str) -> bool:
        """Give up ``publisher``'s lease of an unpublished range (its publish failed), so the next
        run takes it at once; True when there was one to give up."""
        with self._tx(f"release the publish lease of range {range_id}") as session:
            done = session.execute(
                update(Range)
                .where(Range.id == range_id, Range.publisher == publisher, Range.published_at.is_(None))
                .values(publisher=None, publish_beat=None)
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(done, "rowcount", 0))

    def mark_published(self, range_id: int, publisher: str, *,
                       table: tuple[str, int] | None = None) -> OffsetRange:
        """Record that the range's output is in its final place (idempotent for its publisher).

        Refused when another attempt holds the lease: that attempt may be copying into the same
        directory, so this one's copy proves nothing. ``table`` is a table sink's receipt,
        ``(table, commit)`` (see ``OffsetRange.sink_table``), recorded in the same statement.
        """
        with self._tx(f"mark range {range_id} published") as session:
            row, pipeline, src = self._load(session, range_id, lock=True)
            done = self._publish_row(row, pipeline, src, publisher, self._clock(session), table=table)
            session.flush()
            return done

    @staticmethod
    def _publish_row(row: Range, pipeline: str, src: Source, publisher: str, now: datetime, *,
                     table: tuple[str, int] | None = None) -> OffsetRange:
        """The rule of :meth:`mark_published` on a locked row (the caller flushes)."""
        label = f"range {row.id} ({pipeline} {src.stream} [{row.start_offset}, {row.end_offset}))"
        if row.status != RangeStatus.COMMITTED.value:
            raise LedgerError(f"{label} is {row.status}; only a committed range is published")
        if row.published_at is not None:
            return snapshot(row, pipeline, src)
        if row.publisher != publisher:
            raise LedgerError(
                f"{label}: the publish lease is held by {row.publisher or 'nobody'}, not {publisher}; "
                "its output was not recorded as published"
            )
        row.published_at, row.updated_at = now, now
        if table is not None:
            row.sink_table, row.sink_commit = clip(table[0]), int(table[1])
        return snapshot(row, pipeline, src)
