"""The last step: the broker's stored offset moved up to the ledger's watermark. A crash before it
(crash C) leaves the broker behind until the next run stores it; the audit reports it meanwhile."""

from __future__ import annotations

import logging

from streamledger.batch import plan
from streamledger.batch.position import log_offsets
from streamledger.batch.steps.state import BatchState
from streamledger.offsets import OffsetNotVerified

log = logging.getLogger("streamledger.batch")


class Storing(BatchState):
    """The store step of a batch (a mixin of ``BatchRun``)."""

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
