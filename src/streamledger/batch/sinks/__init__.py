"""What "publish" means for a committed range: a directory of its own, or a commit into a table.

The batch's steps stay one state machine (claim -> read into staging -> verify -> commit ->
publish -> store offset). Publishing always starts the same way: under the range's publish lease,
its verified staging directory becomes its final directory (:func:`Sink.range_dir`). The sink then
decides what else makes the range visible:

* ``directory`` (:class:`DirectorySink`): nothing; the final directory with its ``_manifest.json``
  *is* the output (the layout of issue 19, unchanged).
* ``iceberg`` / ``delta`` (:mod:`.iceberg`, :mod:`.delta`): **one table commit per batch** adds
  the data files of every range the batch publishes, as they are (no second copy of the data), and
  names the pipeline, the attempt and every range in the commit (Iceberg snapshot summary, Delta
  commit info + an app transaction). The range is recorded published only after that commit,
  together with its receipt (the snapshot id / version: ``OffsetRange.sink_table/sink_commit``).

Why this order is exactly once (the crash table is in docs/ledger.md): the ledger commit comes
first, so the table never holds a range the ledger did not commit; the table commit is checked and
made as one compare-and-swap on the table's state (the retry first looks for its ranges in the
table's commits, then commits with the table's optimistic concurrency and *no* blind rebase, and on
a conflict looks again), so a range reaches the table at most once; and the broker offset never
passes a range the ledger has not recorded published, so a crash anywhere leaves a range the next
attempt (or any later run of the pipeline) finishes.

What tells histories apart in a table: ``(stream, offset)`` does not, since a re-created stream
(``ledger new-epoch``) starts again at offset 0 and two brokers may hold streams of one name. So the
table sinks (only they: the job's files and the directory sink's layout stay as they are, the range
directory already names broker and epoch) add two constant columns to every row they append,
:data:`TABLE_COLUMNS`: ``broker``, the ledger's broker identity of the range (a retired history's
``#epoch<N>`` suffix removed), and ``epoch``, the source's epoch. They do it by rewriting each of a
range's Parquet files once, in place, just before the table commit (:func:`stamp`: one read and one
write of files the batch has just written, 0.4 s for 100 000 rows; the table still references the
job's files and keeps no second copy), and the audit matches rows by ``(broker, epoch, stream,
offset)``. Two columns rather than one ``source`` string: readers filter and group on them without
parsing, and the epoch is the ledger's number for the stream's incarnation. A table made before
the columns existed gets them as nullable columns at its next commit; its rows without them (null)
are the history it held before, counted for a range only when no row carries the range's own
``(broker, epoch)``.

Before any of it, :meth:`Sink.check` refuses a table that cannot take the job's files (catalog
unreachable, columns not the job's, a location that is not a Delta table), so a bad table leaves
nothing claimed; a commit lost to another writer is retried a bounded number of times
(:data:`COMMIT_ATTEMPTS`, :func:`backoff`).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from streamledger import fs as filesystems
from streamledger.batch import plan
from streamledger.batch.rules import SINKS as SINKS
from streamledger.batch.rules import default_iceberg_table as default_iceberg_table
from streamledger.batch.rules import sink_problem as sink_problem

if TYPE_CHECKING:
    from streamledger.batch.config import RunId
    from streamledger.ledger import Ledger, OffsetRange
    from streamledger.ledger.audit import Violation, ViolationKind

__all__ = [
    "SINKS", "DirectorySink", "Sink", "SinkBatch", "SinkRange", "SinkReceipt", "TableCommit", "TableRange",
    "data_files", "default_iceberg_table", "schema_problem", "sink_problem", "summary",
]

#: Keys of a table commit's summary (Iceberg snapshot summary / Delta commit info).
KEY_PIPELINE = "streamledger.pipeline"
KEY_BROKER = "streamledger.broker"
KEY_RUN = "streamledger.run"
KEY_RANGES = "streamledger.ranges"

#: How many times a table commit is tried against concurrent writers before the batch gives up
#: (the ranges stay committed and unpublished: the next run of the pipeline publishes them).
COMMIT_ATTEMPTS = 8


def backoff(attempt: int) -> float:
    """Seconds to wait after the ``attempt``-th (0-based) lost commit: exponential from 50 ms,
    at most 2 s, with full jitter so writers that collided do not collide again in step."""
    return random.uniform(0, min(2.0, 0.05 * 2 ** attempt))


@dataclass(frozen=True, slots=True)
class SinkRange:
    """One committed range whose data files are in their final directory."""

    range: OffsetRange
    location: str
    epoch: int = 0
    """The epoch of the range's source (``Ledger.new_epoch``): what a table sink stamps on its rows."""


