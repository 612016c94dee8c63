"""The verify step: each partition of the job's manifest checked against its claim (the span, the
counts, the data files, the transform) before anything is committed, and the range's own manifest
written beside its staging copy, which the publish and a retry trust."""

from __future__ import annotations

import logging

from streamledger.batch import outputs
from streamledger.batch.config import BatchError
from streamledger.batch.steps.state import BatchState, Part
from streamledger.manifest import Manifest, ManifestError

log = logging.getLogger("streamledger.batch")


class Verifying(BatchState):
    """The verify step of a batch (a mixin of ``BatchRun``)."""

    def verify(self, p: Part, manifest: Manifest, staging: str) -> None:
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
