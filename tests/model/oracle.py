"""What the data says, read the way a downstream reader and the broker's own client read it.

Nothing here asks the ledger for a verdict: a pipeline's outputs are found by walking its own
output root (directory sink: every range directory holding a ``_manifest.json``, the marker the
sink writes last; Delta: every table under the root; Iceberg: every table of the catalog whose
location is under the root) and read with pyarrow / deltalake / pyiceberg. Each body starts with
the id the test published, so a record read twice or never is seen by its id.

A pipeline with a transform (issue 42) writes rows, not records: every form keeps the ids it was
given (``id``; ``explode``: ``id`` on each of a record's 1-3 rows, ``item`` 1 counted;
``aggregate``: the list ``ids`` of each bucket), so the same count of ids holds, and ``filter``'s
dropped ids are expected absent. Each range's rows are also grouped by the lineage the sink stamps
(``streamledger_start`` / ``streamledger_end``, the epoch) and compared with :func:`predict`, which
computes them in plain Python from the records the oracle read on the broker.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tests.model.ops import PipelineSpec

MANIFEST = "_manifest.json"
#: Under a pipeline's output root: its streaming queries' rows (``q<n>/out/b<batch id>``, each a Spark
#: parquet write, read only once its ``_SUCCESS`` is there; a table pipeline's queries write a Delta
#: table ``q<n>/delta`` or an Iceberg table located at ``q<n>/iceberg``, read as the pipeline's tables
#: are) and checkpoints.
STREAMING = "_streaming"


def make_body(record_id: str, pad: int) -> bytes:
    return record_id.encode() + b"|" + b"x" * pad


def body_id(body: bytes) -> str:
    return body.split(b"|", 1)[0].decode()


def seq_of(record_id: str) -> int:
    return int(record_id.rsplit("-", 1)[1])


def kept(transform: str | None, record_id: str) -> bool:
    """Whether the pipeline's transform keeps the record in its output (``filter`` drops every id whose
    sequence number is a multiple of 3)."""
    return transform != "filter" or seq_of(record_id) % 3 != 0


def predict(transform: str, records: Iterable[tuple[int, str]]) -> list[tuple[Any, ...]]:
    """One range's rows as the transform must write them, from ``(offset, id)`` of exactly the range's
    records, computed here in plain Python (not from the transform's SQL), sorted; the row shapes
    are :func:`row_of`'s."""
    recs = sorted(records)
    if transform == "filter":
        return sorted((i, o) for o, i in recs if kept("filter", i))
    if transform == "explode":
        return sorted((i, o, item) for o, i in recs for item in range(1, seq_of(i) % 3 + 2))
    buckets: dict[int, list[tuple[int, str]]] = {}
    for o, i in recs:
        buckets.setdefault(seq_of(i) % 4, []).append((o, i))
    return sorted((b, len(rs), tuple(sorted(i for _o, i in rs)), min(o for o, _i in rs))
                  for b, rs in buckets.items())


#: The columns of each transform's rows that :func:`predict` predicts.
ROW_COLUMNS = {"filter": ("id", "offset"), "explode": ("id", "offset", "item"),
               "aggregate": ("bucket", "n", "ids", "first")}
LINEAGE = ("streamledger_stream", "streamledger_start", "streamledger_end")


def row_of(transform: str, row: Mapping[str, Any]) -> tuple[Any, ...]:
    values = [row[c] for c in ROW_COLUMNS[transform]]
    return tuple(tuple(v) if isinstance(v, list) else v for v in values)


def _id_columns(names: Iterable[str]) -> list[str]:
    """Which columns carry the ids of a table: ``body`` (raw records, a streaming query's rows), else
    the transform's (``ids`` of an aggregate, ``id`` and ``item`` of an explode, ``id``)."""
    names = set(names)
    for cols in (["body"], ["ids"], ["id", "item"], ["id"]):
        if set(cols) <= names:
            return cols
    raise ValueError(f"no column holds the ids: {sorted(names)}")


def _ids(table: Any) -> list[str]:
    """The ids a table's rows hold, each once per record it holds (an explode's rows count at item 1)."""
    cols = table.column_names
    if "body" in cols:
        return [body_id(b) for b in table.column("body").to_pylist()]
    if "ids" in cols:
        return [i for ids in table.column("ids").to_pylist() for i in (ids or [])]
    if "item" in cols:
        return [i for i, n in zip(table.column("id").to_pylist(), table.column("item").to_pylist(),
                                  strict=True) if n == 1]
    return list(table.column("id").to_pylist())


@dataclass
class Read:
    """One pipeline's outputs: how often each id is there, and what could not be read (as text).
    ``transform``: the pipeline's, whose dropped ids (``filter``) count as where they belong."""

    ids: Counter[str] = field(default_factory=Counter)
    unreadable: list[str] = field(default_factory=list)
    transform: str | None = None
    #: of ``ids``, those in the streaming queries' rows (raw records: no transform ran on them)
    streamed: Counter[str] = field(default_factory=Counter)

    @property
    def doubled(self) -> dict[str, int]:
        return {i: n for i, n in self.ids.items() if n > 1}

    def has(self, record_id: str) -> bool:
        """The record is where it belongs: in the outputs, or (dropped by the filter) nowhere."""
        return record_id in self.ids or not kept(self.transform, record_id)

    @property
    def filtered_present(self) -> list[str]:
        """Ids the filter drops in the transform's rows (a streaming query's raw rows hold them)."""
        return sorted(i for i, n in self.ids.items() if not kept(self.transform, i) and n > self.streamed[i])


def _count(out: Read, table: Any) -> None:
    """Count the ids of ``table``'s rows; rows with a ``body`` are raw records (of a streaming query
    when the pipeline has a transform, whose rows have none)."""
    ids = _ids(table)
    out.ids.update(ids)
    if "body" in table.column_names and out.transform is not None:
        out.streamed.update(ids)


def _data_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))