@dataclass(frozen=True, slots=True)
class SinkBatch:
    """What one publish hands a sink: the batch's committed ranges (own and stranded ones)."""

    pipeline: str
    broker: str
    run: RunId
    attempt: str  # the attempt token (the publish-lease holder)
    ranges: tuple[SinkRange, ...]
    output_root: str


@dataclass(frozen=True, slots=True)
class SinkReceipt:
    """Which table commit holds a range: recorded on the range in the ledger (migration 0006)."""

    table: str  # "iceberg:<ns>.<name>" / "delta:<uri>"
    commit: int  # Iceberg snapshot id / Delta version


class Sink(Protocol):
    name: str

    def check(self) -> None:
        """Raise a one-line ``BatchError`` naming the table when it cannot take the job's files (its
        catalog cannot be reached, its schema is not the job's, the location is not a table):
        asked before anything is claimed, so a bad table leaves nothing in the ledger."""
        ...

    def range_dir(self, broker: str, stream: str, start: int, end: int, epoch: int) -> str:
        """Where a committed range's files live once published."""
        ...

    def published(self, batch: SinkBatch) -> dict[int, SinkReceipt]:
        """What a retry asks: the ranges of ``batch`` (by ledger id) a table commit already holds."""
        ...

    def publish(self, batch: SinkBatch) -> dict[int, SinkReceipt]:
        """Make every range of ``batch`` visible (at most one new table commit); receipts by range id."""
        ...

    def audit(self, ledger: Ledger, pipeline: str, ranges: list[OffsetRange]) -> list[Violation]:
        """The table's side of the proof for the pipeline's ranges published into it."""
        ...

    def describe(self) -> dict[str, Any] | None:
        """The table as a reader finds it now (``format``, ``identifier``, ``location``, and the
        current ``metadata_location``/``snapshot_id`` or ``version``); None for the directory sink."""
        ...


class DirectorySink:
    """Each range's directory is its output: nothing beyond the final directory (issue 19)."""

    name = "directory"

    def __init__(self, output_root: str, pipeline: str) -> None:
        self.output_root, self.pipeline = output_root, pipeline

    def check(self) -> None:
        return None  # the output root is checked when the job writes to it

    def range_dir(self, broker: str, stream: str, start: int, end: int, epoch: int) -> str:
        return plan.output_dir(self.output_root, self.pipeline, broker, stream, start, end, epoch=epoch)

    def published(self, batch: SinkBatch) -> dict[int, SinkReceipt]:
        return {}

    def publish(self, batch: SinkBatch) -> dict[int, SinkReceipt]:
        return {}

    def audit(self, ledger: Ledger, pipeline: str, ranges: list[OffsetRange]) -> list[Violation]:
        return []  # streamledger.batch.proof checks every published directory

    def describe(self) -> dict[str, Any] | None:
        return None


def _kind(t: Any) -> str:
    """A column type as far as the job's files and a table must agree (the width of strings,
    binaries and lists, the map's key/value widths and whether a nested value may be null are each
    library's business: pyiceberg reads a table back in large widths, Spark writes plain ones; the
    integer size too, but for integers wider than the column, :func:`_wider_integers`). Lists, maps
    and structs compare by what they hold, so a changed element, key or value type still shows; a
    timestamp with a time zone is not one without."""
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"list<{_kind(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{_kind(t.key_type)}, {_kind(t.item_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{t.field(i).name}: {_kind(t.field(i).type)}"
                                     for i in range(t.num_fields)) + ">"
    if pa.types.is_timestamp(t):  # an instant (UTC-adjusted) or a wall-clock time: neither is the other
        return "timestamp" if t.tz else "timestamp_ntz"
    for kind, test in (("string", pa.types.is_string), ("string", pa.types.is_large_string),
                       ("binary", pa.types.is_binary), ("binary", pa.types.is_large_binary),
                       ("integer", pa.types.is_integer)):
        if test(t):
            return kind
    return str(t)


