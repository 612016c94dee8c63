"""What the data says, read the way a downstream reader and the broker's own client read it.

Nothing here asks the ledger for a verdict: a pipeline's outputs are found by walking its own
output root (directory sink: every range directory holding a ``_manifest.json``, the marker the
sink writes last; Delta: every table under the root; Iceberg: every table of the catalog whose
location is under the root) and read with pyarrow / deltalake / pyiceberg. Each body starts with
the id the test published, so a record read twice or never is seen by its id.
"""

from __future__ import annotations

import os
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


@dataclass
class Read:
    """One pipeline's outputs: how often each id is there, and what could not be read (as text)."""

    ids: Counter[str] = field(default_factory=Counter)
    unreadable: list[str] = field(default_factory=list)

    @property
    def doubled(self) -> dict[str, int]:
        return {i: n for i, n in self.ids.items() if n > 1}


def _data_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))


def _directory_ids(root: Path, out: Read) -> None:
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_staging", "_iceberg", STREAMING))]
        if MANIFEST not in files:
            continue
        for f in _data_files(Path(here)):
            try:
                bodies = pq.read_table(f, columns=["body"]).column("body").to_pylist()
                out.ids.update(body_id(b) for b in bodies)
            except Exception as exc:  # a reader that cannot read a published file sees none of it
                out.unreadable.append(f"{f.name}: {type(exc).__name__}: {exc}"[:200])


def _delta_ids(root: Path, out: Read) -> None:
    from deltalake import DeltaTable

    for here, dirs, _files in os.walk(root):
        if "_delta_log" not in dirs:
            continue
        dirs[:] = []
        try:
            rows = DeltaTable(here).to_pyarrow_table(columns=["body"])
            out.ids.update(body_id(b) for b in rows.column("body").to_pylist())
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
            rows = table.scan(selected_fields=("body",)).to_arrow()
            out.ids.update(body_id(b) for b in rows.column("body").to_pylist())
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
            except Exception as exc:
                out.unreadable.append(f"{batch.parent.parent.name}/{batch.name}/{f.name}: "
                                      f"{type(exc).__name__}: {exc}"[:200])


def read_outputs(spec: PipelineSpec, root: Path, catalog: Mapping[str, str]) -> Read:
    """Every record a reader of the pipeline's sink (and of its streaming queries' rows) sees, by id."""
    out = Read()
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
