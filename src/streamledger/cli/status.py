"""``streamledger status``: a pipeline at a glance, one row per stream it reads.

From the ledger: its ranges by status, where it is provably done (the watermark: the end of the
contiguous committed prefix, and the last record in it), open claims, the last run and when, and the
newest output. With a broker (``--broker-url`` or its environment variable) also the broker's stored
offset for the pipeline and the lag from the watermark to the stream's committed tail; sources of
other brokers show ``-`` there. Read-only: it creates nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

from streamledger.cli.options import (
    BROKER_ENV,
    OLD_BROKER_ENV,
    add_broker,
    add_json,
    add_ledger,
    known_to,
    open_ledger,
    pipeline_arg,
)
from streamledger.cli.table import render, when
from streamledger.runs import describe

HEADER = ("PIPELINE", "STREAM", "COMMITTED", "OPEN", "FAILED", "DONE TO", "LAST RECORD", "STORED", "TAIL",
          "LAG", "LAST RUN", "WHEN", "OUTPUT", "TRANSFORM")


@dataclass(slots=True)
class StreamStatus:
    """One stream of one pipeline, as ``status`` shows it (``--json``: these fields)."""

    pipeline: str
    broker: str
    stream: str
    committed: int
    open_claims: int
    failed: int
    lost: int
    done_to: int | None
    last_record: int | None
    stored: int | None = None
    tail: int | None = None
    lag: int | None = None
    last_run: str | None = None  # the exact identity (``--json``)
    last_by: str | None = None  # who ran it, in words (the table)
    last_when: str | None = None
    output: str | None = None
    broker_note: str | None = None
    transform: str | None = None
    """The fingerprint of the transform of the newest committed range (None: raw records)."""
    transforms: list[str | None] | None = None
    """Every transform (fingerprint, None for raw) that produced a committed range, oldest first."""
    mark: str | None = None  # what the ledger marked on the source: replaced, a retired epoch, unread offsets

    def row(self, *, mark: bool = False) -> tuple[object, ...]:
        return (self.pipeline, self.stream, self.committed + self.lost, self.open_claims, self.failed,
                self.done_to, self.last_record, self.stored, self.tail, self.lag, self.last_by,
                self.last_when, self.output, self.transform_said(), *((self.mark or "-",) if mark else ()))

    def transform_said(self) -> str:
        """The TRANSFORM column: the newest range's fingerprint, and how many others produced ranges."""
        said = self.transform or "raw"
        others = len(self.transforms or []) - 1
        return f"{said} (+{others} earlier)" if others > 0 else said


def _mark(pos: Any, broker: str) -> str | None:
    """The source's mark, as the audit reports it (rule 11): a retired epoch, ``replaced`` (every batch
    refuses it until ``new-epoch``), offsets a batch saw on the broker past the ledger's end."""
    from streamledger.ledger.types import is_retired

    if is_retired(broker):
        return "retired epoch (a re-created stream's old history)"
    unread = f"; [{pos.end}, {pos.seen_tail}) seen, unread" if (
        pos.seen_tail is not None and pos.end is not None and pos.seen_tail > pos.end) else ""
    if pos.replaced is not None:
        return f"replaced: {pos.replaced}{unread} (ledger new-epoch)"
    return unread[2:] or None