FILE_COLUMN = "__filename"
"""pyarrow's name for the path of the file a row was read from (a table sink's audit asks for it)."""

#: The columns a table sink adds to the job's rows (:func:`stamp`): name -> column kind (``_kind``).
TABLE_COLUMNS = {"broker": "string", "epoch": "integer"}


def table_fields() -> list[Any]:
    """:data:`TABLE_COLUMNS` as nullable pyarrow fields (nullable: a table made before them gets
    them by schema evolution, its older rows null)."""
    import pyarrow as pa

    return [pa.field("broker", pa.string()), pa.field("epoch", pa.int64())]


def with_table_columns(schema: Any) -> Any:
    """A job's file ``schema`` with the :data:`TABLE_COLUMNS` it lacks appended: a new table's."""
    import pyarrow as pa

    return pa.schema([*schema, *(f for f in table_fields() if f.name not in schema.names)])


def stamp(path: str, broker: str, epoch: int) -> bool:
    """Rewrite one of a range's Parquet files with :data:`TABLE_COLUMNS` appended (``broker``,
    ``epoch`` constant), in place (a temporary sibling renamed over it); False when it already
    carries them (a retry). Only ever called on files no table commit references yet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    afs, where = filesystems.arrow_filesystem(path)
    with afs.open_input_file(where) as src:
        f = pq.ParquetFile(src)
        if set(TABLE_COLUMNS) <= set(f.schema_arrow.names):
            return False
        data = f.read()
    n = data.num_rows
    cols = [pa.array([broker] * n, pa.string()), pa.array([epoch] * n, pa.int64())]
    stamped = pa.Table.from_arrays([*data.columns, *cols], schema=pa.schema(
        [*data.schema, *table_fields()], metadata=data.schema.metadata))
    tmp = filesystems.join(filesystems.parent(path), "_" + filesystems.name(path) + ".stamping")
    if filesystems.scheme(path) in ("", "file"):
        pq.write_table(stamped, _local(tmp))
        os.replace(_local(tmp), _local(path))
    else:  # pragma: no cover - object stores: one object written whole replaces the other
        pq.write_table(stamped, where, filesystem=afs)
    return True


def _local(location: str) -> str:
    return str(filesystems.local_path(location)) if filesystems.scheme(location) in ("", "file") else location


def schema_problem(schema: Any, files_schema: Any = None, *, transformed: bool = False) -> str | None:
    """Why a table's arrow ``schema`` is not the job's (``files_schema``: the columns of every file
    the job writes from the pipeline's kind of log, ``LogKind.files_schema``; RabbitMQ's
    ``schemas.ARROW_SCHEMA`` when not given), or None. The one rule both table sinks ask before
    claiming. With a transform (``transformed``), ``files_schema`` is what the transform writes
    (None: not known before the job) and the table follows it (:func:`transform_schema_problem`)."""
    if transformed:
        return None if files_schema is None else transform_schema_problem(schema, files_schema)
    if files_schema is None:
        from streamledger.schemas import ARROW_SCHEMA as files_schema

    want = {f.name: _kind(f.type) for f in files_schema}
    have = {f.name: _kind(f.type) for f in schema}
    for name, kind in TABLE_COLUMNS.items():  # a table sink's own columns, or none yet (evolved)
        if name in have and name not in want:
            want[name] = kind
    if set(have) != set(want):
        return f"its columns ({', '.join(have)}) are not the job's ({', '.join(want)})"
    wrong = [f"{n} is {have[n]}, the job writes {want[n]}" for n in want if have[n] != want[n]]
    if wrong:
        return "its column types are not the job's: " + "; ".join(wrong)
    return None


def transform_schema_problem(schema: Any, output: Any) -> str | None:
    """Why a table cannot take a transform's rows, or None. A transform may add columns (the table
    evolves: :func:`new_columns`) and leave out a nullable one (its rows read null there); it may
    not change a column's type, nor leave out a column the table requires, nor land on a table of
    raw records (no lineage columns)."""
    from streamledger.transform import LINEAGE_COLUMNS

    have = {f.name: f for f in schema}
    if LINEAGE_COLUMNS[0] not in have:
        return ("it holds raw records (no lineage columns), not a transform's rows: give the transform "
                "a table of its own")
    wants = {f.name: f for f in output}
    changed = [f"{n} is {_kind(have[n].type)}, the transform writes {_kind(f.type)}"
               for n, f in wants.items() if n in have and _kind(have[n].type) != _kind(f.type)]
    changed += [f"{n} holds {have[n].type.bit_width}-bit integers, the transform writes "
                f"{f.type.bit_width}-bit ones" for n, f in wants.items()
                if n in have and _wider_integers(have[n].type, f.type)]
    if changed:
        return ("the transform changes column types (refused: rewrite the table or use a new one): "
                + "; ".join(changed))
    required = [n for n, f in have.items() if n not in wants and n not in TABLE_COLUMNS and not f.nullable]
    if required:
        return f"the transform leaves out column(s) the table requires: {', '.join(required)}"
    return None


def _wider_integers(have: Any, writes: Any) -> bool:
    """A column of integers narrower than those written into it (a table takes narrower files: pyiceberg
    reads int32 files into a long column, but refuses int64 files for an int one at the publish)."""
    import pyarrow as pa

    return bool(pa.types.is_integer(have) and pa.types.is_integer(writes)
                and writes.bit_width > have.bit_width)


def new_columns(schema: Any, output: Any) -> list[Any]:
    """The transform's columns the table lacks, as nullable fields (what the table evolves by)."""
    have = set(schema.names)
    return [f.with_nullable(True) for f in output if f.name not in have]


