"""The batch state machine: claim -> read -> verify -> commit -> publish -> store offset.

Each step is a method, so callers and tests can see where a batch is; ``on_step`` lets tests
stop a batch dead after any step (production passes none). See the package docstring for what a
crash at each step leads to.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from streamledger import fs as filesystems
from streamledger.batch import outputs, plan
from streamledger.batch.config import (
    BatchConfig,
    BatchError,
    BatchResult,
    Broker,
    JobRunner,
    PartitionResult,
    RunId,
    StepHook,
)

if TYPE_CHECKING:
    from streamledger.ledger import Ledger, OffsetRange, RunIdentity, SourceRef

log = logging.getLogger("streamledger.batch")


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
                 on_lost: Callable[[list[int]], None] | None = None) -> None:
        self.ledger, self.run, self.ids, self.interval = ledger, run, list(ids), interval
        self.on_lost = on_lost
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
                held = set(self.ledger.heartbeat(self.ids, self.run))
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
    ) -> None:
        self.config = config
        self.run = run
        self.ledger = ledger
        self.broker = broker
        self.runner = runner
        self.holder_alive = holder_alive
        self.on_step = on_step
        name = config.broker_name or _cluster_name(broker)
        self.identity = plan.broker_identity(config.url, name)
        self._legacy = plan.broker_identity(config.url) if name else None
        self.result = BatchResult(pipeline=config.pipeline, broker=self.identity,
                                  super_stream=config.super_stream)
        self.parts: list[_Part] = []
        self.staging: str | None = None
        self._fs: filesystems.OutputFS | None = None
        self._started: datetime | None = None  # when this batch began claiming (ledger's clock)

    # -- helpers ---------------------------------------------------------------------------------

    @property
    def fs(self) -> filesystems.OutputFS:
        """The output root's file system: local for plain paths, else the runner's (``filesystem``,
        optional) for URIs; resolved on first use, so a batch with nothing to write needs none."""
        if self._fs is None:
            self._fs = filesystems.filesystem_for(self.config.output_root, self.runner)
        return self._fs

    def _step(self, name: str) -> None:
        if self.on_step is not None:
            self.on_step(name, self)

    def _ident(self) -> RunIdentity:
        from streamledger.ledger import RunIdentity

        r = self.run
        return RunIdentity(r.dag_id, r.run_id, r.task_id, map_index=r.map_index, try_number=r.try_number)

    def _source(self, stream: str) -> SourceRef:
        from streamledger.ledger import SourceRef

        return SourceRef(broker=self.identity, stream=stream, super_stream=self.config.super_stream)

    def streams(self) -> list[str]:
        cfg = self.config
        if cfg.super_stream is not None:
            names = self.broker.partitions(cfg.super_stream)
            if not names:
                raise BatchError(f"super stream {cfg.super_stream!r} has no partitions")
            return list(names)
        assert cfg.stream is not None
        return [cfg.stream]

    # -- claim -----------------------------------------------------------------------------------

    def adopt_legacy_identity(self) -> None:
        """Move this pipeline's 0.1 rows (named by the URL's host:port) under the broker's name."""
        if self._legacy and self._legacy != self.identity:
            moved = self.ledger.rename_broker(self._legacy, self.identity, pipeline=self.config.pipeline)
            if moved:
                log.warning("ledger: %d source(s) of %s moved from %s to %s", moved, self.config.pipeline,
                            self._legacy, self.identity)

    def release_gone_holders(self, src: SourceRef) -> None:
        """Fail other runs' claims whose holder the scheduler says is gone (``holder_alive``)."""
        if self.holder_alive is None:
            return
        for held in self.ledger.open_claims(self.config.pipeline, src):
            h = held.run
            holder = RunId(h.dag_id, h.run_id, h.task_id, h.map_index, h.try_number)
            if holder.key() == self.run.key() or self.holder_alive(holder):
                continue
            log.warning("stream %s: [%d, %d) is held by %s, which is no longer running: releasing it",
                        src.stream, held.start, held.end, h)
            self.ledger.fail(held.id, f"released by {self.run.dag_id}/{self.run.run_id}: holder gone")

    def claim_partition(self, stream: str) -> _Part:
        """Ask the ledger which range this run processes next (its one claim rule), then make sure
        the broker still holds it (recording retention's losses if so configured)."""
        cfg = self.config
        if self._started is None:  # the ledger's clock, as claimed_at is: the host's may be minutes off
            self._started = self.ledger.clock()
        src = self._source(stream)
        self.release_gone_holders(src)
        tail, limit = plan.claim_limit(cfg, self.broker, stream)
        initial, origin = plan.initial_start(cfg, self.broker, stream, tail)
        if initial > tail:
            raise BatchError(
                f"stream {stream!r}: pipeline {cfg.pipeline!r} would start at {initial} ({origin}) but the "
                f"committed tail is {tail}"
            )
        lost: tuple[int, int] | None = None
        for _ in range(100):
            rng = self._claim(src, limit, initial)
            first = int(self.broker.first_offset(stream)) if rng.status.value == "claimed" else rng.start
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
                cfg.pipeline, src, rng.start, lost_end, self._ident(),
                f"retention removed offsets below {first} before pipeline {cfg.pipeline} read them",
            )
            log.warning("stream %s: recorded [%d, %d) as lost (retention)", stream, rng.start, lost_end)
            lost = (rng.start if lost is None else lost[0], lost_end)
        else:  # pragma: no cover - each round records a non-empty span, so this means a ledger bug
            raise BatchError(f"stream {stream!r}: could not claim past retention's losses")
        # A range claimed before this batch began claiming is this run's own from an earlier attempt.
        came = "held" if rng.claimed_at < self._started else "new"
        result = PartitionResult(stream, rng.start, rng.end, came, range_id=rng.id, lost=lost,
                                 status="empty" if rng.empty else rng.status.value)
        if rng.status.value == "committed" and not rng.empty:
            result.records = int(rng.records or 0)
            result.first_offset, result.last_offset = rng.first_seen, rng.last_seen
            result.output = rng.output
        return _Part(result, src, rng)

    def _claim(self, src: SourceRef, limit: int, initial: int) -> OffsetRange:
        cfg = self.config
        return self.ledger.claim(
            cfg.pipeline, src, limit, self._ident(), initial_start=initial, max_span=cfg.max_offsets,
            abandon_after=timedelta(seconds=cfg.claim_timeout),
        )

    def claim(self) -> None:
        self.adopt_legacy_identity()
        self.parts = [self.claim_partition(s) for s in self.streams()]
        self.result.partitions = [p.result for p in self.parts]
        for p in self.parts:
            r = p.result
            log.info("stream %s: range [%d, %d) %s (%d offsets)", r.stream, r.start, r.end, r.status,
                     r.end - r.start)
        self._step("claimed")

    # -- read + verify ---------------------------------------------------------------------------

    def to_read(self) -> list[_Part]:
        return [p for p in self.parts if p.result.status == "claimed"]

    def skip_ranges_without_records(self) -> None:
        """Commit claimed ranges that hold no user record (only tracking offsets) without a job."""
        read_range = getattr(self.broker, "read_range", None)
        if read_range is None:
            return
        for p in self.to_read():
            r = p.result
            batches = read_range(r.stream, r.start, r.end, decode="raw")
            try:
                has_records = any(len(b) for b in batches)
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()
            if not has_records:
                assert p.range is not None
                p.range = self.ledger.commit(p.range.id, records=0, first_seen=None, last_seen=None,
                                             output=None)
                r.status = "committed"
                log.info("stream %s: [%d, %d) holds no user record (tracking only): committed, no job",
                         r.stream, r.start, r.end)

    def read(self) -> None:
        """One job for every partition that has something to read, into a fresh staging directory."""
        todo = self.to_read()
        if not todo:
            return
        cfg = self.config
        self.staging = plan.staging_dir(cfg.output_root, cfg.pipeline, self.run, uuid.uuid4().hex[:8])
        ranges = {p.result.stream: (p.result.start, p.result.end) for p in todo}
        began = time.monotonic()
        ids = [p.range.id for p in todo if p.range is not None]
        cancel = getattr(self.runner, "cancel", None)
        with Heartbeat(self.ledger, self._ident(), ids, cfg.heartbeat_interval,
                       on_lost=(lambda _ids: cancel()) if callable(cancel) else None) as beat:
            manifest = self.runner(url=cfg.url, ranges=ranges, output=self.staging, fmt=cfg.fmt,
                                   splits=cfg.splits)
        if beat.lost:
            raise BatchError(f"claims {beat.lost} were taken from this run while its job ran "
                             "(no heartbeat reached the ledger in time); nothing was committed")
        for p in todo:
            self.verify(p, manifest, len(todo))
            p.result.read = True
            log.info("read %s [%d, %d): %d records in %.1f s", p.result.stream, p.result.start, p.result.end,
                     p.result.records, time.monotonic() - began)
        self._step("read")

    def verify(self, p: _Part, manifest: Mapping[str, Any], streams: int) -> None:
        """Check one partition of the job's manifest against its claim; write the range's manifest."""
        r = p.result
        where = f"stream {r.stream!r} range [{r.start}, {r.end})"
        entry = (manifest.get("streams") or {}).get(r.stream)
        if entry is None:
            raise BatchError(f"{where}: the job's manifest has no entry for it")
        if (int(entry["start"]), int(entry["end"])) != (r.start, r.end):
            raise BatchError(f"{where}: the job read [{entry['start']}, {entry['end']}) instead")
        records = int(entry["records"])
        first, last = entry.get("first_offset"), entry.get("last_offset")
        if records < 0 or records > r.end - r.start:
            raise BatchError(f"{where}: impossible record count {records}")
        if records == 0:
            if first is not None or last is not None:
                raise BatchError(f"{where}: no records but first/last offsets {first}/{last}")
        elif first is None or last is None or not (r.start <= first <= last < r.end):
            raise BatchError(f"{where}: first/last offsets {first}/{last} lie outside the range")
        try:
            path = plan.entry_path(manifest, r.stream, str(self.staging), streams)
        except ValueError as exc:
            raise BatchError(f"{where}: {exc}") from exc
        if not self.fs.is_dir(path):
            raise BatchError(f"{where}: the job wrote no directory at {path}")
        r.records = records
        r.first_offset = None if first is None else int(first)
        r.last_offset = None if last is None else int(last)
        p.staging = path
        assert p.range is not None
        final = plan.output_dir(self.config.output_root, self.config.pipeline, r.stream, r.start, r.end)
        outputs.write_manifest(path, {
            "pipeline": self.config.pipeline, "broker": self.identity, "range_id": p.range.id,
            "streams": {r.stream: dict(entry)}, "output": final, "format": manifest.get("format"),
            "written_at": manifest.get("written_at"),
        }, self.fs)

    # -- commit + publish ------------------------------------------------------------------------

    def commit(self) -> None:
        for p in self.parts:
            r = p.result
            if not r.read:
                continue
            assert p.range is not None
            final = plan.output_dir(self.config.output_root, self.config.pipeline, r.stream, r.start, r.end)
            p.range = self.ledger.commit(p.range.id, records=r.records, first_seen=r.first_offset,
                                         last_seen=r.last_offset, output=final, staging=p.staging)
            r.status = "committed"
            r.output = final
        self._step("committed")

    def publish(self) -> None:
        """Rename every committed range's staging copy into place (or recover an earlier attempt's)."""
        for p in self.parts:
            r, rng = p.result, p.range
            if r.status != "committed" or rng is None or not r.records:
                continue
            final = rng.output or plan.output_dir(self.config.output_root, self.config.pipeline, r.stream,
                                                  r.start, r.end)
            if outputs.published(final, rng.id, self.fs):
                continue
            staging = p.staging or rng.staging
            if staging and outputs.read_manifest(staging, self.fs) is not None:
                outputs.publish(staging, final, rng.id, self.fs)
                log.info("published %s [%d, %d) -> %s", r.stream, r.start, r.end, final)
            else:
                self.reread_committed(p, final)
        if self.staging is not None:
            outputs.remove(self.staging, self.fs)
        if self.run.try_number > 1:  # a first try has no earlier attempt to clean up after
            self.sweep_staging()
        self._step("published")

    def sweep_staging(self) -> None:
        """Remove staging left by earlier attempts of this run identity (killed mid-read): every
        range they could have committed is published by now, so nothing there is needed. Only
        retries sweep, so an idle first try touches no file system (for a URI root, resolving it
        may start the runner's Spark session)."""
        prefix = plan.staging_prefix(self.config.output_root, self.config.pipeline, self.run)
        parent, name = filesystems.parent(prefix), filesystems.name(prefix)
        for old in self.fs.listdir(parent):
            if old.startswith(name):
                outputs.remove(filesystems.join(parent, old), self.fs)

    def reread_committed(self, p: _Part, final: str) -> None:
        """A committed range lost both its output and its staging copy (deleted by hand): read it
        again and publish it only if the broker still holds exactly the committed records."""
        r, rng = p.result, p.range
        assert rng is not None
        log.warning("stream %s: committed range [%d, %d) has no output at %s: reading it again", r.stream,
                    r.start, r.end, final)
        cfg = self.config
        staging = plan.staging_dir(cfg.output_root, cfg.pipeline, self.run, uuid.uuid4().hex[:8])
        manifest = self.runner(url=cfg.url, ranges={r.stream: (r.start, r.end)}, output=staging,
                               fmt=cfg.fmt, splits=cfg.splits)
        entry = (manifest.get("streams") or {}).get(r.stream) or {}
        seen = (int(entry.get("records", -1)), entry.get("first_offset"), entry.get("last_offset"))
        if seen != (rng.records, rng.first_seen, rng.last_seen):
            outputs.remove(staging, self.fs)
            raise BatchError(
                f"stream {r.stream!r} range [{r.start}, {r.end}): re-read found records/first/last "
                f"{seen} but the ledger committed {(rng.records, rng.first_seen, rng.last_seen)}; the "
                "broker no longer holds the same data (retention?)"
            )
        self.staging = staging
        self.verify(p, manifest, 1)
        outputs.publish(str(p.staging), final, rng.id, self.fs)

    # -- store offset ----------------------------------------------------------------------------

    def store_offsets(self) -> None:
        """Move the broker's stored offset up to the ledger's watermark, and only when it is behind."""
        cfg = self.config
        if not cfg.store_offset:
            return
        for p in self.parts:
            r = p.result
            mark = self.ledger.watermark(cfg.pipeline, p.source)
            stored = self.broker.query_offset(r.stream, cfg.pipeline)
            target = plan.offset_to_store(mark, stored)
            if target is None:
                if mark.blocked_by is not None and mark.end is not None and r.start >= mark.end:
                    b = mark.blocked_by
                    log.info("stream %s: offset not stored: [%d, %d) of %s is still open before this range",
                             r.stream, b.start, b.end, b.run)
                continue
            self.broker.store_offset_verified(r.stream, cfg.pipeline, target, timeout=cfg.store_timeout)
            r.offset_stored = target
            if mark.last_record_range is not None:
                self.ledger.mark_offset_stored(mark.last_record_range, True)
            log.info("stream %s: broker offset for %s stored at %d (watermark %s)", r.stream, cfg.pipeline,
                     target, mark.end)
        self._step("stored")

    def fail(self, reason: str) -> None:
        """Mark this attempt's uncommitted claims failed (best effort; the original error wins)."""
        for p in self.parts:
            if p.result.status == "claimed" and p.range is not None:
                try:
                    self.ledger.fail(p.range.id, reason[:500])
                    p.result.status = "failed"
                except Exception:  # pragma: no cover - reported, never masks the original error
                    log.exception("could not mark range %s failed", p.range.id)
        if self.staging is not None and not any(p.result.status == "committed" and p.result.read
                                                for p in self.parts):
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
        self.publish()
        self.store_offsets()
        return self.result


