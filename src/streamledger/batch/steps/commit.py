"""The commit: every range the job read in one ledger transaction, with the chunk fingerprints; an
ambiguous commit (its reply lost) read back; and what a failed attempt leaves (its uncommitted claims
failed, its staging copy kept while the ledger may point at it). After it a crash is crash B."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from streamledger.batch import outputs
from streamledger.batch.config import BatchError, PartitionStatus
from streamledger.batch.steps.state import BatchState, Part
from streamledger.offsets import ChunkPrint, take_prints

if TYPE_CHECKING:
    from streamledger.ledger import OffsetRange

log = logging.getLogger("streamledger.batch")


class Committing(BatchState):
    """The commit step of a batch and its failure path (a mixin of ``BatchRun``)."""

    def commit(self) -> None:
        """Commit every range the job read, in one ledger transaction (all or none)."""
        from streamledger.ledger import CommitRequest

        todo = [p for p in self.parts if p.result.read]
        finals = [self._final(p.result.stream, p.result.start, p.result.end) for p in todo]
        prints = self.fingerprints(todo)
        asks = []
        for p, final in zip(todo, finals, strict=True):
            r = p.result
            assert p.range is not None
            asks.append(CommitRequest(p.range.id, r.records, r.first_offset, r.last_offset, final,
                                      staging=p.staging, publisher=self.token, chunk=prints.get(r.stream),
                                      rows_out=r.rows, dead_letter=r.dead_letter,
                                      transform=self.fingerprint if r.records else None))
        try:
            done = self.ledger.commit_many(asks) if asks else []
        except Exception as exc:
            done = [self._commit_outcome(p, exc) for p in todo]
        for p, rng, final in zip(todo, done, finals, strict=True):
            p.range = rng
            p.result.status = PartitionStatus.COMMITTED
            p.result.output = final
        self._step("committed")

    def fingerprints(self, todo: Sequence[Part]) -> dict[str, ChunkPrint]:
        """Fingerprints of the chunks holding the last records read, at every commit with records:
        the newest is what the next batch checks, so a stream re-created and grown past the ledger's
        end is told apart as long as retention has not yet taken the newest committed chunk (taking
        them only while none was retained let an old fingerprint roll out of the new stream's
        retention, and the batch then read on from the old end: the model checker's PostgreSQL seed
        2000). One chunk header per source and batch."""
        return take_prints(self.broker, {p.result.stream: int(p.result.last_offset) for p in todo
                                         if p.result.records and p.result.last_offset is not None})

    def _commit_outcome(self, p: Part, exc: Exception) -> OffsetRange:
        """A commit that raised may still have happened (its reply lost with the connection): read
        the range back; when it is committed with this attempt's counts, the commit stands."""
        assert p.range is not None
        r = p.result
        try:
            now = self.ledger.get(p.range.id)
        except Exception as again:
            p.result.status = PartitionStatus.UNKNOWN  # keeps the staging copy: the ledger may point at it
            raise BatchError(f"stream {r.stream!r} range [{r.start}, {r.end}): the commit failed ({exc}) and "
                             f"its outcome cannot be read back ({again}); the staging copy is kept") from exc
        if now.status.value == "committed" and (now.records, now.first_seen, now.last_seen) == (
                r.records, r.first_offset, r.last_offset):
            log.warning("stream %s: the commit of [%d, %d) raised (%s) but the ledger has it committed: "
                        "going on", r.stream, r.start, r.end, exc)
            return now
        raise exc

    def fail(self, reason: str) -> None:
        """Mark this attempt's uncommitted claims failed (best effort; the original error wins).

        The staging copy is deleted only when the ledger says no range of this attempt points at
        it: a claim whose state cannot be read back (the database went away mid-commit) may be
        committed, so its copy stays for the retry.
        """
        keep = False
        for p in self.parts:
            if p.result.status not in (PartitionStatus.CLAIMED, PartitionStatus.UNKNOWN) or p.range is None:
                keep |= p.result.status == PartitionStatus.COMMITTED and p.result.read
                continue
            try:
                now = self.ledger.get(p.range.id)
                if now.status.value == "committed":
                    p.range, p.result.status = now, PartitionStatus.COMMITTED
                    keep |= p.result.read
                    continue
                self.ledger.fail(p.range.id, reason[:500])
                p.result.status = PartitionStatus.FAILED
            except Exception as exc:  # reported in one line, never masks the original error
                log.warning("could not mark range %s failed (its staging copy is kept): %s", p.range.id, exc)
                keep = True
        if self.staging is not None and not keep:
            outputs.remove(self.staging, self.fs)