def row_columns(have: set[str]) -> list[str]:
    """The columns the audit reads of a table's rows: a transform's lineage, or each raw row's
    ``stream`` and ``offset``; with the :data:`TABLE_COLUMNS` the table has."""
    from streamledger.transform import LINEAGE_COLUMNS

    own = list(LINEAGE_COLUMNS) if LINEAGE_COLUMNS[0] in have else ["stream", "offset"]
    return [*own, *(c for c in TABLE_COLUMNS if c in have)]


def data_files(location: str, fs: filesystems.OutputFS | None = None) -> list[str]:
    """The data files of a range directory, as locations (``_``/``.`` files are not data), listed
    with ``fs`` (default: the location's own file system, pyarrow's for an object store)."""
    from streamledger.batch.outputs import data_file_names

    return [filesystems.join(location, n)
            for n in data_file_names(location, fs or filesystems.filesystem_for(location))]


def summary(batch: SinkBatch, ranges: list[SinkRange]) -> dict[str, str]:
    """What a table commit says about itself: pipeline, broker, attempt and every range."""
    return {
        KEY_PIPELINE: batch.pipeline,
        KEY_BROKER: batch.broker,
        KEY_RUN: batch.attempt,
        KEY_RANGES: json.dumps([
            {"id": r.range.id, "stream": r.range.source.stream, "start": r.range.start, "end": r.range.end,
             "records": r.range.records} for r in ranges
        ], separators=(",", ":")),
    }


@dataclass(frozen=True, slots=True)
class TableRange:
    """One range a table commit names, as :func:`summary` wrote it. The summary is read back from a
    table anyone can write to, so a field missing or of the wrong type is None (the audit reports it)."""

    id: int | None
    stream: str | None
    start: int | None
    end: int | None
    records: int | None

    @classmethod
    def parse(cls, entry: Mapping[str, Any]) -> TableRange:
        def num(key: str) -> int | None:
            value = entry.get(key)
            return value if isinstance(value, int) else None

        stream = entry.get("stream")
        return cls(num("id"), stream if isinstance(stream, str) else None, num("start"), num("end"),
                   num("records"))


@dataclass(frozen=True, slots=True)
class TableCommit:
    """One commit of a pipeline found in a table: its id and the ranges it names."""

    commit: int
    ranges: tuple[TableRange, ...]
    run: str