def _cluster_name(broker: Any) -> str | None:
    name = getattr(broker, "cluster_name", None)
    return name if isinstance(name, str) and name else None


def run_batch(
    config: BatchConfig,
    *,
    run: RunId,
    ledger: Ledger,
    broker: Broker,
    runner: JobRunner,
    holder_alive: Callable[[RunId], bool] | None = None,
    on_step: StepHook | None = None,
) -> BatchResult:
    """Run one batch end to end (see the package docstring for what each step guarantees)."""
    return BatchRun(
        config, run=run, ledger=ledger, broker=broker, runner=runner, holder_alive=holder_alive,
        on_step=on_step,
    ).execute()


def backlog(ledger: Ledger, broker: Broker, *, pipeline: str, url: str, streams: list[str] | Any,
            super_stream: str | None = None, broker_name: str | None = None) -> dict[str, int]:
    """Unprocessed offsets per stream: committed tail minus where the pipeline would go on.

    Counts offsets, an upper bound on records (tracking chunks take offsets too). The position is
    the ledger's tail, else the broker's stored offset + 1, else the first retained offset.
    """
    from streamledger.ledger import SourceRef

    ident = plan.broker_identity(url, broker_name or _cluster_name(broker))
    out: dict[str, int] = {}
    for stream in streams:
        tail = broker.committed_tail(stream)
        start = ledger.last_end(pipeline, SourceRef(broker=ident, stream=stream, super_stream=super_stream))
        if start is None:
            stored = broker.query_offset(stream, pipeline)
            start = stored + 1 if stored is not None else broker.first_offset(stream)
        out[stream] = max(0, tail - start)
    return out
