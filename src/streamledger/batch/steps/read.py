"""The read: one job for every partition with something to read, into a fresh staging directory,
while a :class:`Heartbeat` renews the claims. A crash during it (crash A) leaves the claims for the
retry; a claim lost while the job ran stops the batch before anything is committed."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from streamledger.batch import plan, sinks
from streamledger.batch.config import BatchError
from streamledger.batch.spec import SpecError
from streamledger.batch.steps.verify import Verifying
from streamledger.manifest import Manifest, ManifestError
from streamledger.progress import JobWatch, Planned, every_seconds
from streamledger.transform import TransformError

if TYPE_CHECKING:
    from streamledger.ledger import Ledger, RunIdentity

log = logging.getLogger("streamledger.batch")


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


class Reading(Verifying):
    """The read step of a batch: the job and the transform check (a mixin of ``BatchRun``)."""

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