def parse_summary(props: Mapping[str, Any], pipeline: str, commit: int) -> TableCommit | None:
    """The pipeline's commit in ``props`` (a summary / commit info), None for anyone else's."""
    if props.get(KEY_PIPELINE) != pipeline or KEY_RANGES not in props:
        return None
    try:
        ranges = json.loads(str(props[KEY_RANGES]))
    except ValueError:
        ranges = []
    return TableCommit(commit, tuple(TableRange.parse(r) for r in ranges if isinstance(r, dict)),
                       str(props.get(KEY_RUN, "")))


def whole_table_missing(table: str, pipeline: str, ranges: list[OffsetRange],
                        problem: str) -> list[Violation]:
    """The finding when a table cannot be opened or its rows cannot be read (files deleted, the store
    unreachable): every range the ledger recorded in it is missing, named in one line each."""
    from streamledger.ledger.audit import Violation, ViolationKind

    return [Violation(ViolationKind.OUTPUT_MISSING, pipeline, r.source.stream, r.source.broker, r.start,
                      r.end, r.id, problem) for r in ranges if r.sink_table == table]


def line(exc: BaseException) -> str:
    """A library's error as one line (its first)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_table(table: str, pipeline: str, ranges: list[OffsetRange], commits: list[TableCommit] | None,
                rows: Any, known_commits: set[int] | None = None,
                epochs: Mapping[tuple[str, str], int] | None = None) -> list[Violation]:
    """The three-way check of one table against the ledger (the broker side is the ledger's audit).

    ``ranges``: the pipeline's committed ranges with records (any sink). ``commits``: the pipeline's
    commits in the table's current lineage (None: the table keeps no history we can read).
    ``rows``: a pyarrow table of the ``stream`` and ``offset`` columns of every row, with the
    :data:`TABLE_COLUMNS` when the table has them. ``known_commits``: every commit id the table
    still knows (expired ones are missing). ``epochs``: each source's epoch by ``(broker identity,
    stream)`` as the ledger keeps it (missing: 0).

    * every range recorded in this table is in exactly one commit of the pipeline, and the commit
      the ledger recorded (unless that commit was expired: then only the rows speak);
    * no commit of the pipeline names a range the ledger has not committed with that span;
    * the rows of each range's ``(broker, epoch, stream)`` in its span number the ledger's records,
      and no offset of them appears twice. Rows of others outside the pipeline's ranges are not
      the pipeline's.
    """
    epochs = epochs or {}
    mine = [r for r in ranges if r.sink_table == table]
    found = _commit_findings(table, pipeline, mine, ranges, commits, known_commits)
    from streamledger.transform import LINEAGE_COLUMNS

    if LINEAGE_COLUMNS[0] in rows.column_names:
        return found + _transformed_rows(table, pipeline, mine, rows, epochs)
    return found + _raw_rows(table, mine, rows, epochs)


def _finding(table: str, kind: ViolationKind, r: OffsetRange, detail: str) -> Violation:
    """A finding about range ``r`` of ``table``."""
    from streamledger.ledger.audit import Violation

    return Violation(kind, r.pipeline, r.source.stream, r.source.broker, r.start, r.end, r.id,
                     f"table {table}: {detail}")


def _commit_findings(table: str, pipeline: str, mine: list[OffsetRange], ranges: list[OffsetRange],
                     commits: list[TableCommit] | None, known_commits: set[int] | None) -> list[Violation]:
    """The commits' half of :func:`check_table`: each range of the table in exactly one commit of the
    pipeline, the one the ledger recorded, and no commit naming a range the ledger did not commit."""
    from streamledger.ledger.audit import Violation, ViolationKind

    finding = partial(_finding, table)

    by_id = {r.id: r for r in ranges}
    found: list[Violation] = []
    holders: dict[int, list[int]] = {}
    for c in commits or []:
        for entry in c.ranges:
            rid = entry.id
            r = by_id.get(rid) if rid is not None else None
            if r is None or (entry.stream, entry.start, entry.end) != (r.source.stream, r.start, r.end):
                found.append(Violation(
                    ViolationKind.OUTPUT_MISMATCH, pipeline, str(entry.stream), "", entry.start, entry.end,
                    rid, f"table {table}: commit {c.commit} (by {c.run or 'unknown'}) holds range {rid} "
                    f"[{entry.start}, {entry.end}), which the ledger did not commit"))
                continue
            holders.setdefault(r.id, []).append(c.commit)
    if commits is not None:
        for r in mine:
            held = holders.get(r.id, [])
            expired = known_commits is not None and r.sink_commit not in known_commits
            if len(held) > 1:
                found.append(finding(ViolationKind.OUTPUT_MISMATCH, r, f"the range is in {len(held)} commits "
                                     f"{sorted(held)}, not one"))
            elif not held and not expired:
                found.append(finding(ViolationKind.OUTPUT_MISSING, r, "no commit of the table's current "
                                     f"lineage holds the range (the ledger recorded commit {r.sink_commit})"))
            elif held and r.sink_commit is not None and held[0] != r.sink_commit:
                found.append(finding(ViolationKind.OUTPUT_MISMATCH, r, f"the range is in commit {held[0]}, "
                                     f"the ledger recorded commit {r.sink_commit}"))
    return found


def _raw_rows(table: str, mine: list[OffsetRange], rows: Any,
              epochs: Mapping[tuple[str, str], int]) -> list[Violation]:
    """The rows' half of :func:`check_table` for a table of raw records: the rows of each range's
    ``(broker, epoch, stream)`` in its span number the ledger's records, none of them twice."""
    import pyarrow.compute as pc

    from streamledger.ledger.audit import ViolationKind
    from streamledger.ledger.types import live_broker

    finding = partial(_finding, table)

    found: list[Violation] = []
    # Rows: per (broker, epoch, stream), the sorted offsets; each range's span counted by bisection.
    # A range counts the rows stamped with its own (broker, epoch); when there are none in its span,
    # the unstamped ones (null: rows a table sink appended before it stamped them, see the module).
    from bisect import bisect_left, bisect_right

    streams = {r.source.stream for r in mine}
    offsets: dict[tuple[str | None, int | None, str], list[int]] = {}
    has = set(rows.column_names)
    for s in streams:
        part = rows.filter(pc.equal(rows["stream"], s))
        brokers = part["broker"].to_pylist() if "broker" in has else [None] * part.num_rows
        epoch_of = part["epoch"].to_pylist() if "epoch" in has else [None] * part.num_rows
        for b, e, o in zip(brokers, epoch_of, part["offset"].to_pylist(), strict=True):
            offsets.setdefault((b, e, s), []).append(o)
    for v in offsets.values():
        v.sort()

    def span(key: tuple[str | None, int | None, str], r: OffsetRange) -> list[int]:
        offs = offsets.get(key, [])
        return offs[bisect_left(offs, r.start):bisect_left(offs, r.end)]

    def own(r: OffsetRange) -> tuple[str | None, int | None, str]:
        src = r.source
        return live_broker(src.broker), epochs.get((src.broker, src.stream), 0), src.stream

    # Unstamped rows count for the ranges without stamped rows of their own. In the span of a range
    # that has its own, unstamped rows no such range counts are a second copy of its rows.
    counting: dict[str, list[tuple[int, int]]] = {}
    for r in mine:
        if not span(own(r), r):
            counting.setdefault(r.source.stream, []).append((r.start, r.end))
    merged: dict[str, tuple[list[int], list[int]]] = {}
    for s, spans in counting.items():
        starts: list[int] = []
        ends: list[int] = []
        for a, b in sorted(spans):
            if ends and a <= ends[-1]:
                ends[-1] = max(ends[-1], b)
            else:
                starts.append(a)
                ends.append(b)
        merged[s] = (starts, ends)

    def counted(stream: str, o: int) -> bool:
        starts, ends = merged.get(stream, ([], []))
        i = bisect_right(starts, o) - 1
        return i >= 0 and o < ends[i]

    for r in mine:
        if not span(own(r), r):
            continue
        extra = [o for o in span((None, None, r.source.stream), r) if not counted(r.source.stream, o)]
        if extra:
            found.append(finding(ViolationKind.OUTPUT_MISMATCH, r,
                                 f"{len(extra)} row(s) without broker and epoch in the range (first offset "
                                 f"{extra[0]}) that no range counts: a second copy of rows it holds"))
    for r in mine:
        key = own(r)
        got = span(key, r) or span((None, None, r.source.stream), r)
        n = len(got)
        distinct = len(set(got))
        if distinct != n:
            found.append(finding(ViolationKind.OUTPUT_MISMATCH, r,
                                 f"{n - distinct} duplicate (stream, offset) row(s) of broker {key[0]} "
                                 f"epoch {key[1]} in the range"))
        if n != r.records:
            found.append(finding(ViolationKind.OUTPUT_MISMATCH, r, f"the table holds {n} rows in the range, "
                                 f"the ledger committed {r.records}"))
    return found


