"""The batch state machine: claim -> read -> verify -> commit -> publish -> store offset.

Each step is a method, so callers and tests can see where a batch is; ``on_step`` lets tests
stop a batch dead after any step (production passes none). See the package docstring for what a
crash at each step leads to.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from streamledger import fs as filesystems
from streamledger.batch import outputs, plan, sinks
from streamledger.batch.config import (
    BatchConfig,
    BatchError,
    BatchResult,
    Broker,
    JobRunner,
    PartitionResult,
    PartitionStatus,
    RunId,
    StartFrom,
    StepHook,
    StreamReplaced,
)
from streamledger.batch.history import mixed_because
from streamledger.batch.identity import named_twice_because, replaced_because
from streamledger.batch.position import (
    LogOffsets,
    PipelineSource,
    cluster_name,
    first_offsets,
    log_offsets,
    measure,
    survey_offsets,
    user_records_many,
)
from streamledger.batch.sinks import choose
from streamledger.batch.spec import SpecError
from streamledger.ledger.types import RangeStatus
from streamledger.manifest import Manifest, ManifestError
from streamledger.offsets import ChunkPrint, OffsetNotVerified, same_streams, take_prints
from streamledger.progress import JobWatch, LoggedProgress, Planned, ReadProgress, every_seconds
from streamledger.transform import TransformError

if TYPE_CHECKING:
    from streamledger.ledger import ClaimRequest, Ledger, OffsetRange, RunIdentity, SourcePosition, SourceRef

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


@dataclass
class _Part:
    """One partition's live state inside a batch: its result row and its ledger range."""

    result: PartitionResult
    source: SourceRef
    range: OffsetRange | None = None
    staging: str | None = None


class Heartbeat:
    """Renews the batch's claims every ``interval`` seconds while its job runs.

    A claim missing from the ledger's answer was taken from this batch (abandoned after a stall,
    or failed by an operator): ``lost`` names it, the runner is asked to ``cancel()`` if it can,
    and the commit that would follow is refused by the ledger anyway.
    """

    def __init__(self, ledger: Ledger, run: RunIdentity, ids: list[int], interval: float,
                 on_lost: Callable[[list[int]], None] | None = None,
                 renew: Callable[[list[int]], list[int]] | None = None) -> None:
        self.ledger, self.run, self.ids, self.interval = ledger, run, list(ids), interval
        self.on_lost = on_lost
        self.renew = renew or (lambda ids: ledger.heartbeat(ids, run))
        self.lost: list[int] = []
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="streamledger-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.ids:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                held = set(self.renew(self.ids))
            except Exception as exc:  # the database may be restarting: keep trying, the claim waits
                log.warning("heartbeat of %d claim(s) failed: %s", len(self.ids), exc)
                continue
            self.beats += 1
            lost = [i for i in self.ids if i not in held]
            if lost:
                log.error("lost claim(s) %s while the job ran (taken over or failed): stopping", lost)
                self.lost = lost
                if self.on_lost is not None:
                    self.on_lost(lost)
                return


class _Leases:
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


