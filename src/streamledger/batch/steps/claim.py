"""The claim: one ledger transaction for every partition (the ledger's one claim rule), retention's
losses settled, and the ranges without a user record committed without a job. A crash after it (crash
A of docs/ledger.md's crash table) leaves the range claimed: the retry gets the same range back.
Each partition's :class:`~streamledger.batch.steps.state.Part` is made here."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from streamledger import fs as filesystems
from streamledger.batch import plan
from streamledger.batch.config import BatchError, Broker, PartitionResult, PartitionStatus, StartFrom
from streamledger.batch.position import first_offsets, user_records_many
from streamledger.batch.steps.state import Part
from streamledger.batch.steps.survey import Surveying
from streamledger.errors import MissingExtra
from streamledger.ledger.types import RangeStatus
from streamledger.offsets import ChunkPrint, take_prints_within

if TYPE_CHECKING:
    from streamledger.ledger import ClaimRequest, OffsetRange, SourcePosition, SourceRef

log = logging.getLogger("streamledger.batch")


class _Firsts:
    """The broker, answering ``first_offset`` from offsets already asked for all streams at once."""

    def __init__(self, broker: Broker, firsts: Mapping[str, int]) -> None:
        self._broker, self._firsts = broker, firsts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)

    def first_offset(self, name: str) -> int:
        known = self._firsts.get(name)
        return int(self._broker.first_offset(name)) if known is None else known


class Claiming(Surveying):
    """The claim step of a batch (a mixin of ``BatchRun``)."""

    def release_gone_holders(self, open_claims: Sequence[OffsetRange]) -> None:
        """Fail other runs' claims whose holder the scheduler says is gone (``holder_alive``)."""
        if self.holder_alive is None:
            return
        for held in open_claims:
            h = held.run
            if h.key() == self.run.key() or self.holder_alive(h):
                continue
            log.warning("stream %s: [%d, %d) is held by %s, which is no longer running: releasing it",
                        held.source.stream, held.start, held.end, h)
            self.ledger.fail(held.id, f"released by {self.run.dag_id}/{self.run.run_id}: holder gone")

    def claim_request(self, stream: str, tail: int, stored: int | None, pos: SourcePosition,
                      firsts: Mapping[str, int], span: tuple[int, int] | None) -> ClaimRequest:
        """The claim's inputs for one partition (``firsts``: first retained offsets of the streams
        without ledger history; ``span``: its pinned interval range with ``bound_by_interval``)."""
        from streamledger.ledger import ClaimRequest

        cfg = self.config
        self.release_gone_holders(pos.open_claims)
        limit = plan.claim_limit(cfg, self.broker, stream, tail)
        initial: int | None = None
        how: plan.Origin | None = None
        if pos.end is None:  # the ledger ignores initial_start once the source has a range
            initial, how = plan.initial_start(cfg, _Firsts(self.broker, firsts), stream, tail, stored)
            if initial > tail:
                raise BatchError(
                    f"stream {stream!r}: pipeline {cfg.pipeline!r} would start at {initial} ({how}) but "
                    f"the committed tail is {tail}"
                )
        if span and how is plan.Origin.BEFORE_RETENTION and plan.opens_history(cfg):
            assert initial is not None
            # The first interval reads from the history's origin: an origin before retention's cut
            # (plan.initial_start) is claimed, then failed or recorded lost by settle_claim.
            span = (initial, span[1])
        interval = (cfg.interval_start, cfg.interval_end) if span is not None else None
        # New offsets the survey probed and found without a user record (tracking chunks): the claim
        # records a range of them committed at once, no commit after it.
        probed = self._probed.get(stream)
        free = (probed[0], probed[1]) if probed is not None and probed[2] == 0 else None
        return ClaimRequest(self._source(stream), limit, initial, span, interval,  # type: ignore[arg-type]
                            record_free=free)

    def settle_lost_before(self, asks: Sequence[ClaimRequest]) -> None:
        """Offsets of a pinned history that retention took before any interval claimed them (a new
        stream's head, after ``new-epoch`` or on a fresh stream, when a later interval runs first):
        nobody read them and no interval's span can reach them any more (spans are worked out from
        the chunks the broker still has). Decided by ``on_data_loss`` before anything is claimed:
        ``"fail"`` refuses the batch naming them, ``"record"`` records them lost. Never a gap."""
        cfg = self.config
        firsts = first_offsets(self.broker, [a.source.stream for a in asks])
        below = [firsts[a.source.stream] for a in asks]
        for ask, first, pieces in zip(asks, below, self.ledger.lost_before(cfg.pipeline, asks, below),
                                      strict=True):
            if not pieces:
                continue
            stream = ask.source.stream
            named = ", ".join(f"[{a}, {b})" for a, b in pieces)
            if cfg.on_data_loss == "fail":
                why = (f"stream {stream!r}: pipeline {cfg.pipeline!r} never read {named} and retention "
                       f"removed everything below {first}; nothing was claimed; set on_data_loss='record' "
                       "to record them as lost and go on")
                for a, b in pieces:  # the audit's finding until the span is recorded lost or skipped
                    self.ledger.record_refused(cfg.pipeline, ask.source, a, b, self.run, why)
                raise BatchError(why)
            for a, b in pieces:
                self.ledger.record_lost(
                    cfg.pipeline, ask.source, a, b, self.run,
                    f"retention removed offsets below {first} before pipeline {cfg.pipeline} read them")
                log.warning("stream %s: recorded [%d, %d) as lost (retention, before any interval read it)",
                            stream, a, b)

    def settle_claim(self, stream: str, rng: OffsetRange, first: int | None,
                     req: ClaimRequest) -> Part:
        """Make sure the broker still holds a claimed range (recording retention's losses if so
        configured, and claiming again past them), then describe it."""
        cfg = self.config
        src, span = req.source, req.span
        lost: tuple[int, int] | None = None
        for _ in range(100):
            if rng.status != RangeStatus.CLAIMED or self._record_free(rng):
                break  # a range without a user record has none retention could have taken
            if first is None:
                first = int(self.broker.first_offset(stream))
            if rng.start >= first:
                break
            lost_end = min(first, rng.end)
            if cfg.on_data_loss == "fail":
                why = (f"stream {stream!r}: pipeline {cfg.pipeline!r} must read [{rng.start}, {rng.end}) but "
                       f"retention removed everything below {first}; set on_data_loss='record' to record "
                       f"[{rng.start}, {lost_end}) as lost and go on")
                self.ledger.fail(rng.id, why)
                raise BatchError(why)
            self.ledger.record_lost(
                cfg.pipeline, src, rng.start, lost_end, self.run,
                f"retention removed offsets below {first} before pipeline {cfg.pipeline} read them",
            )
            log.warning("stream %s: recorded [%d, %d) as lost (retention)", stream, rng.start, lost_end)
            lost = (rng.start if lost is None else lost[0], lost_end)
            span = None if span is None else (lost_end, span[1])
            rng, first = self._claim(src, req.end_limit, req.initial_start, span), None
        else:  # pragma: no cover - each round records a non-empty span, so this means a ledger bug
            raise BatchError(f"stream {stream!r}: could not claim past retention's losses")
        # A range claimed before this batch began claiming is this run's own from an earlier attempt.
        assert self._started is not None
        came = StartFrom.HELD if rng.claimed_at < self._started else StartFrom.NEW
        status = PartitionStatus.EMPTY if rng.empty else PartitionStatus(rng.status.value)
        result = PartitionResult(stream, rng.start, rng.end, came, range_id=rng.id if rng.recorded else None,
                                 lost=lost, status=status, epoch=self.epochs.get(stream, 0))
        if rng.status == RangeStatus.COMMITTED and not rng.empty:
            result.records = int(rng.records or 0)
            result.first_offset, result.last_offset = rng.first_seen, rng.last_seen
            result.output = rng.output
        return Part(result, src, rng)

    def _claim(self, src: SourceRef, limit: int, initial: int | None,
               span: tuple[int, int] | None = None) -> OffsetRange:
        cfg = self.config
        interval = (cfg.interval_start, cfg.interval_end) if span is not None else None
        return self.ledger.claim(
            cfg.pipeline, src, limit, self.run, initial_start=initial, max_span=cfg.max_offsets,
            abandon_after=timedelta(seconds=cfg.claim_timeout), span=span,
            interval=interval,  # type: ignore[arg-type]  # both set: BatchConfig checked
        )

    def claim(self) -> None:
        """Check the sink and every partition first (nothing is claimed when one of them is
        refused), then claim all of them in one ledger transaction (the ledger's one claim rule
        per partition)."""
        cfg = self.config
        if cfg.fmt == "parquet":  # the job's tasks write it through pyarrow.fs (the Arrow writer)
            filesystems.check_location(cfg.output_root)  # an unknown scheme, no bucket: refused here
        self.check_transform()  # a transform that cannot run: refused before any claim
        self.sink.check()  # a table that cannot take the job's files: refused before any claim
        problem = filesystems.create_library_problem(cfg.output_root, lambda: self.fs)
        if problem is not None:  # a publish that could not write its manifest: refused before any claim
            raise MissingExtra(f"pipeline {cfg.pipeline!r}: {problem}")
        self.adopt_identities()
        seen = self.survey(self.streams())
        self._stored = {s: stored for s, _tail, stored, _pos in seen}
        self._step("planned")
        if self._started is None:  # the ledger's clock, as claimed_at is: the host's may be minutes off
            self._started = self.ledger.clock()
        wants_first = cfg.initial_position == "first"
        firsts = first_offsets(self.broker, [s for s, _t, stored, pos in seen
                                             if wants_first and pos.end is None and stored is None])
        # Every pinned span first: an interval not ready yet (IntervalNotReady) stops the batch
        # before any claim or release is written.
        spans = [plan.pinned_span(cfg, self.broker, s, tail, self._started) if cfg.bound_by_interval else None
                 for s, tail, _stored, _pos in seen]
        asks = [self.claim_request(*args, firsts, span) for args, span in zip(seen, spans, strict=True)]
        if cfg.bound_by_interval:
            self.settle_lost_before(asks)
        # With the claims, what each stream held: if it is re-created, the new epoch records the
        # unread rest lost (in the claims' transaction, so a death right after loses none of it).
        # And a chunk of each stream whose history holds no fingerprint yet: a claim that dies before
        # its commit still tells the stream it claimed from a stream re-created meanwhile.
        prints = self.first_prints(seen, asks)
        got = self.ledger.claim_many(cfg.pipeline, asks, self.run,
                                     max_span=cfg.max_offsets,
                                     abandon_after=timedelta(seconds=cfg.claim_timeout),
                                     tails={self._source(s): tail for s, tail, _stored, _pos in seen},
                                     prints=prints)
        self.check_late([s for s, *_r in seen], got)
        held = first_offsets(self.broker, [s for (s, *_r), rng in zip(seen, got, strict=True)
                                           if rng.status.value == "claimed" and not self._record_free(rng)])
        self.parts = [self.settle_claim(s, rng, held.get(s), req)
                      for (s, *_r), rng, req in zip(seen, got, asks, strict=True)]
        self.result.partitions = [p.result for p in self.parts]
        for p in self.parts:
            r = p.result
            log.info("stream %s: range [%d, %d) %s (%d offsets)", r.stream, r.start, r.end, r.status,
                     r.end - r.start)
        self._step("claimed")

    def first_prints(self, seen: Sequence[tuple[str, int, int | None, SourcePosition]],
                     asks: Sequence[ClaimRequest]) -> dict[SourceRef, ChunkPrint]:
        """A user chunk each stream holds where its claim will start (the pinned span's start, the
        ledger's end, or the first claim's initial start) and below the tail the survey saw, for
        the sources whose history has no fingerprint (none committed with records, none seen at a
        claim): one round of chunk headers for all of them, none for the others."""
        spans: dict[str, tuple[int, int]] = {}
        for (s, tail, _stored, pos), ask in zip(seen, asks, strict=True):
            if pos.chunk is not None:
                continue
            start = ask.span[0] if ask.span else pos.end if pos.end is not None else ask.initial_start
            if start is not None and start < tail:
                spans[s] = (start, tail)
        if not spans:
            return {}
        return {self._source(s): p for s, p in take_prints_within(self.broker, spans).items()}

    def skip_ranges_without_records(self) -> None:
        """Commit claimed ranges that hold no user record (only tracking offsets) without a job,
        all in one ledger transaction."""
        from streamledger.ledger import CommitRequest

        todo = self.to_read()
        ranges = {p.result.stream: (p.result.start, p.result.end) for p in todo}
        found = {s: self._known_records(s, a, b) for s, (a, b) in ranges.items()}
        unknown = {s: ranges[s] for s, n in found.items() if n is None}
        if unknown:  # one connection, the probes in flight together; the survey's stats are not
            # asked again when its tails end the claims (a claim held from an earlier attempt may not)
            seen = self._seen_log
            if seen is not None and any(b > seen.tails.get(s, -1) for s, (_a, b) in unknown.items()):
                seen = None
            found.update(user_records_many(self.broker, unknown, seen=seen))
        empty = [p for p in todo if not found[p.result.stream]]
        done = self.ledger.commit_many([CommitRequest(p.range.id, 0, None, None, None)
                                        for p in empty if p.range is not None]) if empty else []
        for p, rng in zip(empty, done, strict=True):
            r = p.result
            p.range = rng
            r.status = PartitionStatus.COMMITTED
            log.info("stream %s: [%d, %d) holds no user record (tracking only): committed, no job",
                     r.stream, r.start, r.end)
        self._step("probed")

    def _record_free(self, rng: OffsetRange) -> bool:
        """Whether the survey's probe found no user record in the claimed range."""
        return self._known_records(rng.source.stream, rng.start, rng.end) == 0

    def _known_records(self, stream: str, start: int, end: int) -> int | None:
        """What the probe before the claim (:meth:`survey`) says of ``[start, end)``: no user record
        when it saw none in a span holding it, at least one when it probed exactly this span (offsets
        below a committed tail never change); None when it did not probe there."""
        probed = self._probed.get(stream)
        if probed is None:
            return None
        a, b, seen = probed
        if seen == 0 and a <= start and end <= b:
            return 0
        return seen if (a, b) == (start, end) else None