def _transformed_rows(table: str, pipeline: str, mine: list[OffsetRange], rows: Any,
                      epochs: Mapping[tuple[str, str], int]) -> list[Violation]:
    """A transform's table: the rows stamped with each committed range's lineage ``(broker, epoch,
    stream, start, end)`` number the rows the ledger recorded for it, and no row names a range the
    ledger did not commit into this table (a failed attempt's, or a copy's)."""
    from collections import Counter

    from streamledger.ledger.audit import Violation, ViolationKind
    from streamledger.ledger.types import live_broker
    from streamledger.transform import LINEAGE_COLUMNS

    cols = [rows[c].to_pylist() for c in ("broker", "epoch", *LINEAGE_COLUMNS)]
    counts = Counter(zip(*cols, strict=True))
    found: list[Violation] = []
    if FILE_COLUMN in rows.column_names:  # where each row lives: its range's own directory, or not
        found += _rows_outside_their_range(table, mine, cols, rows[FILE_COLUMN].to_pylist(), epochs)
    for r in mine:
        src = r.source
        key = (live_broker(src.broker), epochs.get((src.broker, src.stream), 0), src.stream, r.start, r.end)
        n = counts.pop(key, 0)
        want = r.rows_out if r.rows_out is not None else r.records
        if n != want:
            found.append(Violation(ViolationKind.OUTPUT_MISMATCH, r.pipeline, src.stream, src.broker, r.start,
                                   r.end, r.id, f"table {table}: the table holds {n} rows of the range, the "
                                   f"ledger recorded {want} written by its transform"))
    for (broker, epoch, stream, start, end), n in sorted(counts.items(), key=str):
        found.append(Violation(ViolationKind.OUTPUT_MISMATCH, pipeline, str(stream), str(broker or ""),
                               int(start or 0), int(end or 0), None,
                               f"table {table}: {n} row(s) stamped with range [{start}, {end}) of broker "
                               f"{broker} epoch {epoch}, which the ledger did not commit into this table"))
    return found