def _directory_ids(root: Path, out: Read) -> None:
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_staging", "_iceberg", STREAMING))]
        if MANIFEST not in files:
            continue
        for f in _data_files(Path(here)):
            try:
                names = pq.read_schema(f).names
                _count(out, pq.read_table(f, columns=_id_columns(names)))
            except Exception as exc:  # a reader that cannot read a published file sees none of it
                out.unreadable.append(f"{f.name}: {type(exc).__name__}: {exc}"[:200])


def _delta_ids(root: Path, out: Read) -> None:
    from deltalake import DeltaTable

    for here, dirs, _files in os.walk(root):
        if "_delta_log" not in dirs:
            continue
        dirs[:] = []
        try:
            table = DeltaTable(here)
            names = [f.name for f in table.schema().fields]
            _count(out, table.to_pyarrow_table(columns=_id_columns(names)))
        except Exception as exc:
            out.unreadable.append(f"delta table {Path(here).name}: {type(exc).__name__}: {exc}"[:200])


def _iceberg_ids(root: Path, catalog: Mapping[str, str], out: Read) -> None:
    from streamledger.batch.sinks.iceberg import load_catalog

    try:
        cat = load_catalog(catalog)
        names = [t for ns in cat.list_namespaces() for t in cat.list_tables(ns)]
    except Exception as exc:
        out.unreadable.append(f"iceberg catalog: {type(exc).__name__}: {exc}"[:200])
        return
    for name in names:
        try:
            table = cat.load_table(name)
            where = table.metadata.location.removeprefix("file://")
            if not os.path.realpath(where).startswith(os.path.realpath(root) + os.sep):
                continue
            names = [f.name for f in table.schema().fields]
            _count(out, table.scan(selected_fields=tuple(_id_columns(names))).to_arrow())
        except Exception as exc:
            out.unreadable.append(f"iceberg table {name}: {type(exc).__name__}: {exc}"[:200])


def _streaming_ids(root: Path, out: Read) -> None:
    """The rows every streaming query of the pipeline wrote: each micro-batch's complete write."""
    for batch in sorted(root.glob(f"{STREAMING}/q*/out/b*")):
        if not (batch / "_SUCCESS").exists():
            continue
        for f in _data_files(batch):
            try:
                bodies = pq.read_table(f, columns=["body"]).column("body").to_pylist()
                out.ids.update(body_id(b) for b in bodies)
                out.streamed.update(body_id(b) for b in bodies)
            except Exception as exc:
                out.unreadable.append(f"{batch.parent.parent.name}/{batch.name}/{f.name}: "
                                      f"{type(exc).__name__}: {exc}"[:200])


def read_outputs(spec: PipelineSpec, root: Path, catalog: Mapping[str, str]) -> Read:
    """Every record a reader of the pipeline's sink (and of its streaming queries' rows) sees, by id."""
    out = Read(transform=spec.transform)
    if not root.exists():
        return out
    _streaming_ids(root, out)
    if spec.sink == "directory":
        _directory_ids(root, out)
    elif spec.sink == "delta":
        _delta_ids(root, out)
    else:
        _iceberg_ids(root, catalog, out)
    return out


_LEAF = re.compile(r"^(?:e(\d+)-)?(\d{12})-(\d{12})$")


