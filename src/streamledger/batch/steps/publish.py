"""The publish: committed ranges moved from staging to their final place under publish leases (this
run's own first, then any an earlier run left stranded), a table sink's one commit, and the cleanup
after it. Crash B of the crash table lands here: a committed range not yet published is finished by the
retry or any later run from its recorded staging copy."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from streamledger import fs as filesystems
from streamledger.batch import outputs, plan, sinks
from streamledger.batch.config import BatchError, PartitionStatus, RunId, StartFrom
from streamledger.batch.steps.reread import Rereading

if TYPE_CHECKING:
    from streamledger.ledger import Ledger, OffsetRange, SourceRef

log = logging.getLogger("streamledger.batch")


class Leases:
    """The publish leases this attempt holds, renewed before each step that moves output (a
    rename, a file copied): the renewal of one is the renewal of all (one ledger statement), and
    where a rename is one atomic step (``atomic``) a renewal younger than ``FRESH`` seconds serves
    the next range's rename too, so 1,000 ranges cost a few statements, not 1,000. A copy onto a
    store without rename renews before every file, so a stalled attempt stops at its next file;
    a stall longer than ``FRESH`` is noticed before the next rename; and the ledger refuses to
    record a range published by an attempt that lost its lease, whatever happened here."""

    FRESH = 1.0

    def __init__(self, ledger: Ledger, token: str, ids: Sequence[int]) -> None:
        self.ledger, self.token = ledger, token
        self.pending = set(ids)
        self.held: set[int] = set()
        self.at = float("-inf")

    def check(self, range_id: int, *, atomic: bool) -> bool:
        """Whether this attempt still holds ``range_id``'s lease (renewing them all if needed)."""
        fresh = atomic and time.monotonic() - self.at < self.FRESH and range_id in self.held
        if not fresh:
            self.held = set(self.ledger.renew_publish(sorted(self.pending | {range_id}), self.token))
            self.at = time.monotonic()
        return range_id in self.held

    def done(self, range_id: int) -> None:
        self.pending.discard(range_id)