def _rows_outside_their_range(table: str, mine: list[OffsetRange], cols: list[list[Any]], files: list[str],
                              epochs: Mapping[tuple[str, str], int]) -> list[Violation]:
    """Rows stamped with a committed range's lineage in a file outside that range's directory: the
    table was rewritten by another writer (a delete or update rewrites files, an append adds them),
    so the range's rows may be doubled or gone even when their number still agrees."""
    from streamledger.ledger.audit import Violation, ViolationKind
    from streamledger.ledger.types import live_broker

    where: dict[tuple[Any, ...], OffsetRange] = {}
    for r in mine:
        src = r.source
        key = (live_broker(src.broker), epochs.get((src.broker, src.stream), 0), src.stream, r.start, r.end)
        where[key] = r
    outside: dict[int, set[str]] = {}
    for key, path in zip(zip(*cols, strict=True), files, strict=True):
        owner = where.get(key)
        if owner is not None and owner.output and not _under(str(path), owner.output):
            outside.setdefault(owner.id, set()).add(str(path))
    return [Violation(ViolationKind.OUTPUT_MISMATCH, r.pipeline, r.source.stream, r.source.broker, r.start,
                      r.end, r.id, f"table {table}: rows of the range in file(s) outside its directory (the "
                      f"table was rewritten by another writer): {', '.join(sorted(outside[r.id])[:3])}")
            for r in mine if r.id in outside]


def _under(path: str, directory: str) -> bool:
    """``path`` (a dataset's file path: no scheme for local files, ``bucket/key`` on S3) lies in the
    range directory ``directory`` (a path or URI)."""
    def norm(p: str) -> str:
        p = p.split("://", 1)[1] if "://" in p else p
        return "/" + p.lstrip("/").rstrip("/")

    return norm(path).startswith(norm(directory) + "/")
