"""The reread path: a committed range whose output and staging copy are both gone is read again and
published only when the broker still holds exactly the records the ledger committed. Apart from the
publish because it is the one place a committed range is read twice, and why it may not be."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from streamledger.batch import outputs, plan
from streamledger.batch.config import BatchError, PartitionResult, StartFrom
from streamledger.batch.steps.read import Reading
from streamledger.batch.steps.state import Part

if TYPE_CHECKING:
    from streamledger.ledger import OffsetRange

log = logging.getLogger("streamledger.batch")


class Rereading(Reading):
    """The reread of a committed range (a mixin of ``BatchRun``)."""

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
        part = Part(reread, rng.source, rng)
        self.verify(part, manifest, staging)
        assert part.staging is not None
        outputs.publish(part.staging, final, rng.id, self.fs, guard=guard)
        if part.staging != staging:
            outputs.remove(staging, self.fs)