class BatchRun:
    """One batch over every partition of a stream or super stream."""

    def __init__(
        self,
        config: BatchConfig,
        *,
        run: RunId,
        ledger: Ledger,
        broker: Broker,
        runner: JobRunner,
        holder_alive: Callable[[RunId], bool] | None = None,
        on_step: StepHook | None = None,
        progress: ReadProgress | None = None,
    ) -> None:
        self.config = config
        self.progress: ReadProgress = progress or LoggedProgress()
        self.run = run
        self.ledger = ledger
        self.broker = broker
        self.runner = runner
        self.holder_alive = holder_alive
        self.on_step = on_step
        self.transform = config.transformation()
        """What runs between read and sink per range (None: raw records)."""
        self.fingerprint = self.transform.fingerprint() if self.transform is not None else None
        self.output_schema: Any = None
        self.source = PipelineSource(config.pipeline, config.url, stream=config.stream,
                                     super_stream=config.super_stream, broker_name=config.broker_name)
        name = config.broker_name or cluster_name(broker)
        self.identity = self.source.identity(broker)
        self._legacy = plan.broker_identity(config.url) if name else None
        self.result = BatchResult(pipeline=config.pipeline, broker=self.identity,
                                  super_stream=config.super_stream)
        self.parts: list[_Part] = []
        self.staging: str | None = None
        self._fs: filesystems.OutputFS | None = None
        self._sink: sinks.Sink | None = None
        self._started: datetime | None = None  # when this batch began claiming (ledger's clock)
        self.token = run.attempt_token(uuid.uuid4().hex[:8])
        """This attempt as a publish-lease holder."""
        self.epochs: dict[str, int] = {}
        self._leases: _Leases | None = None  # while publish_ranges runs
        self._reread = True  # False once the broker holds another stream: never read it for the old
        self._probed: dict[str, tuple[int, int, int]] = {}  # stream -> (start, end, user records seen)
        self._seen_log: LogOffsets | None = None  # what the survey asked the log (its tails and stats)
        self._stored: dict[str, int | None] = {}  # stream -> the broker's stored offset the survey saw
        self._unchecked: dict[str, tuple[int, int | None, SourcePosition, int]] = {}
        """Settled sources whose identity check waits (:func:`plan.settled`): stream -> its tail, stored
        offset, position and the end of what it may claim unchecked (the tail: no user record
        below it past the ledger's end)."""

    # -- helpers ---------------------------------------------------------------------------------

    @property
    def fs(self) -> filesystems.OutputFS:
        """The output root's file system: local for plain paths, else the runner's (``filesystem``,
        optional) for URIs; resolved on first use, so a batch with nothing to write needs none."""
        if self._fs is None:
            self._fs = filesystems.filesystem_for(self.config.output_root, self.runner)
        return self._fs

    @property
    def sink(self) -> sinks.Sink:
        """What publishing means for this batch (``BatchConfig.sink``); built on first use."""
        if self._sink is None:
            schema = () if self.output_schema is None else (self.output_schema,)  # what a transform writes
            self._sink = choose.make_sink(self.config, self.ledger, *schema)
        return self._sink

    def _step(self, name: str) -> None:
        if self.on_step is not None:
            self.on_step(name, self)

    def _source(self, stream: str) -> SourceRef:
        from streamledger.ledger import SourceRef

        return SourceRef(broker=self.identity, stream=stream, super_stream=self.config.super_stream)

    def streams(self) -> list[str]:
        return self.source.streams(self.broker)

    # -- claim -----------------------------------------------------------------------------------

    def adopt_identities(self) -> None:
        """Move this pipeline's sources recorded under another identity of this broker to its own:
        0.1 rows (named by the URL's host:port) and rows in another spelling of this identity
        (``…/%2f`` for ``…/%2F``), see ``Ledger.adopt_identity``."""
        moved = self.ledger.adopt_identity(self.config.pipeline, self.identity, legacy=self._legacy)
        if moved:
            log.warning("ledger: %d source(s) of %s moved to %s", moved, self.config.pipeline, self.identity)

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

    def settle_claim(self, stream: str, rng: OffsetRange, first: int | None, req: ClaimRequest) -> _Part:
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
        return _Part(result, src, rng)

    def _claim(self, src: SourceRef, limit: int, initial: int | None,
               span: tuple[int, int] | None = None) -> OffsetRange:
        cfg = self.config
        interval = (cfg.interval_start, cfg.interval_end) if span is not None else None
        return self.ledger.claim(
            cfg.pipeline, src, limit, self.run, initial_start=initial, max_span=cfg.max_offsets,
            abandon_after=timedelta(seconds=cfg.claim_timeout), span=span,
            interval=interval,  # type: ignore[arg-type]  # both set: BatchConfig checked
        )

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

    def claim(self) -> None:
        """Check the sink and every partition first (nothing is claimed when one of them is
        refused), then claim all of them in one ledger transaction (the ledger's one claim rule
        per partition)."""
        cfg = self.config
        if cfg.fmt == "parquet":  # the job's tasks write it through pyarrow.fs (the Arrow writer)
            filesystems.check_location(cfg.output_root)  # an unknown scheme, no bucket: refused here
        self.check_transform()  # a transform that cannot run: refused before any claim
        self.sink.check()  # a table that cannot take the job's files: refused before any claim
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
        got = self.ledger.claim_many(cfg.pipeline, asks, self.run,
                                     max_span=cfg.max_offsets,
                                     abandon_after=timedelta(seconds=cfg.claim_timeout),
                                     tails={self._source(s): tail for s, tail, _stored, _pos in seen})
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

    # -- read + verify ---------------------------------------------------------------------------

    def touched(self) -> list[_Part]:
        """The partitions this batch may move: all but the idle ones the survey left unchecked (no user
        record past the ledger's end, nothing to publish or store: :func:`plan.settled`), which the
        batch leaves as if it had not run once their claim is settled."""
        return [p for p in self.parts if p.result.stream not in self._unchecked]

    def to_read(self) -> list[_Part]:
        return [p for p in self.parts if p.result.status == PartitionStatus.CLAIMED]

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

    def read(self) -> None:
        """One job for every partition that has something to read, into a fresh staging directory."""
        todo = self.to_read()
        if not todo:
            return
        cfg = self.config
        self.staging = plan.staging_dir(cfg.output_root, cfg.pipeline, self.identity, self.run,
                                        uuid.uuid4().hex[:8])
        ranges = {p.result.stream: (p.result.start, p.result.end) for p in todo}
        began = time.monotonic()
        ids = [p.range.id for p in todo if p.range is not None]
        cancel = getattr(self.runner, "cancel", None)
        planned = [Planned(stream, start, end) for stream, (start, end) in ranges.items()]
        self._report(lambda: self.progress.planned(cfg.pipeline, planned))
        with Heartbeat(self.ledger, self.run, ids, cfg.heartbeat_interval,
                       on_lost=(lambda _ids: cancel()) if callable(cancel) else None) as beat, \
                JobWatch(cfg.pipeline, self.runner, self.progress, self._progress_every()):
            manifest = self._job(ranges, self.staging)
        self._step("job")
        if beat.lost:
            raise BatchError(f"claims {beat.lost} were taken from this run while its job ran "
                             "(no heartbeat reached the ledger in time); nothing was committed")
        for p in todo:
            self.verify(p, manifest, self.staging)
            p.result.read = True
            log.info("read %s [%d, %d): %d records in %.1f s", p.result.stream, p.result.start, p.result.end,
                     p.result.records, time.monotonic() - began)
        records = sum(p.result.records for p in todo)
        self._report(lambda: self.progress.finished(cfg.pipeline, records, time.monotonic() - began))
        self._step("read")

    def _progress_every(self) -> float:
        """A reporter's own pace (a live display's), else ``$STREAMLEDGER_PROGRESS_SECONDS``."""
        own = getattr(self.progress, "every", None)
        return float(own) if isinstance(own, int | float) else every_seconds()

    def _report(self, say: Callable[[], None]) -> None:
        """A progress report; its failure is logged, never the batch's."""
        try:
            say()
        except Exception:
            log.debug("progress reporter failed", exc_info=True)

    def check_transform(self) -> None:
        """The pipeline's transform analysed by the runner (when it can: a runner with a session),
        so SQL that does not parse or names an unknown column, a function that does not import, a
        schema that does not parse is refused in one line before anything is claimed; the schema it
        writes is kept (:attr:`output_schema`) for the table sinks."""
        if self.transform is None:
            return
        analyse = getattr(self.runner, "transform_schema", None)
        if analyse is None:
            if self.transform.function is not None:
                try:
                    self.transform.load_function()
                except TransformError as exc:
                    raise SpecError(f"pipeline {self.config.pipeline!r}: {exc}") from None
            return
        reserved = tuple(sinks.TABLE_COLUMNS) if self.config.sink != "directory" else ()
        try:
            self.output_schema = analyse(self.transform, self.config.url, reserved)
        except TransformError as exc:
            raise SpecError(f"pipeline {self.config.pipeline!r}: {exc}") from None

    def _job(self, ranges: Mapping[str, tuple[int, int]], output: str) -> Manifest:
        """Run the job: what it says it wrote, as a :class:`Manifest` (the one parse of a mapping, for a
        runner still returning the manifest's JSON data). The transform reaches the runner only when
        the pipeline has one (a runner written before transforms takes no such keyword)."""
        cfg = self.config
        extra = {"transform": self.transform} if self.transform is not None else {}
        try:
            raw = self.runner(url=cfg.url, ranges=ranges, output=output, fmt=cfg.fmt, splits=cfg.splits,
                              **extra)
        except TransformError as exc:
            raise BatchError(str(exc)) from None
        try:
            return raw if isinstance(raw, Manifest) else Manifest.from_dict(raw)
        except ManifestError as exc:
            raise BatchError(f"the job's manifest for {sorted(ranges)} is unusable: {exc}") from exc

    def _final(self, stream: str, start: int, end: int) -> str:
        """A range's published directory (one per committed range, apart per pipeline, broker and
        stream; the epoch keeps a re-created stream's ranges apart from the old stream's): where the
        sink wants it."""
        return self.sink.range_dir(self.identity, stream, start, end, self.epochs.get(stream, 0))

    def verify(self, p: _Part, manifest: Manifest, staging: str) -> None:
        """Check one partition of the job's manifest against its claim; write the range's manifest."""
        r = p.result
        where = f"stream {r.stream!r} range [{r.start}, {r.end})"
        entry = manifest.entry(r.stream)
        if entry is None:
            raise BatchError(f"{where}: the job's manifest has no entry for it")
        if (entry.start, entry.end) != (r.start, r.end):
            raise BatchError(f"{where}: the job read [{entry.start}, {entry.end}) instead")
        records, first, last = entry.counts
        if records < 0 or records > r.end - r.start:
            raise BatchError(f"{where}: impossible record count {records}")
        if records == 0:
            if first is not None or last is not None:
                raise BatchError(f"{where}: no records but first/last offsets {first}/{last}")
        elif first is None or last is None or not (r.start <= first <= last < r.end):
            raise BatchError(f"{where}: first/last offsets {first}/{last} lie outside the range")
        try:
            path = manifest.entry_path(r.stream, staging)
        except ManifestError as exc:
            raise BatchError(f"{where}: {exc}") from exc
        if not self.fs.is_dir(path):
            raise BatchError(f"{where}: the job wrote no directory at {path}")
        found = outputs.data_file_names(path, self.fs)
        if entry.files is not None and found != sorted(entry.files):
            # A file no accepted task attempt wrote (a zombie attempt finishing late), or one gone.
            extra, gone = sorted(set(found) - set(entry.files)), sorted(set(entry.files) - set(found))
            raise BatchError(f"{where}: the data files at {path} differ from the job's manifest "
                             f"(not listed: {extra or 'none'}; missing: {gone or 'none'})")
        if self.transform is not None:
            if entry.rows is None or manifest.transform != self.fingerprint:
                raise BatchError(f"{where}: the job did not run the pipeline's transform "
                                 f"(manifest transform {manifest.transform}, expected {self.fingerprint})")
            if entry.dead_letter is not None and entry.dead_letter > records:
                raise BatchError(f"{where}: {entry.dead_letter} records set aside of {records} read")
            r.rows, r.dead_letter = entry.rows, entry.dead_letter
        r.records, r.first_offset, r.last_offset = records, first, last
        p.staging = path
        assert p.range is not None
        final = p.range.output or self._final(r.stream, r.start, r.end)
        outputs.write_manifest(path, manifest.for_range(
            r.stream, pipeline=self.config.pipeline, broker=self.identity, range_id=p.range.id,
            output=final, files=found), self.fs)

    # -- commit + publish ------------------------------------------------------------------------

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

    def fingerprints(self, todo: Sequence[_Part]) -> dict[str, ChunkPrint]:
        """Fingerprints of the chunks holding the last records read, at every commit with records:
        the newest is what the next batch checks, so a stream re-created and grown past the ledger's
        end is told apart as long as retention has not yet taken the newest committed chunk (taking
        them only while none was retained let an old fingerprint roll out of the new stream's
        retention, and the batch then read on from the old end: the model checker's PostgreSQL seed
        2000). One chunk header per source and batch."""
        return take_prints(self.broker, {p.result.stream: int(p.result.last_offset) for p in todo
                                         if p.result.records and p.result.last_offset is not None})

    def _commit_outcome(self, p: _Part, exc: Exception) -> OffsetRange:
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

    def publish_ranges(self, todo: Sequence[tuple[OffsetRange, str | None, bool]]) -> list[sinks.SinkRange]:
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
        self._leases = _Leases(self.ledger, self.token, [h.id for h in leases if h is not None])
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
        range they could have committed is published by now, so nothing there is needed. Only
        retries sweep, so an idle first try touches no file system (for a URI root, resolving it
        may start the runner's Spark session)."""
        prefix = plan.staging_prefix(self.config.output_root, self.config.pipeline, self.identity, self.run)
        parent, name = filesystems.parent(prefix), filesystems.name(prefix)
        for old in self.fs.listdir(parent):
            if old.startswith(name):
                outputs.remove(filesystems.join(parent, old), self.fs)

    def reread_committed(self, rng: OffsetRange, final: str, guard: Callable[[], None]) -> None:
        """A committed range lost both its output and its staging copy (deleted by hand): read it
        again and publish it only if the broker still holds exactly the committed records."""
        stream = rng.source.stream
        log.warning("stream %s: committed range [%d, %d) has no output at %s: reading it again", stream,
                    rng.start, rng.end, final)
        cfg = self.config
        if rng.transform != self.fingerprint:
            raise BatchError(
                f"stream {stream!r} range [{rng.start}, {rng.end}): its output is gone and it was produced "
                f"by transform {rng.transform or 'none (raw records)'}, not the pipeline's "
                f"{self.fingerprint or 'none (raw records)'}: it cannot be made again as committed")
        staging = plan.staging_dir(cfg.output_root, cfg.pipeline, self.identity, self.run,
                                   uuid.uuid4().hex[:8])
        manifest = self._job({stream: (rng.start, rng.end)}, staging)
        entry = manifest.entry(stream)
        seen = entry.counts if entry is not None else (-1, None, None)
        if seen != (rng.records, rng.first_seen, rng.last_seen):
            outputs.remove(staging, self.fs)
            raise BatchError(
                f"stream {stream!r} range [{rng.start}, {rng.end}): re-read found records/first/last "
                f"{seen} but the ledger committed {(rng.records, rng.first_seen, rng.last_seen)}; the "
                "broker no longer holds the same data (retention?)"
            )
        reread = PartitionResult(stream, rng.start, rng.end, StartFrom.REREAD, range_id=rng.id)
        part = _Part(reread, rng.source, rng)
        self.verify(part, manifest, staging)
        assert part.staging is not None
        outputs.publish(part.staging, final, rng.id, self.fs, guard=guard)
        if part.staging != staging:
            outputs.remove(staging, self.fs)

    # -- store offset ----------------------------------------------------------------------------

    def store_offsets(self) -> None:
        """Move the broker's stored offset up to the ledger's watermark, and only when it is behind
        (asked again of the broker only where the offset the survey saw is behind)."""
        cfg = self.config
        if not cfg.store_offset:
            return
        parts = self.touched()
        marks = self.ledger.watermarks(cfg.pipeline, [p.source for p in parts]) if parts else []
        # The broker is asked again only where the offset the survey saw would be moved.
        behind = [p.result.stream for p, mark in zip(parts, marks, strict=True)
                  if plan.offset_to_store(mark, self._stored.get(p.result.stream)) is not None]
        stored = dict(self._stored)
        if behind:
            stored.update(log_offsets(self.broker, behind, cfg.pipeline, tails=False)[1])
        targets: dict[str, int] = {}
        for p, mark in zip(parts, marks, strict=True):
            r = p.result
            target = plan.offset_to_store(mark, stored.get(r.stream))
            if target is None:
                if mark.unpublished is not None:
                    u = mark.unpublished
                    log.warning("stream %s: offset not stored past [%d, %d): committed but not published yet",
                                r.stream, u.start, u.end)
                elif mark.blocked_by is not None and mark.end is not None and r.start >= mark.end:
                    b = mark.blocked_by
                    log.info("stream %s: offset not stored: [%d, %d) of %s is still open before this range",
                             r.stream, b.start, b.end, b.run)
                continue
            targets[r.stream] = target
        try:
            many = getattr(self.broker, "store_offsets_verified", None)
            if many is not None and len(targets) > 1:
                many(targets, cfg.pipeline, timeout=cfg.store_timeout)
            else:
                for stream, target in targets.items():
                    self.broker.store_offset_verified(stream, cfg.pipeline, target, timeout=cfg.store_timeout)
        except OffsetNotVerified:
            # Another batch of the pipeline may have stored past our target meanwhile (it saw a longer
            # done prefix): its offset stands when the broker now holds at least ours, else the error does.
            _none, now = log_offsets(self.broker, list(targets), cfg.pipeline, tails=False)
            if any(now[s] is None or now[s] < t for s, t in targets.items()):  # type: ignore[operator]
                raise
            log.info("broker offsets for %s stored past this batch's targets by another batch: %s",
                     cfg.pipeline, now)
        ranges = []
        for p, mark in zip(parts, marks, strict=True):
            r = p.result
            if r.stream not in targets:
                continue
            r.offset_stored = targets[r.stream]
            if mark.last_record_range is not None:
                ranges.append(mark.last_record_range)
            log.info("stream %s: broker offset for %s stored at %d (watermark %s)", r.stream, cfg.pipeline,
                     targets[r.stream], mark.end)
        self.ledger.mark_offsets_stored(ranges, True)
        self._step("stored")

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

    # -- all of it -------------------------------------------------------------------------------

    def execute(self) -> BatchResult:
        self.claim()
        try:
            self.skip_ranges_without_records()
            self.read()
            self.commit()
        except Exception as exc:
            self.fail(f"{type(exc).__name__}: {exc}")
            raise
        try:
            self.publish()
        except Exception:
            self.release_publish_leases()
            raise
        self.store_offsets()
        self.describe_table()
        return self.result

    def pieces_left(self) -> bool:
        """Whether this pinned run's failed claims still hold offsets no live range covers on any
        partition (its next claim takes the next piece: :func:`run_batch` goes on)."""
        cfg = self.config
        if not cfg.bound_by_interval:
            return False
        return any(self.ledger.own_redo_left(cfg.pipeline, [p.source for p in self.parts], self.run))

    def describe_table(self) -> None:
        """With a table sink, the table as readers find it after this batch, told by the sink the batch
        published with (front doors report it from the result; none builds a sink of its own)."""
        if self.sink.name == "directory":
            return
        self.result.table = self.sink.describe()
        props = getattr(self.sink, "props", None)  # the Iceberg catalog in use (the default resolved)
        self.result.catalog = dict(props) if props else None


def run_batch(
    config: BatchConfig,
    *,
    run: RunId,
    ledger: Ledger,
    broker: Broker,
    runner: JobRunner,
    holder_alive: Callable[[RunId], bool] | None = None,
    on_step: StepHook | None = None,
    progress: ReadProgress | None = None,
) -> BatchResult:
    """Run one batch end to end (see the package docstring for what each step guarantees).
    ``progress`` reports the job's progress (default: log lines, :mod:`streamledger.progress`).

    A pinned run whose failed claim a narrower range split into separate pieces gets one piece per
    claim (the ledger's rule 1 for pinned runs): the batch goes on, round after round, until the
    ledger has no piece left for it, and reports every range it read."""
    def one() -> BatchRun:
        return BatchRun(config, run=run, ledger=ledger, broker=broker, runner=runner,
                        holder_alive=holder_alive, on_step=on_step, progress=progress)

    batch = one()
    result = batch.execute()
    for _ in range(_MAX_PIECES):
        if not batch.pieces_left():
            break
        batch = one()
        more = batch.execute()
        seen = {p.range_id for p in result.partitions}
        result.partitions.extend(p for p in more.partitions if p.range_id not in seen)
        result.table, result.catalog = more.table, more.catalog
    return result


_MAX_PIECES = 1_000
"""Rounds one pinned batch takes at most: each commits a piece, and a failed span splits into at most
one piece more than the ranges claimed inside it."""


def backlog(ledger: Ledger, broker: Broker, *, pipeline: str, url: str, streams: list[str] | Any,
            super_stream: str | None = None, broker_name: str | None = None) -> dict[str, int]:
    """Unprocessed offsets per stream: committed tail minus where the pipeline would go on (the
    position room's start), an upper bound on records (tracking chunks take offsets too)."""
    names = list(streams)
    source = PipelineSource(pipeline, url, stream=None if super_stream else names[0],
                            super_stream=super_stream, broker_name=broker_name)
    found = measure(broker, ledger, source, streams=names, last_user=False)
    return {p.stream: max(0, p.tail - p.start) for p in found}