class Publishing(Rereading):
    """The publish step of a batch (a mixin of ``BatchRun``)."""

    def publish_stranded(self, sources: Sequence[SourceRef]) -> None:
        """Publish the committed, unpublished ranges of streams this batch refuses as re-created,
        from their verified staging copies only (the broker holds another stream now: nothing is
        read again). Without it `ledger new-epoch`, which refuses to retire a history with such
        ranges, could never go ahead. Best effort: the refusal is the batch's error."""
        todo = [(rng, None, False) for rng in self.ledger.unpublished_many(self.config.pipeline, sources)]
        if not todo:
            return
        self._reread = False
        try:
            self.publish_to_table(self.publish_ranges(todo))
        except Exception as exc:  # reported; new-epoch names what is still unpublished
            log.error("could not publish the committed ranges of the re-created stream(s) %s: %s",
                      [s.stream for s in sources], exc)

    def publish(self) -> None:
        """Publish every committed range of the batch's sources whose output is not in place:
        this run's own first (it must succeed), then any an earlier run left stranded (it died, or
        its publish failed, after the commit), so the offset stored next never passes one."""
        mine = {p.range.id for p in self.parts if p.range is not None}
        todo: list[tuple[OffsetRange, str | None, bool]] = []
        for p in self.parts:
            rng = p.range
            if rng is None or rng.status.value != "committed" or not rng.records:
                continue
            if rng.needs_publish:
                todo.append((rng, p.staging, True))
            elif p.result.start_from == StartFrom.HELD and rng.output and not outputs.published(
                    rng.output, rng.id, self.fs):
                # A retry finds its published output deleted by hand: restore it if the broker still
                # holds exactly the committed records (the audit reports it missing meanwhile).
                self.reread_committed(rng, rng.output, lambda: None)
        # Ranges an earlier run left stranded, for every source in one read (own ones come first).
        touched = [p.source for p in self.touched()]
        todo += [(rng, None, False) for rng in (self.ledger.unpublished_many(self.config.pipeline, touched)
                                                if touched else []) if rng.id not in mine]
        placed = self.publish_ranges(todo)
        self.publish_to_table(placed)
        if self.staging is not None:
            outputs.remove(self.staging, self.fs)
        if self.run.try_number > 1:  # a first try has no earlier attempt to clean up after
            self.sweep_staging()
        self._step("published")

    def _replace(self, rng: OffsetRange) -> str | None:
        """The holder of ``rng``'s publish lease this attempt may take it from: an attempt that is
        superseded (an older try of this run) or gone (``holder_alive``); None otherwise (the lease
        then moves only once its holder stopped renewing it for ``claim_timeout``)."""
        holder = rng.publisher
        if holder and holder != self.token:
            who = RunId.from_attempt_token(holder)
            mine = who is not None and who.key() == self.run.key()
            superseded = mine and who is not None and who.try_number < self.run.try_number
            gone = (who is not None and who.key() != self.run.key() and self.holder_alive is not None
                    and not self.holder_alive(who))
            if superseded or gone:
                return holder
        return None

    def publish_ranges(
        self, todo: Sequence[tuple[OffsetRange, str | None, bool]]
    ) -> list[sinks.SinkRange]:
        """Publish committed ranges (``(range, staging copy, own)``) under their leases, taken for
        all of them in one ledger transaction; a directory sink's ranges are recorded published
        together at the end (also those done before an error), a table sink's are returned for
        :meth:`publish_to_table`."""
        if not todo:
            return []
        lease = timedelta(seconds=self.config.claim_timeout)
        leases = self.ledger.take_publish_many([(rng.id, self._replace(rng)) for rng, _s, _o in todo],
                                               self.token, lease=lease)
        placed: list[sinks.SinkRange] = []
        done: list[int] = []
        self._leases = Leases(self.ledger, self.token, [h.id for h in leases if h is not None])
        try:
            for (rng, staging, own), held in zip(todo, leases, strict=True):
                final = self.publish_range(rng, held, staging, own=own)
                self._leases.done(rng.id)
                if final is None:
                    continue
                if self.sink.name != "directory":
                    placed.append(sinks.SinkRange(held, final,  # type: ignore[arg-type]
                                                  self.epochs.get(rng.source.stream, 0)))
                else:
                    done.append(rng.id)
        except BaseException:
            with contextlib.suppress(Exception):  # what is in place is recorded; the error wins
                self.ledger.mark_published_many(done, self.token)
            # The leases taken ahead for ranges not reached are handed back (stranded ones too: no
            # one else would release them before they expire).
            for (rng, _s, _o), held in zip(todo, leases, strict=True):
                if held is not None and rng.id not in done:
                    with contextlib.suppress(Exception):
                        self.ledger.release_publish(rng.id, self.token)
            raise
        finally:
            self._leases = None
        self.ledger.mark_published_many(done, self.token)
        return placed

    def publish_range(self, rng: OffsetRange, held: OffsetRange | None, staging: str | None, *,
                      own: bool) -> str | None:
        """Publish one committed range whose lease this attempt took (``held``; None when another
        attempt holds it) from the verified staging copy (re-read only when that copy is gone);
        the final location, or None when there is nothing for this attempt to publish."""
        what = f"stream {rng.source.stream!r} range [{rng.start}, {rng.end})"
        if held is None:
            now = self.ledger.get(rng.id)
            if now.published_at is not None:
                return None
            msg = (f"{what}: its output is being published by {now.publisher} (lease renewed at "
                   f"{now.publish_beat}); not publishing it twice")
            if own:
                raise BatchError(msg + "; the broker offset stays before it")
            log.warning("%s; the broker offset stays before it", msg)
            return None
        final = held.output or self._final(rng.source.stream, rng.start, rng.end)

        def guard() -> None:
            leases = self._leases
            held = (leases.check(rng.id, atomic=self.fs.renames_atomically(final)) if leases is not None
                    else rng.id in self.ledger.renew_publish([rng.id], self.token))
            if not held:
                raise BatchError(f"{what}: the publish lease was taken over while publishing to {final}; "
                                 "stopped before the next file")

        if not outputs.published(final, rng.id, self.fs):
            copy = staging or held.staging
            if copy and outputs.load_manifest(copy, self.fs) is not None:
                outputs.publish(copy, final, rng.id, self.fs, guard=guard)
            elif not self._reread:
                raise BatchError(f"{what}: its staging copy is gone and the broker holds another stream "
                                 "now, so it cannot be read again")
            else:
                self.reread_committed(held, final, guard)
            log.info("published %s -> %s%s", what, final, "" if own else " (stranded by an earlier run)")
        return final

    def publish_to_table(self, placed: list[sinks.SinkRange]) -> None:
        """A table sink's one commit for every range this publish placed (the sink first looks
        for them in the table: a retry after a crash between the table commit and this record
        finds its commit there), then each range recorded published with that commit's receipt.
        The leases are renewed just before, so an attempt that lost one stops short of the table."""
        if not placed:
            return
        ids = [r.range.id for r in placed]
        lost = sorted(set(ids) - set(self.ledger.renew_publish(ids, self.token)))
        if lost:
            raise BatchError(f"ranges {lost}: the publish lease was taken over before the {self.sink.name} "
                             "table commit; not committing them twice")
        batch = sinks.SinkBatch(pipeline=self.config.pipeline, broker=self.identity, run=self.run,
                                attempt=self.token, ranges=tuple(placed), output_root=self.config.output_root)
        receipts = self.sink.publish(batch)
        self._step("table_committed")
        for r in placed:
            receipt = receipts.get(r.range.id)
            if receipt is None:  # pragma: no cover - a sink returns every range or raises
                raise BatchError(f"range {r.range.id}: the {self.sink.name} sink returned no commit for it")
            self.ledger.mark_published(r.range.id, self.token, table=(receipt.table, receipt.commit))

    def release_publish_leases(self) -> None:
        """After a failed publish, hand this attempt's leases back at once (best effort), so the
        next run finishes the publish without waiting for the lease to expire."""
        for p in self.parts:
            if p.range is not None and p.result.status == PartitionStatus.COMMITTED:
                try:
                    self.ledger.release_publish(p.range.id, self.token)
                except Exception as exc:  # reported, never masks the original error
                    log.warning("could not release the publish lease of range %s: %s", p.range.id, exc)

    def sweep_staging(self) -> None:
        """Remove staging left by earlier attempts of this run identity (killed mid-read): every
        range they could have committed is published by now, so nothing there is needed. An attempt
        killed between its refused manifest and its cleanup left its copied files in the directory
        another attempt published: they are withdrawn first (:func:`outputs.withdraw_leftovers`).
        Only retries sweep, so an idle first try touches no file system (for a URI root, resolving
        it may start the runner's Spark session)."""
        prefix = plan.staging_prefix(self.config.output_root, self.config.pipeline, self.identity, self.run)
        parent, name = filesystems.parent(prefix), filesystems.name(prefix)
        for old in self.fs.listdir(parent):
            if old.startswith(name):
                where = filesystems.join(parent, old)
                try:
                    outputs.withdraw_leftovers(where, self.fs)
                except Exception as exc:  # reported; the audit names what is left (output_mismatch)
                    log.warning("could not withdraw what %s left in published directories: %s", where, exc)
                    continue  # kept: it names what is to withdraw
                outputs.remove(where, self.fs)