def _streams(ledger: Any, pipeline: str | None) -> list[StreamStatus]:
    from streamledger.ledger.types import RangeStatus

    by_source: dict[tuple[str, Any], list[Any]] = {}
    for r in ledger.ranges(pipeline):
        by_source.setdefault((r.pipeline, r.source), []).append(r)
    out: list[StreamStatus] = []
    positions: dict[tuple[str, Any], Any] = {}
    for name in sorted({n for n, _s in by_source}):
        refs = [src for n, src in by_source if n == name]
        found = ledger.positions(name, refs)
        positions.update(((name, ref), pos) for ref, pos in zip(refs, found, strict=True))
    for (name, source), rows in by_source.items():
        mark = ledger.watermark(name, source)
        counts = {s: sum(1 for r in rows if r.status == s) for s in RangeStatus}
        newest = max(rows, key=lambda r: (r.committed_at or r.claimed_at, r.id))
        published = [r for r in rows if r.published_at is not None and (r.output or r.sink_table)]
        latest = max(published, key=lambda r: (r.published_at, r.id)) if published else None
        out.append(StreamStatus(
            pipeline=name, broker=source.broker, stream=source.stream,
            committed=counts[RangeStatus.COMMITTED], open_claims=counts[RangeStatus.CLAIMED],
            failed=counts[RangeStatus.FAILED], lost=counts[RangeStatus.LOST], done_to=mark.end,
            last_record=mark.last_record, last_run=str(newest.run),
            last_by=describe(newest.run),
            last_when=when(newest.committed_at or newest.claimed_at),
            output=(latest.sink_table or latest.output) if latest is not None else None,
            **_transforms([r for r in rows if r.status == RangeStatus.COMMITTED and r.records]),
            mark=_mark(positions[(name, source)], source.broker),
        ))
    return out


def _transforms(done: list[Any]) -> dict[str, Any]:
    """Which transform produced the committed ranges (by fingerprint; None: raw), in offset order."""
    ordered = sorted(done, key=lambda r: (r.start, r.id))
    seen: list[str | None] = []
    for r in ordered:
        if r.transform not in seen:
            seen.append(r.transform)
    return {"transform": ordered[-1].transform if ordered else None, "transforms": seen}


def _compare(streams: list[StreamStatus], url: str) -> None:
    """The broker's stored offset and committed tail for the streams recorded under its identities."""
    from streamledger.batch.position import lag
    from streamledger.errors import StreamledgerError
    from streamledger.sources import connect_log, server_identities

    with connect_log(url) as log:
        identities = set(server_identities(url, log))
        for s in streams:
            if s.broker not in identities:
                retired = s.mark is not None and s.mark.startswith("retired")
                s.broker_note = "a retired epoch" if retired else "another broker"
                continue
            try:
                s.stored = log.query_offset(s.stream, s.pipeline)
                if s.done_to is None:  # nothing committed yet: no watermark to measure from
                    s.tail = log.committed_tail(s.stream)
                else:  # only offsets a batch would read count, not the tracking chunks after them
                    s.tail, s.lag = lag(log, s.stream, s.done_to)
            except StreamledgerError as exc:  # a deleted stream: say so on its row, go on
                s.broker_note = " ".join(str(exc).split())


def _status(args: argparse.Namespace) -> int:
    with open_ledger(args) as ledger:
        known_to(ledger, args.pipeline)
        streams = _streams(ledger, args.pipeline)
    given = getattr(args, "broker_url", None) or os.environ.get(BROKER_ENV) or os.environ.get(OLD_BROKER_ENV)
    if given and streams:
        _compare(streams, given)
    if getattr(args, "json", False):
        print(json.dumps([asdict(s) for s in streams], indent=2))
        return 0
    if streams:
        marked = any(s.mark for s in streams)  # the MARK column only when a source holds one
        print(render((*HEADER, *(("MARK",) if marked else ())), [s.row(mark=marked) for s in streams],
                     right=HEADER[2:10]))
    for s in streams:
        if s.broker_note:
            print(f"{s.pipeline} {s.stream}: broker not compared: {s.broker_note}", file=sys.stderr)
    if not given:
        print("no broker given (--broker-url or $STREAMLEDGER_BROKER_URL): stored offsets and lag not shown",
              file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add ``status`` to the top-level parser."""
    p = sub.add_parser("status", help="each pipeline's streams: done to, stored offset, lag, last run, "
                       "output")
    p.add_argument("--pipeline", type=pipeline_arg, default=None, help="only this pipeline")
    add_broker(p)
    add_ledger(p)
    add_json(p)
    p.set_defaults(func=_status)
