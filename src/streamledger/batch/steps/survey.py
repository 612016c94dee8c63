"""Plan, before any claim: every partition's ledger position, the broker's tails and stored offsets, and
the checks that refuse a stream before anything is claimed (re-created, named twice, of the other
history kind). It exists apart from the claim because a refusal here leaves nothing to release (the
crash table's first row starts after it)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from streamledger.batch import plan
from streamledger.batch.config import BatchError, StreamReplaced
from streamledger.batch.history import mixed_because
from streamledger.batch.identity import named_twice_because, replaced_because
from streamledger.batch.position import survey_offsets, user_records_many
from streamledger.batch.steps.publish import Publishing
from streamledger.ledger.types import RangeStatus
from streamledger.offsets import same_streams

if TYPE_CHECKING:
    from streamledger.ledger import OffsetRange, SourcePosition

log = logging.getLogger("streamledger.batch")


class Surveying(Publishing):
    """The survey and the identity checks of a batch (a mixin of ``BatchRun``)."""

    def adopt_identities(self) -> None:
        """Move this pipeline's sources recorded under another identity of this broker to its own:
        0.1 rows (named by the URL's host:port) and rows in another spelling of this identity
        (``…/%2f`` for ``…/%2F``), see ``Ledger.adopt_identity``."""
        moved = self.ledger.adopt_identity(self.config.pipeline, self.identity, legacy=self._legacy)
        if moved:
            log.warning("ledger: %d source(s) of %s moved to %s", moved, self.config.pipeline, self.identity)

    def check_same_stream(self, stream: str, tail: int, stored: int | None,
                          pos: SourcePosition, same: bool | None = None) -> SourcePosition:
        """Refuse a source whose broker no longer holds the stream the ledger read (the signs:
        :func:`streamledger.batch.identity.replaced_because`, the streaming recorder's too). A
        refusal is recorded in the ledger (``replaced``) and refused again by every later batch
        until ``new-epoch``. ``pos`` is the ledger's position, read *before* the broker's tail and
        stored offset."""
        cfg = self.config
        self.epochs[stream] = pos.epoch
        why = replaced_because(self.broker, stream, cfg.pipeline, pos, tail, stored, same)
        if why is None:
            return pos  # no fingerprint, or retention took its chunk: every commit takes a new one
        if pos.replaced is None:  # remembered: every later batch refuses until `new-epoch`
            self.ledger.mark_replaced(cfg.pipeline, self._source(stream), why)
        raise StreamReplaced(
            f"stream {stream!r}: {why}: this is not the stream pipeline {cfg.pipeline!r} read (deleted and "
            f"re-created?); nothing was claimed or stored. If it is a new stream, `streamledger ledger "
            f"new-epoch --pipeline {cfg.pipeline} --stream {stream} --broker {self.identity}` keeps the old "
            "history and reads the new stream from its first offset"
        )

    def check_one_name(self, streams: Sequence[str], found: Sequence[SourcePosition]) -> None:
        """Refuse, before anything is claimed, a stream whose history another broker identity of
        this very broker holds (:func:`streamledger.batch.identity.named_twice_because`, the audit's
        rule): a history under this batch's identity would read it again. A finding made by a chunk
        is recorded for both names first (every refused stream's), so it outlives the chunk."""
        refused = [(s, twice) for s, pos in zip(streams, found, strict=True)
                   if (twice := named_twice_because(self.broker, s, self.config.pipeline, self.identity,
                                                    pos)) is not None]
        for s, twice in refused:
            if twice.unrecorded:
                self.ledger.record_same_broker(self.config.pipeline, s, (twice.own, *twice.unrecorded),
                                               f"stream {s!r}: {twice.why}")
        if refused:
            s, twice = refused[0]
            raise BatchError(f"stream {s!r}: {twice.why}")

    def check_one_kind(self, streams: Sequence[str], found: Sequence[SourcePosition]) -> None:
        """Refuse, before anything is claimed, a history of the other kind: an interval-bound batch on
        a history claimed where the ledger ended, or a free batch on one pinned to data intervals
        (:func:`streamledger.batch.history.mixed_because`, the streaming query's rule too)."""
        for s, pos in zip(streams, found, strict=True):
            why = mixed_because(self.config.pipeline, s, pos, pinned=self.config.bound_by_interval)
            if why is not None:
                raise BatchError(why)

    def survey(self, streams: list[str]) -> list[tuple[str, int, int | None, SourcePosition]]:
        """Every partition's ledger position (one transaction), then its broker tail and stored
        offset (asked all at once) and its fingerprinted chunk, each checked against the other
        (:meth:`check_same_stream`). A refused partition stops the batch before any claim, once
        the old stream's committed but unpublished ranges are published (:meth:`publish_stranded`)."""
        cfg = self.config
        found = self.ledger.positions(cfg.pipeline, [self._source(s) for s in streams])
        self.check_one_name(streams, found)
        self.check_one_kind(streams, found)
        seen_log = self._seen_log = survey_offsets(self.broker, streams, cfg.pipeline)
        tails, stored = seen_log.tails, seen_log.stored
        settled = {s: pos for s, pos in zip(streams, found, strict=True)
                   if pos.chunk is not None and plan.settled(cfg, pos, tails[s], stored[s])}
        # New offsets of a settled source that may be only tracking chunks: probed now, all at once
        # (the answer serves the probe after the claim too); with no user record there, it is idle.
        ahead = {s: (int(pos.end), tails[s]) for s, pos in settled.items()  # type: ignore[arg-type]
                 if tails[s] > int(pos.end or 0) and tails[s] - int(pos.end or 0) <= plan.TRACKING_SPAN}
        if ahead:
            counts = user_records_many(self.broker, ahead, seen=seen_log)
            self._probed.update({s: (a, b, int(counts[s])) for s, (a, b) in ahead.items()})
        idle = {s for s, pos in settled.items() if tails[s] <= int(pos.end or 0)
                or (s in self._probed and self._probed[s][2] == 0)}
        self._unchecked = {s: (tails[s], stored[s], settled[s], tails[s]) for s in idle}
        same = same_streams(self.broker, {s: pos.chunk for s, pos in zip(streams, found, strict=True)
                                          if pos.chunk is not None and s not in idle})
        seen: list[tuple[str, int, int | None, SourcePosition]] = []
        refused: list[tuple[str, StreamReplaced]] = []
        for s, pos in zip(streams, found, strict=True):
            try:
                seen.append((s, tails[s], stored[s], self.check_same_stream(s, tails[s], stored[s], pos,
                                                                            same.get(s))))
            except StreamReplaced as exc:
                refused.append((s, exc))
        if refused:
            self.publish_stranded([self._source(s) for s, _exc in refused])
            raise refused[0][1]
        return seen

    def check_late(self, streams: Sequence[str], got: Sequence[OffsetRange]) -> None:
        """The identity check :meth:`survey` left to a settled source, made now when its claim came
        back reaching past the tail the survey saw or before the ledger's end it read (another run
        moved the ledger meanwhile: a failed range to redo, a claim of its own): nothing of it is
        read unchecked. A refusal fails this batch's new claims first (the next claim redoes them)."""
        late = {s: rng for s, rng in zip(streams, got, strict=True) if s in self._unchecked
                and not rng.empty and not (int(self._unchecked[s][2].end or 0) <= rng.start
                                           and rng.end <= self._unchecked[s][3])}
        if not late:
            return
        for s in late:
            log.info("stream %s: the ledger moved during the batch: checking its identity now", s)
        checked = {s: self._unchecked.pop(s) for s in late}
        same = same_streams(self.broker, {s: pos.chunk for s, (_t, _st, pos, _e) in checked.items()
                                          if pos.chunk is not None})
        try:
            for s, (tail, stored, pos, _end) in checked.items():
                self.check_same_stream(s, tail, stored, pos, same.get(s))
        except StreamReplaced:
            for rng in got:
                if rng.status == RangeStatus.CLAIMED and rng.run.key() == self.run.key():
                    self.ledger.fail(rng.id, "the stream was found replaced before it was read")
            raise
