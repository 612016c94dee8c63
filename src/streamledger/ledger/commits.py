"""Commits: a claimed range marked processed (alone or a batch's ranges together), its counts checked,
its broker offset recorded as stored, or the claim given up.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from streamledger.ledger.errors import LedgerError
from streamledger.ledger.models import Range, Source
from streamledger.ledger.rows import chunks, clip, snapshot
from streamledger.ledger.sources import Sources
from streamledger.ledger.statements import COMMIT_CLAIMED, COMMIT_CLAIMED_PG
from streamledger.ledger.types import CommitRequest, OffsetRange, RangeStatus
from streamledger.offsets import ChunkPrint


class Commits(Sources):
    """Committing and failing claimed ranges."""

    def commit_many(self, commits: Sequence[CommitRequest]) -> list[OffsetRange]:
        """:meth:`commit` for every range of a batch in one transaction: all take effect, or, when
        one is refused, none does. The rows are locked and read together (id order, a statement per
        500), then each request is checked and applied in request order by :meth:`_commit_row`, the
        code :meth:`commit` runs when its one-statement path does not apply (the same errors); the
        changed rows are written back in a few batched UPDATEs, not one per range."""
        if not commits:
            return []
        with self._joined(f"commit of ranges {[c.range_id for c in commits]}"[:200]) as session:
            loaded = self._load_many(session, [c.range_id for c in commits], lock=True)
            now = self._clock(session)
            out = []
            for c in commits:
                if c.range_id not in loaded:
                    self._load(session, c.range_id, lock=True)  # raises: not an id, or no such range
                row, pipeline, src = loaded[c.range_id]
                out.append(self._commit_row(row, pipeline, src, c, now))
            session.flush()
            return out

    def mark_offsets_stored(self, range_ids: Sequence[int], verified: bool) -> None:
        """:meth:`mark_offset_stored` for several ranges in one transaction: the rows locked and
        checked, then marked, a statement per 500 ranges; a range that is not there or not
        committed is refused by :meth:`mark_offset_stored` itself (its error), nothing marked."""
        ids = sorted(set(range_ids))
        if not ids:
            return
        with self._joined(f"mark offsets stored for ranges {ids}"[:200]) as session:
            committed: set[int] = set()
            for chunk in chunks(ids):
                rows = session.execute(select(Range.id, Range.status).where(Range.id.in_(chunk))
                                       .order_by(Range.id).with_for_update())
                committed.update(int(i) for i, st in rows if st == RangeStatus.COMMITTED.value)
            for range_id in ids:
                if range_id not in committed:
                    self.mark_offset_stored(range_id, verified)  # raises, naming the range and why
            now = self._clock_sql()
            for chunk in chunks(ids):
                session.execute(update(Range).where(Range.id.in_(chunk))
                                .values(offset_stored=True, offset_verified=bool(verified), updated_at=now)
                                .execution_options(synchronize_session=False))

    def commit(
        self,
        range_id: int,
        *,
        records: int,
        first_seen: int | None,
        last_seen: int | None,
        output: str | None,
        staging: str | None = None,
        publisher: str | None = None,
        chunk: ChunkPrint | None = None,
    ) -> OffsetRange:
        """Mark a claimed range processed; repeating an identical commit returns it unchanged.

        ``staging`` is where the verified output waits until it is published at ``output`` (without
        it the output is taken as published with the commit); it is
        recorded so a retry after a crash between this commit and the publish can finish it (or any
        later run of the pipeline, see :meth:`take_publish`). ``publisher`` names the committing
        attempt: it receives the publish lease in the same statement, so no other run starts
        publishing between this commit and the committer's own publish. Only
        the holder of the claim can commit (a claim taken from it is failed), which fences a
        worker that lost its claim out of both the commit and the publish. ``chunk`` is the
        fingerprint of the chunk holding a committed record (``SourcePosition.chunk``), recorded with
        a range that has records.
        """
        what = f"commit range {range_id}"
        try:
            self._check_counts(f"range {range_id}", None, records, first_seen, last_seen)
        except LedgerError:
            with self._tx(what, write=False) as session:  # name the stream and span in the error
                row, pipeline, src = self._load(session, range_id, lock=False)
                label = f"range {range_id} ({pipeline} {src.stream} [{row.start_offset}, {row.end_offset}))"
                self._check_counts(label, row, records, first_seen, last_seen)
            raise
        params = {
            "range_id": range_id,
            "empty_commit": records == 0,
            "v_records": records,
            "v_first": first_seen,
            "v_last": last_seen,
            "v_output": clip(output) if output is not None else None,
            "v_staging": clip(staging) if staging is not None else None,
            "v_publisher": publisher if records else None,
            # Without a staging copy the output is already where it belongs: nothing left to publish.
            "v_publish_now": bool(records and staging is None),
            "v_chunk_offset": chunk.offset if chunk is not None and records else None,
            "v_chunk_timestamp": chunk.timestamp if chunk is not None and records else None,
            "v_chunk_crc": chunk.crc if chunk is not None and records else None,
        }
        joined = self._outer() is not None
        if self.dialect == "postgresql" and not joined:
            # The common case is one atomic statement: run it without BEGIN/COMMIT round trips.
            with self._errors(what), self._engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT")
                fast = conn.execute(COMMIT_CLAIMED_PG, params).first()
                if fast is not None:
                    with Session(conn) as session:
                        pipeline, ref = self._source_info(session, fast.source_id)
                    return snapshot(fast, pipeline, ref)
        with self._tx(what) as session:
            fast = None
            if self.dialect == "postgresql":
                if joined:  # the same one statement, inside the batch's transaction
                    fast = session.execute(COMMIT_CLAIMED_PG, params).first()
            else:
                now = self._clock(session)
                fast = session.execute(COMMIT_CLAIMED, {
                    **params,
                    "v_now": now,
                    "v_published": now if params["v_publish_now"] else None,
                    "v_publish_beat": now if params["v_publisher"] is not None else None,
                }).first()
            if fast is not None:
                pipeline, ref = self._source_info(session, fast.source_id)
                return snapshot(fast, pipeline, ref)
            # Not a plain claimed range whose span fits: find out why (or an identical repeat).
            row, pipeline, src = self._load(session, range_id, lock=True)
            request = CommitRequest(range_id, records, first_seen, last_seen, output, staging=staging,
                                    publisher=publisher, chunk=chunk)
            done = self._commit_row(row, pipeline, src, request, self._clock(session))
            session.flush()
            return done

    def _commit_row(self, row: Range, pipeline: str, src: Source, c: CommitRequest,
                    now: datetime) -> OffsetRange:
        """The commit rule on a locked row (:meth:`commit`): its counts checked, an identical repeat
        returned unchanged, a different one or a range not claimed refused; else marked committed
        (the caller flushes)."""
        label = f"range {row.id} ({pipeline} {src.stream} [{row.start_offset}, {row.end_offset}))"
        records, first_seen, last_seen = c.records, c.first_seen, c.last_seen
        self._check_counts(label, row, records, first_seen, last_seen)
        problem = transform_counts_problem(records, c.rows_out, c.dead_letter)
        if problem is not None:
            raise LedgerError(f"{label}: {problem}")
        if row.status == RangeStatus.COMMITTED.value:
            if (row.records, row.first_seen, row.last_seen) == (records, first_seen, last_seen):
                return snapshot(row, pipeline, src)
            raise LedgerError(
                f"{label} is already committed with records={row.records} first_seen={row.first_seen} "
                f"last_seen={row.last_seen}; refusing a different commit"
            )
        if row.status != RangeStatus.CLAIMED.value:
            raise LedgerError(f"{label} is {row.status}; only a claimed range can be committed")
        row.status = RangeStatus.COMMITTED.value
        row.records = records
        row.first_seen = first_seen
        row.last_seen = last_seen
        row.output = clip(c.output) if c.output is not None else None
        row.staging = clip(c.staging) if c.staging is not None else None
        if records and c.publisher is not None:
            row.publisher, row.publish_beat = c.publisher, now
        if records and c.staging is None:
            row.published_at = now
        if records and c.chunk is not None:
            row.chunk_offset, row.chunk_timestamp = c.chunk.offset, c.chunk.timestamp
            row.chunk_crc = c.chunk.crc
        row.rows_out, row.dead_letter, row.transform = c.rows_out, c.dead_letter, c.transform
        row.committed_at = now
        row.updated_at = now
        return snapshot(row, pipeline, src)

    @staticmethod
    def _check_counts(
        label: str, row: Range | None, records: int, first_seen: int | None, last_seen: int | None
    ) -> None:
        if not isinstance(records, int) or isinstance(records, bool) or records < 0:
            raise LedgerError(f"{label}: records must be a non-negative integer, got {records!r}")
        if records == 0:
            if first_seen is not None or last_seen is not None:
                raise LedgerError(
                    f"{label}: 0 records but first_seen/last_seen given ({first_seen}, {last_seen})"
                )
            return
        if first_seen is None or last_seen is None:
            raise LedgerError(f"{label}: {records} records need first_seen and last_seen")
        if first_seen > last_seen:
            raise LedgerError(f"{label}: first_seen {first_seen} is after last_seen {last_seen}")
        if row is not None and not row.start_offset <= first_seen <= last_seen < row.end_offset:
            raise LedgerError(
                f"{label}: seen offsets {first_seen}..{last_seen} are not inside [{row.start_offset}, "
                f"{row.end_offset})"
            )
        if records > last_seen - first_seen + 1:
            raise LedgerError(
                f"{label}: {records} records cannot fit between offsets {first_seen} and {last_seen}"
            )

    def mark_offset_stored(self, range_id: int, verified: bool) -> None:
        """Record that the broker offset was stored for this committed range (and read back: verified)."""
        with self._tx(f"mark offset stored for range {range_id}") as session:
            row, pipeline, src = self._load(session, range_id, lock=True)
            if row.status != RangeStatus.COMMITTED.value:
                raise LedgerError(
                    f"range {range_id} ({pipeline} {src.stream}) is {row.status}; the broker offset is only "
                    "stored after a commit"
                )
            row.offset_stored = True
            row.offset_verified = bool(verified)
            row.updated_at = self._clock_sql()  # stamped in the UPDATE

    def fail(self, range_id: int, reason: str) -> None:
        """Give up a claimed range; its span is re-claimed as-is by the next claim of the source."""
        with self._tx(f"fail range {range_id}") as session:
            row, pipeline, src = self._load(session, range_id, lock=False)
            # Failing shrinks the live set, which claims read: serialise with them on the source.
            self._lock_sources(session, [src.id])
            row, pipeline, src = self._load(session, range_id, lock=True)
            if row.status == RangeStatus.FAILED.value:
                return
            if row.status != RangeStatus.CLAIMED.value:
                raise LedgerError(
                    f"range {range_id} ({pipeline} {src.stream} [{row.start_offset}, {row.end_offset})) is "
                    f"{row.status}; only a claimed range can fail"
                )
            row.status = RangeStatus.FAILED.value
            row.error = clip(str(reason) or "failed")
            row.updated_at = self._clock_sql()  # stamped in the UPDATE


def transform_counts_problem(records: int, rows_out: int | None, dead_letter: int | None) -> str | None:
    """Why a transform's counts cannot be a range's: negative, or more records set aside than read."""
    if rows_out is not None and (not isinstance(rows_out, int) or rows_out < 0):
        return f"rows_out must be a non-negative integer, got {rows_out!r}"
    if dead_letter is not None and (not isinstance(dead_letter, int) or not 0 <= dead_letter <= records):
        return f"dead_letter must be an integer in 0..{records} (the records read), got {dead_letter!r}"
    return None