def range_rows(spec: PipelineSpec, root: Path, catalog: Mapping[str, str]
               ) -> tuple[dict[tuple[int, int, int], list[tuple[Any, ...]]], list[str]]:
    """A transform pipeline's rows grouped by the range they came from, ``(epoch, start, end)``: in a
    directory by the range directory holding them (its name, ``[e<epoch>-]<start>-<end>``, checked
    against the lineage columns of its rows), in a table by the lineage and ``epoch`` columns. The
    streaming queries' rows (raw records) are not a transform's. Also what could not be read."""
    assert spec.transform is not None
    groups: dict[tuple[int, int, int], list[tuple[Any, ...]]] = {}
    bad: list[str] = []
    if not root.exists():
        return groups, bad
    want = [*ROW_COLUMNS[spec.transform], *LINEAGE]

    def add(epoch: int, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            key = (epoch, int(row["streamledger_start"]), int(row["streamledger_end"]))
            groups.setdefault(key, []).append(row_of(spec.transform or "", row))

    if spec.sink == "directory":
        for here, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            leaf = _LEAF.match(Path(here).name)
            if MANIFEST not in files or leaf is None:
                continue
            epoch, start, end = int(leaf.group(1) or 0), int(leaf.group(2)), int(leaf.group(3))
            for f in _data_files(Path(here)):
                try:
                    rows = pq.read_table(f, columns=want).to_pylist()
                except Exception as exc:
                    bad.append(f"{f.name}: {type(exc).__name__}: {exc}"[:200])
                    continue
                if {(r["streamledger_start"], r["streamledger_end"]) for r in rows} - {(start, end)}:
                    bad.append(f"{Path(here).name}/{f.name}: rows stamped with another range's lineage")
                groups.setdefault((epoch, start, end), [])
                add(epoch, rows)
        return groups, bad
    tables: list[Any] = []
    if spec.sink == "delta":
        from deltalake import DeltaTable

        for here, dirs, _files in os.walk(root):
            dirs[:] = [d for d in dirs if d != STREAMING]
            if "_delta_log" in dirs:
                dirs[:] = []
                try:
                    tables.append(DeltaTable(here).to_pyarrow_table(columns=[*want, "epoch"]))
                except Exception as exc:
                    bad.append(f"delta table {Path(here).name}: {type(exc).__name__}: {exc}"[:200])
    else:
        from streamledger.batch.sinks.iceberg import load_catalog

        try:
            cat = load_catalog(catalog)
            names = [t for ns in cat.list_namespaces() for t in cat.list_tables(ns)]
        except Exception as exc:
            return groups, [f"iceberg catalog: {type(exc).__name__}: {exc}"[:200]]
        for name in names:
            try:
                table = cat.load_table(name)
                where = os.path.realpath(table.metadata.location.removeprefix("file://"))
                if not where.startswith(os.path.realpath(root) + os.sep) or where.startswith(
                        os.path.realpath(root / STREAMING) + os.sep):
                    continue
                tables.append(table.scan(selected_fields=(*want, "epoch")).to_arrow())
            except Exception as exc:
                bad.append(f"iceberg table {name}: {type(exc).__name__}: {exc}"[:200])
    for t in tables:
        by_epoch: dict[int, list[dict[str, Any]]] = {}
        for row in t.to_pylist():
            by_epoch.setdefault(int(row["epoch"] or 0), []).append(row)
        for epoch, rows in by_epoch.items():
            add(epoch, rows)
    return groups, bad


def broker_records(client: Any, stream: str) -> list[tuple[int, str]]:
    """(offset, id) of every user record the broker still holds, read with its own client."""
    from streamledger.offsets import DataLossError

    first, tail = client.first_offset(stream), client.committed_tail(stream)
    for _ in range(10):  # the first offset the statistics report may lag retention a moment
        found: list[tuple[int, str]] = []
        if tail <= first:
            return found
        try:
            for batch in client.read_range(stream, first, tail, decode="amqp"):
                found.extend((o, body_id(b)) for o, b in zip(batch.offsets, batch.bodies, strict=True))
        except DataLossError as exc:
            first = exc.first_available
            continue
        return found
    raise RuntimeError(f"stream {stream}: retention kept moving while the oracle read it")


def unseen(seen: Mapping[int, str], ids: Iterable[str], tail: int) -> list[tuple[int, int, str]]:
    """``(lo, hi, id)`` of every id published on one incarnation of the stream that the oracle never
    saw on the broker (retention took it before the next look): its offset is unknown, but ids are
    published in order, so it lies in ``[lo, hi)`` between the offsets of its nearest seen
    neighbours (``0`` and ``tail`` at the ends)."""
    by_id = {i: o for o, i in seen.items()}
    order = list(ids)
    out: list[tuple[int, int, str]] = []
    lo = 0
    gap: list[str] = []
    for i in order:
        if i in by_id:
            out.extend((lo, by_id[i], g) for g in gap)
            gap, lo = [], by_id[i] + 1
        else:
            gap.append(i)
    out.extend((lo, max(lo, tail), g) for g in gap)
    return out


def covered(lo: int, hi: int, spans: Iterable[tuple[int, int]]) -> str:
    """How much of ``[lo, hi)`` the union of ``spans`` covers: ``all``, ``some`` or ``none``."""
    if hi <= lo:
        return "none"
    total, at = 0, lo
    for s, e in sorted(spans):
        s, e = max(s, at), min(e, hi)
        if s < e:
            total += e - s
            at = e
    return "all" if total >= hi - lo else "some" if total else "none"


def stray_files(world: Path, allowed: Iterable[Path]) -> list[str]:
    """Files under the scenario's directory that are neither in an output root nor the test's own."""
    keep = [os.path.realpath(p) for p in allowed]
    stray: list[str] = []
    for here, dirs, files in os.walk(world):
        real = os.path.realpath(here)
        if any(real == k or real.startswith(k + os.sep) for k in keep):
            dirs[:] = []
            continue
        stray.extend(os.path.relpath(os.path.join(here, f), world) for f in files)
    return sorted(stray)
