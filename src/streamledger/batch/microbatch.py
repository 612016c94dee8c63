"""The ledger's bookkeeping for an unbounded reader's micro-batches (Spark's Structured Streaming
today): claim each batch's span per stream when the batch is planned, commit it once the engine says
the batch is done, then store the broker offset at the ledger's watermark.

It takes plain values (query, batch number, stream, offsets) so the streaming adapter only says what
a micro-batch is; which ranges the ledger records stays here, beside the batch that records ranges
the same way. A micro-batch's run identity is
``RunIdentity("spark-streaming:<query id>", "batch-<n>", <stream>)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from streamledger.errors import StreamledgerError
from streamledger.ledger import Ledger, RunIdentity, SourceRef

DAG_PREFIX = "spark-streaming:"


class MicroBatchError(StreamledgerError):
    """The ledger's history disagrees with a micro-batch: recording it would skip or repeat offsets."""


def count_range(client: Any, stream: str, start: int, end: int) -> tuple[int, int | None, int | None]:
    """``(records, first offset, last offset)`` of ``[start, end)``: a raw read of offsets only (no
    body decode, no maps), what the ledger commits for a range the tasks read."""
    records, first, last = 0, None, None
    if start >= end:
        return 0, None, None
    for batch in client.read_range(stream, start, end, decode="raw", layout="buffers", maps=False):
        for a, n in zip(batch.run_starts, batch.run_lengths, strict=True):
            if n:
                first = a if first is None else first
                last = a + n - 1
                records += n
    return records, first, last


class MicroBatchRecorder:
    """Claims, commits and stores offsets for one query's micro-batches (driver side only)."""

    def __init__(self, ledger: Ledger, pipeline: str, output_root: str, broker: str,
                 super_stream: str | None = None) -> None:
        self.ledger = ledger
        self.pipeline = pipeline
        self.root = output_root
        self.broker = broker
        self.super_stream = super_stream

    def source(self, stream: str) -> SourceRef:
        return SourceRef(self.broker, stream, self.super_stream)

    @staticmethod
    def run(query: str, batch: int, stream: str) -> RunIdentity:
        return RunIdentity(f"{DAG_PREFIX}{query}", f"batch-{batch}", stream)

    def resume_point(self, stream: str) -> int | None:
        return self.ledger.last_end(self.pipeline, self.source(stream))

    def claim(self, query: str, batch: int, stream: str, start: int, end: int, *,
              requested_start: int | None = None, lost_reason: str | None = None) -> None:
        """Claim ``[start, end)`` of ``stream`` for micro-batch ``batch`` (recording its lost head
        ``[requested_start, start)`` first, if any); a replayed batch finds its own claim. A ledger
        history that does not end where the batch starts is an error: the ledger would otherwise
        skip or repeat offsets."""
        begin = start if requested_start is None else requested_start
        lost = begin < start
        src, run = self.source(stream), self.run(query, batch, stream)
        for r in self.ledger.open_claims(self.pipeline, src):
            if r.run.dag_id == run.dag_id and r.run.run_id == run.run_id:
                return
        last = self.ledger.last_end(self.pipeline, src)
        if last is not None and last != begin and not (lost and begin < last <= start):
            raise MicroBatchError(
                f"pipeline {self.pipeline!r}, stream {stream!r}: the ledger's ranges end at {last} but "
                f"micro-batch {batch} starts at {begin}; start the query where the ledger ends "
                "(leave startingOffsets unset) or use another pipeline"
            )
        if lost and lost_reason is not None:
            lost_from = begin if last is None else max(begin, last)
            if lost_from < start:
                self.ledger.record_lost(self.pipeline, src, lost_from, start, run, lost_reason)
        if start == end:
            return
        got = self.ledger.claim(self.pipeline, src, end, run, initial_start=start, max_span=end - start)
        if (got.start, got.end) != (start, end):
            raise MicroBatchError(
                f"pipeline {self.pipeline!r}, stream {stream!r}: the ledger handed micro-batch {batch} "
                f"[{got.start}, {got.end}) (range {got.id}), not [{start}, {end})"
            )

    def settle(self, query: str, ends: Mapping[str, int], client: Any) -> set[str]:
        """Commit this query's claims that end at or before ``ends`` (the engine finished them), then
        move the broker's stored offsets up to the watermark; returns the streams whose offset it
        stored."""
        from streamledger.batch import outputs
        from streamledger.batch.plan import offset_to_store, output_dir
        from streamledger.fs import filesystem_for
        from streamledger.manifest import Manifest, StreamEntry

        dag = f"{DAG_PREFIX}{query}"
        stored: set[str] = set()
        fs = filesystem_for(self.root)
        for stream, pos in ends.items():
            src = self.source(stream)
            mine = [r for r in self.ledger.open_claims(self.pipeline, src)
                    if r.run.dag_id == dag and r.end <= pos]
            for r in mine:
                records, first, last = count_range(client, stream, r.start, r.end)
                where = output_dir(self.root, self.pipeline, self.broker, stream, r.start, r.end)
                manifest = Manifest(
                    streams={stream: StreamEntry(r.start, r.end, records, first, last)}, output=where,
                    written_at=datetime.now(UTC).isoformat(), pipeline=self.pipeline, broker=self.broker,
                    range_id=r.id, extra={"streaming": {"query": query, "batch": r.run.run_id}},
                )
                outputs.write_manifest(where, manifest, fs)  # before the commit: a committed range has one
                self.ledger.commit(r.id, records=records, first_seen=first, last_seen=last, output=where)
            if not mine:
                continue
            mark = self.ledger.watermark(self.pipeline, src)
            target = offset_to_store(mark, client.query_offset(stream, self.pipeline))
            if target is not None:
                client.store_offset_verified(stream, self.pipeline, target)
                stored.add(stream)
                if mark.last_record_range is not None:
                    self.ledger.mark_offset_stored(mark.last_record_range, True)
        return stored

    def close(self) -> None:
        self.ledger.close()
