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
from functools import partial
from typing import TYPE_CHECKING, Any

from streamledger.errors import StreamledgerError
from streamledger.ledger import (
    ClaimRequest,
    Ledger,
    OffsetRange,
    RangeStatus,
    RunIdentity,
    SourcePosition,
    SourceRef,
)
from streamledger.runs import STREAMING_PREFIX

if TYPE_CHECKING:
    from streamledger.fs import OutputFS
    from streamledger.manifest import Manifest
    from streamledger.offsets import ChunkPrint

DAG_PREFIX = STREAMING_PREFIX


class MicroBatchError(StreamledgerError):
    """The ledger's history disagrees with a micro-batch: recording it would skip or repeat offsets."""


def _other_than(raw: bytes | None, fs: OutputFS, directory: str) -> bool:
    """``directory``'s manifest is not ``raw``: what a micro-batch moved aside is not the failed
    range's directory it looked at (another attempt's, placed meanwhile), so it goes back."""
    from streamledger.batch.outputs import MANIFEST
    from streamledger.fs import join

    return fs.read_bytes(join(directory, MANIFEST)) != raw


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
        #: stream -> (query, batch) last settled: an idle query asks again and again
        self._settled: dict[str, tuple[str, int]] = {}
        #: streams whose history this run found free of pinned ranges (:meth:`_refuse_pinned`)
        self._unpinned: set[str] = set()
        self._unprinted: set[str] = set()  # streams whose history had no fingerprint when last checked

    def source(self, stream: str) -> SourceRef:
        return SourceRef(self.broker, stream, self.super_stream)

    @staticmethod
    def run(query: str, batch: int, stream: str) -> RunIdentity:
        return RunIdentity(f"{DAG_PREFIX}{query}", f"batch-{batch}", stream)

    def resume_point(self, stream: str) -> int | None:
        return self.ledger.last_end(self.pipeline, self.source(stream))

    def _where(self, stream: str, query: str, batch: int) -> tuple[str, str]:
        """How an error names the place and the batch (one line: pipeline, stream, batch, query)."""
        return f"pipeline {self.pipeline!r}, stream {stream!r}", f"micro-batch {batch} of query {query}"

    def check_same_streams(self, streams: list[str], client: Any) -> None:
        """Refuse streams the broker no longer holds as the ledger read them, before a micro-batch
        claims: a stream deleted and re-created, then grown past the query's offset, would be read
        on from there, its head never read (issue 30, defect 3, for the batch). The signs are the
        batch's, decided in one place (:func:`streamledger.batch.identity.replaced_because`); a
        refusal is recorded on the source (``replaced``) and refused again until ``new-epoch``. A
        stream another broker identity's history read on this very broker is refused too (the batch's
        rule, :func:`streamledger.batch.identity.named_twice_because`)."""
        from streamledger.batch.identity import named_twice_because, replaced_because
        from streamledger.batch.position import log_offsets
        from streamledger.offsets import same_streams

        found = self.ledger.positions(self.pipeline, [self.source(s) for s in streams])
        self._unprinted.update(s for s, pos in zip(streams, found, strict=True) if pos.chunk is None)
        self._unprinted.difference_update(s for s, pos in zip(streams, found, strict=True)
                                          if pos.chunk is not None)
        for stream, pos in zip(streams, found, strict=True):  # the batch's check_one_name
            twice = named_twice_because(client, stream, self.pipeline, self.broker, pos)
            if twice is not None:
                if twice.unrecorded:  # remembered: the chunk it was found by goes with retention
                    self.ledger.record_same_broker(self.pipeline, stream, (twice.own, *twice.unrecorded),
                                                   f"stream {stream!r}: {twice.why}")
                raise MicroBatchError(f"pipeline {self.pipeline!r}, stream {stream!r}: {twice.why}")
            self._check_kind(stream, pos)  # read here already: the claim need not read it again
        tails, stored = log_offsets(client, streams, self.pipeline)  # after the ledger (see the rule)
        # every fingerprint asked at once (one round of chunk headers, as the batch asks them)
        same = same_streams(client, {s: pos.chunk for s, pos in zip(streams, found, strict=True)
                                     if pos.replaced is None and pos.chunk is not None})
        for stream, pos in zip(streams, found, strict=True):
            why = replaced_because(client, stream, self.pipeline, pos, tails[stream], stored[stream],
                                   same.get(stream))
            if why is None:
                continue
            if pos.replaced is None:
                self.ledger.mark_replaced(self.pipeline, self.source(stream), why)
            raise MicroBatchError(
                f"pipeline {self.pipeline!r}, stream {stream!r}: {why}: this is not the stream the pipeline "
                "read (deleted and re-created?); nothing recorded. `streamledger ledger new-epoch` starts a "
                "new history; restart the query with a new checkpoint"
            )

    def _refuse_pinned(self, stream: str, src: SourceRef) -> None:
        """A history pinned to data intervals is refused before anything is claimed (the batch's rule,
        :func:`streamledger.batch.history.mixed_because`): a query claims where the ledger ends, so
        it would take offsets of an interval whose run has not come yet. Asked once per stream and
        run of the query (or already by :meth:`check_same_streams`)."""
        if stream not in self._unpinned:
            self._check_kind(stream, self.ledger.position(self.pipeline, src))

    def _check_kind(self, stream: str, position: SourcePosition) -> None:
        from streamledger.batch.history import mixed_because

        why = mixed_because(self.pipeline, stream, position, pinned=False)
        if why is not None:
            raise MicroBatchError(f"{why} (stream into another pipeline)")
        self._unpinned.add(stream)

    def _mine(self, src: SourceRef, run: RunIdentity) -> OffsetRange | None:
        """The open claim ``run`` holds on ``src``, if any."""
        return next((r for r in self.ledger.open_claims(self.pipeline, src) if r.run.key() == run.key()),
                    None)

    def _take(self, src: SourceRef, run: RunIdentity, where: tuple[str, str], start: int, end: int,
              chunk: ChunkPrint | None = None) -> OffsetRange:
        """Claim exactly ``[start, end)`` for ``run`` (with ``chunk``, :meth:`first_prints`, recorded
        in the claim's transaction). The ledger may hand back another span (a failed hole is redone
        whole, whoever asks): that claim is released at once, then one line says so."""
        if chunk is None:
            got = self.ledger.claim(self.pipeline, src, end, run, initial_start=start, max_span=end - start)
        else:
            got = self.ledger.claim_many(self.pipeline, [ClaimRequest(src, end, start)], run,
                                         max_span=end - start, prints={src: chunk})[0]
        if (got.start, got.end) == (start, end):
            return got
        if got.status == RangeStatus.CLAIMED:
            self.ledger.fail(got.id, f"released: {where[1]} reads [{start}, {end}), not this span")
            raise MicroBatchError(
                f"{where[0]}: the ledger hands {where[1]} the failed span [{got.start}, {got.end}) "
                f"(range {got.id}), not the span it reads [{start}, {end}); nothing recorded (the query "
                "whose checkpoint holds that span must read it first)"
            )
        raise MicroBatchError(
            f"{where[0]}: {where[1]} reads [{start}, {end}) but its range in the ledger is "
            f"[{got.start}, {got.end}) (range {got.id}, {got.status.value}); nothing recorded"
        )

    def claim(self, query: str, batch: int, stream: str, start: int, end: int, *,
              requested_start: int | None = None, lost_reason: str | None = None,
              chunk: ChunkPrint | None = None) -> None:
        """Claim exactly ``[start, end)`` of ``stream`` for micro-batch ``batch`` (recording its lost head
        ``[requested_start, start)`` first, if any; ``chunk``, the stream's :meth:`first_prints`, is
        recorded with the claim). A replayed batch finds its own claim, used only if
        it holds exactly this span (or this span and the head retention took since: that head is
        recorded lost); any other span is refused with nothing written, the claim left for the
        operator (``ledger release-stale``). A ledger history that does not end where the batch starts
        is an error too: the ledger would otherwise skip or repeat offsets."""
        begin = start if requested_start is None else requested_start
        lost = begin < start
        src, run = self.source(stream), self.run(query, batch, stream)
        where = self._where(stream, query, batch)
        mine = self._mine(src, run)
        if mine is not None:
            if (mine.start, mine.end) == (start, end):
                return
            if not (lost and lost_reason is not None and (mine.start, mine.end) == (begin, end)):
                raise MicroBatchError(
                    f"{where[0]}: {where[1]} reads [{start}, {end}) but its claim in the ledger is "
                    f"[{mine.start}, {mine.end}) (range {mine.id}): the checkpoint and the ledger "
                    "disagree; nothing recorded (release the claim with `streamledger ledger "
                    "release-stale` once no query holds it)"
                )
            # Retention took the head since this batch first claimed it: the ledger fails the claim,
            # records the head lost and leaves the rest a hole, claimed again just below.
            self.ledger.record_lost(self.pipeline, src, begin, start, run, lost_reason)
            if start < end:
                self._take(src, run, where, start, end, chunk)
            return
        self._refuse_pinned(stream, src)
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
        if start < end:
            self._take(src, run, where, start, end, chunk)

    def first_prints(self, spans: Mapping[str, tuple[int, int]], client: Any) -> dict[str, ChunkPrint]:
        """A user chunk of each stream in its micro-batch's span ``[start, end)`` (``end`` a committed
        tail) whose history had no fingerprint when :meth:`check_same_streams` read it (the batch's
        ``first_prints``: one round of chunk headers for all of them, none for the others), for
        :meth:`claim` to record in the claim's transaction: a query killed right after claiming
        still tells the stream it claimed from one re-created meanwhile (recorded after the claim,
        the replay of a query killed in between took it from the new stream)."""
        from streamledger.offsets import take_prints_within

        wanted = {s: span for s, span in spans.items() if s in self._unprinted}
        return take_prints_within(client, wanted) if wanted else {}

    def saw_tails(self, tails: Mapping[str, int]) -> None:
        """Remember the committed tails the query saw on its streams (audit rule 10, as the batch
        does when it claims): if a stream is deleted and re-created, ``new-epoch`` records what the
        old stream held past the history's end as lost, naming it, instead of letting it vanish."""
        if tails:
            self.ledger.saw_tails(self.pipeline, {self.source(s): t for s, t in tails.items()})

    def _released(self, src: SourceRef, run: RunIdentity, where: tuple[str, str], end: int
                  ) -> OffsetRange | None:
        """Micro-batch ``run`` is done (the engine said so) but holds no claim: if the ledger does not
        already end at ``end`` and its claim was released (``ledger release-stale`` while it ran), the
        same span is claimed again, else one line (the batch read it; recording anything else would
        be false)."""
        if self.ledger.last_end(self.pipeline, src) == end:
            return None  # recorded already (or nothing to record)
        released = [r for r in self.ledger.ranges(self.pipeline, stream=src.stream)
                    if r.source.broker == src.broker and r.run.key() == run.key()
                    and r.status == RangeStatus.FAILED and r.end == end]
        if not released:
            return None  # nothing of this batch: the next claim checks where the ledger ends
        span = max(released, key=lambda r: r.id)
        return self._take(src, run, where, span.start, span.end)

    def _place(self, manifest: Manifest, r: OffsetRange, stream: str, where: tuple[str, str],
               fs: OutputFS) -> tuple[int, int | None, int | None]:
        """Place micro-batch range ``r``'s manifest in its directory by the batch's create-only rule
        (:func:`streamledger.batch.outputs.create_manifest`), before its commit; returns the counts to
        commit (those of the manifest in place).

        Two writers can reach one directory: a claim released while its micro-batch settled (after
        it found its claim, before this write) is claimed again whole by the next batch or query,
        which places its manifest and commits; the stalled one must not replace it (an overwrite left
        the committed range's directory naming a failed range and a batch's data files unlisted).
        What may be in place:

        * this range's own manifest (the query restarted on its checkpoint after a crash between its
          manifest and its commit, or a second query on one checkpoint): it stays, and its counts are
          committed (counted when the micro-batch ended);
        * the manifest of a range that failed (a claim released after its manifest, re-claimed since):
          no range commits it ever, so its directory is moved aside (as a batch moves a foreign
          directory aside) and this range's manifest created;
        * anything else (a committed or live range's, another pipeline's): refused in one line,
          nothing recorded.
        """
        from streamledger.batch import outputs

        target, ours = str(manifest.output), manifest.to_json()
        if outputs.create_manifest(target, ours, fs):
            return manifest.streams[stream].counts
        raw, found = self._in_place(target, stream, fs)
        if found is not None and found.range_id == r.id:
            return found.streams[stream].counts
        if found is not None and found.range_id is not None and self._failed(found.range_id):
            outputs.move_aside(target, fs, partial(_other_than, raw, fs), f"{where[0]}, {where[1]}")
            if outputs.create_manifest(target, ours, fs):
                return manifest.streams[stream].counts
            _raw, found = self._in_place(target, stream, fs)
        theirs = f"range {found.range_id}" if found is not None else "no range of this pipeline"
        raise MicroBatchError(
            f"{where[0]}: {where[1]}: another attempt published {target} first (its manifest names {theirs}, "
            f"this micro-batch's is range {r.id}); nothing recorded"
        )

    def _in_place(self, target: str, stream: str, fs: OutputFS) -> tuple[bytes | None, Manifest | None]:
        """The manifest bytes in ``target`` and, when it is a manifest of this pipeline with an entry
        for ``stream``, the manifest."""
        from streamledger.batch import outputs
        from streamledger.fs import join
        from streamledger.manifest import Manifest, ManifestError

        raw = fs.read_bytes(join(target, outputs.MANIFEST))
        try:
            found = Manifest.from_json(raw) if raw is not None else None
        except ManifestError:
            return raw, None
        if found is None or found.pipeline != self.pipeline or found.entry(stream) is None:
            return raw, None
        return raw, found

    def _failed(self, range_id: int) -> bool:
        """Whether ledger range ``range_id`` failed: no one can commit it any more."""
        try:
            return self.ledger.get(range_id).status == RangeStatus.FAILED
        except StreamledgerError:
            return False

    def settle(self, query: str, batch: int, ends: Mapping[str, int], client: Any) -> set[str]:
        """Commit micro-batch ``batch`` of ``query`` (the engine finished it; ``ends`` are its end
        offsets, as checkpointed): per stream exactly the span its claim holds, claimed again if it
        was released meanwhile; then move the broker's stored offsets up to the watermark. Returns
        the streams whose offset it stored."""
        from streamledger.batch.plan import offset_to_store, output_dir
        from streamledger.fs import filesystem_for
        from streamledger.manifest import Manifest, StreamEntry
        from streamledger.offsets import take_print

        stored: set[str] = set()
        if batch < 0:
            return stored  # the initial offset: no batch ran yet
        fs = filesystem_for(self.root)
        todo: list[tuple[str, OffsetRange]] = []
        for stream, pos in ends.items():
            if self._settled.get(stream) == (query, batch):
                continue
            src, run = self.source(stream), self.run(query, batch, stream)
            where = self._where(stream, query, batch)
            r = self._mine(src, run)
            if r is not None and r.end != pos:
                raise MicroBatchError(
                    f"{where[0]}: {where[1]} ended at {pos} but its claim in the ledger is "
                    f"[{r.start}, {r.end}) (range {r.id}); nothing recorded"
                )
            if r is None:
                r = self._released(src, run, where, pos)
            if r is None:
                self._settled[stream] = (query, batch)
                continue
            todo.append((stream, r))
        # Named by the source's epoch, as the batch names them: a re-created stream's [0, n) is never
        # the retired history's directory (every stream's, in one read).
        found = self.ledger.positions(self.pipeline, [self.source(s) for s, _r in todo]) if todo else []
        for (stream, r), position in zip(todo, found, strict=True):
            src = self.source(stream)
            records, first, last = count_range(client, stream, r.start, r.end)
            target_dir = output_dir(self.root, self.pipeline, self.broker, stream, r.start, r.end,
                                    epoch=position.epoch)
            manifest = Manifest(
                streams={stream: StreamEntry(r.start, r.end, records, first, last)}, output=target_dir,
                written_at=datetime.now(UTC).isoformat(), pipeline=self.pipeline, broker=self.broker,
                range_id=r.id, files=(),  # the rows are in the query's sink: no data file belongs here
                extra={"streaming": {"query": query, "batch": r.run.run_id}},
            )
            # Before the commit (a committed range has one), create-only (the batch's rule).
            records, first, last = self._place(manifest, r, stream, self._where(stream, query, batch), fs)
            # The fingerprint the next micro-batch (and the audit) checks the broker's stream against.
            chunk = take_print(client, stream, last) if last is not None else None
            self.ledger.commit(r.id, records=records, first_seen=first, last_seen=last, output=target_dir,
                               chunk=chunk)
            self._settled[stream] = (query, batch)
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
