"""What the Iceberg and Delta sinks share: finding a batch's ranges in the table's commits, the
look-commit-retry loop of a publish, and the table's side of the audit.

A table sink keeps only what differs between the formats (:class:`TableSink`'s hooks): opening
(or creating) the table, listing the pipeline's commits, making one commit of a batch's files,
reading the rows the audit counts, and describing the table. The loop is the exactly-once rule of
:mod:`streamledger.batch.sinks`: look for the ranges in the table's commits, commit the rest as one
compare-and-swap (no blind rebase), and on a lost commit look again, at most
:data:`~streamledger.batch.sinks.COMMIT_ATTEMPTS` times.

Before its commit a table sink stamps each file of the ranges it adds with the range's broker and
epoch (:func:`~streamledger.batch.sinks.stamp`, why in :mod:`streamledger.batch.sinks`), and a
table without those columns gets them first (:meth:`TableSink._evolve`); the audit matches rows
by them, the epoch of each source read from the ledger.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamledger.batch import sinks
from streamledger.batch.config import BatchError
from streamledger.batch.sinks import (
    SinkBatch,
    SinkRange,
    SinkReceipt,
    TableCommit,
    check_table,
    data_files,
    stamp,
    whole_table_missing,
)
from streamledger.fs import redact

if TYPE_CHECKING:
    from streamledger.ledger import Ledger, OffsetRange
    from streamledger.ledger.audit import Violation

__all__ = ["LostCommit", "TableSink"]


def files_missing(table: str, label: str, pipeline: str, ranges: list[OffsetRange],
                  gone: list[str]) -> list[Violation]:
    """The findings for data files the table references that are not there: each names the range
    whose directory held the file (its rows are what is lost) and the file; a file in no recorded
    range's directory is a finding for every range recorded in the table (whose rows it held is
    unknown)."""
    from streamledger.ledger.audit import Violation, ViolationKind

    mine = [r for r in ranges if r.sink_table == table and r.output]
    by_range: dict[int, list[str]] = {}
    stray = []
    for path in gone:
        owners = [r for r in mine if _within(path, str(r.output))]
        for r in owners:
            by_range.setdefault(r.id, []).append(path)
        if not owners:
            stray.append(path)
    if stray:
        return whole_table_missing(table, pipeline, ranges, f"{label}: data file(s) missing, in no recorded "
                                   f"range's directory: {', '.join(redact(p) for p in stray)}")
    return [Violation(ViolationKind.OUTPUT_MISSING, pipeline, r.source.stream, r.source.broker, r.start,
                      r.end, r.id, f"{label}: the range's data file(s) are missing: "
                      f"{', '.join(redact(p) for p in sorted(by_range[r.id]))}")
            for r in mine if r.id in by_range]


def _within(path: str, directory: str) -> bool:
    """``path`` (a table's file URI) lies in the range directory ``directory`` (a path or URI)."""
    def norm(p: str) -> str:
        p = p if "://" in p else Path(p).resolve().as_uri()
        return p.replace("file:///", "/", 1).replace("s3a://", "s3://", 1).rstrip("/")

    return norm(path).startswith(norm(directory) + "/")


class LostCommit(Exception):
    """The table changed between the look and the commit (its optimistic concurrency refused ours)."""


class TableSink:
    """The shared half of a table sink; subclasses set :attr:`name`, :attr:`table_name`,
    :attr:`label`, :attr:`log` and implement the hooks below."""

    name: str
    pipeline: str
    table_name: str  # as recorded on a range in the ledger: "iceberg:<ns>.<name>" / "delta:<uri>"
    label: str  # how one-line errors name the table: "iceberg table <ns>.<name>" / "delta table <uri>"
    log: logging.Logger
    files_schema: Any  # the pyarrow schema of the job's files (LogKind.files_schema); None: RabbitMQ's
    transformed: bool = False  # the rows are a transform's: files_schema is its output (None: unknown)

    # -- hooks ------------------------------------------------------------------------------------

    def _open(self, schema_of: str | None) -> Any:
        """The table; None when missing and ``schema_of`` is None, else created with the schema of
        that data file. One-line ``BatchError`` when it cannot be opened or created."""
        raise NotImplementedError

    def commits(self, table: Any) -> list[TableCommit]:
        """The pipeline's commits in the table's current lineage, newest first."""
        raise NotImplementedError

    def _check_files(self, files: dict[int, list[str]]) -> None:
        """Refuse, before any look, files the table cannot reference (none by default)."""

    def _commit(self, table: Any, batch: SinkBatch, todo: list[SinkRange], files: dict[int, list[str]],
                what: str) -> None:
        """One commit adding the files of ``todo`` on the state ``table`` was opened in; raises
        :class:`LostCommit` when another writer committed first."""
        raise NotImplementedError

    def _rows(self, table: Any, without: frozenset[str] = frozenset()) -> Any:
        """A pyarrow table of the ``stream`` and ``offset`` of every row, and of the
        :data:`~streamledger.batch.sinks.TABLE_COLUMNS` the table has; the rows of the data files
        ``without`` left out."""
        raise NotImplementedError

    def _missing_files(self, table: Any) -> list[str] | None:
        """The data files (URIs) the table's current state references that are not there; None
        when the format cannot tell (the audit then reports the table as a whole)."""
        return None

    def _evolve(self, table: Any) -> bool:
        """Add the :data:`~streamledger.batch.sinks.TABLE_COLUMNS` the table lacks (a table made
        before them) as nullable columns, in a commit of their own; False when it has them."""
        raise NotImplementedError

    def _known_commits(self, table: Any) -> set[int]:
        """Every commit id the table still knows (expired ones are missing)."""
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------------

    def _held(self, table: Any, ids: set[int]) -> dict[int, SinkReceipt]:
        """Which of the ranges ``ids`` a commit of the pipeline already holds (the first found)."""
        held: dict[int, SinkReceipt] = {}
        for c in self.commits(table):
            for entry in c.ranges:
                if entry.id is not None and entry.id in ids:
                    held.setdefault(entry.id, SinkReceipt(self.table_name, c.commit))
        return held

    def published(self, batch: SinkBatch) -> dict[int, SinkReceipt]:
        table = self._open(None)
        return {} if table is None else self._held(table, {r.range.id for r in batch.ranges})

    def publish(self, batch: SinkBatch) -> dict[int, SinkReceipt]:
        files = {r.range.id: data_files(r.location) for r in batch.ranges}
        self._check_files(files)
        first = next((f[0] for f in files.values() if f), None)
        ids = set(files)
        what = ""
        existing = self._open(first)
        if existing is not None:
            self._evolve(existing)  # before the attempts: its commit is none of theirs
        for attempt in range(sinks.COMMIT_ATTEMPTS):
            table = self._open(first)
            held = self._held(table, ids) if table is not None else {}
            todo = [r for r in batch.ranges if r.range.id not in held]
            if not todo:
                return held
            what = ", ".join(f"{r.range.source.stream} [{r.range.start}, {r.range.end})" for r in todo)
            self._stamp(todo, files)
            if self._evolve(table):
                continue  # made without the columns meanwhile: look again on its new state
            try:
                self._commit(table, batch, todo, files, what)
            except LostCommit as exc:
                self.log.warning("%s changed while committing %s (%s): looking again", self.label, what,
                                 exc)
                time.sleep(sinks.backoff(attempt))
        table = self._open(None)
        held = self._held(table, ids) if table is not None else {}
        if set(held) == ids:
            return held
        raise BatchError(f"{self.label}: {sinks.COMMIT_ATTEMPTS} commits lost to concurrent writers; {what} "
                         "stay committed and unpublished for the next run")

    def _stamp(self, todo: list[SinkRange], files: dict[int, list[str]]) -> None:
        """Stamp the files of ranges no commit holds (a retry finds them stamped)."""
        from streamledger.ledger.types import live_broker

        started, n = time.perf_counter(), 0
        for r in todo:
            broker = live_broker(r.range.source.broker)
            for f in files[r.range.id]:
                try:
                    n += stamp(f, broker, r.epoch)
                except Exception as exc:
                    raise BatchError(f"{self.label}: cannot add the broker and epoch columns to {f}: "
                                     f"{sinks.line(exc)}") from exc
        if n:
            self.log.info("%s: stamped %d file(s) with broker and epoch in %.3f s", self.label, n,
                          time.perf_counter() - started)

    def audit(self, ledger: Ledger, pipeline: str, ranges: list[OffsetRange]) -> list[Violation]:
        """The table's side of the proof (:func:`~streamledger.batch.sinks.check_table`); a table
        that cannot be opened or read is a finding for every range recorded in it."""
        try:
            table = self._open(None)
            problem = f"{self.label} does not exist"
        except BatchError as exc:
            table, problem = None, str(exc)
        if table is None:
            return whole_table_missing(self.table_name, pipeline, ranges, problem)
        gone: list[str] = []
        try:
            try:
                rows = self._rows(table)
            except Exception:
                # data files deleted: the ranges that held them are findings, the others are checked
                gone = self._missing_files(table) or []
                if not gone:
                    raise
                rows = self._rows(table, without=frozenset(gone))
            commits = self.commits(table)
            known = self._known_commits(table)
        except Exception as exc:  # the store gone, the metadata unreadable: a finding, not a traceback
            return whole_table_missing(self.table_name, pipeline, ranges,
                                       f"{self.label}: its rows cannot be read: {sinks.line(exc)}")
        from streamledger.ledger.coverage import sources

        epochs = {(s.source.broker, s.source.stream): s.epoch
                  for s in sources(ledger, pipeline, counts=False)}
        found = check_table(self.table_name, pipeline, ranges, commits, rows, known, epochs)
        if not gone:
            return found
        lost = files_missing(self.table_name, self.label, pipeline, ranges, gone)
        hit = {v.range_id for v in lost}
        return [*lost, *(v for v in found if v.range_id not in hit)]
