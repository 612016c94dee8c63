"""The Iceberg sink: one fast append per batch of the job's Parquet files (pyiceberg ``add_files``).

Zero setup by default: a pyiceberg SQL catalog kept in the ledger's own database (its tables
``iceberg_tables`` / ``iceberg_namespace_properties`` beside the ledger's), warehouse
``<output_root>/_iceberg``; any other pyiceberg catalog by its properties (``catalog=``). The table
is created on first use with the job's schema (``stream, offset, chunk_timestamp, body`` and the
property maps) and partitioned by ``identity(stream)`` (each range's files hold one stream, so
``add_files`` reads the partition from the files' statistics).

Exactly once: the append is made on the table state in which this batch's ranges were looked for
(``AssertRefSnapshotId`` on ``main``) and pyiceberg's blind rebase-and-retry is switched off for
it, so a concurrent commit makes ours fail; the batch then looks again (the other commit may be
a zombie of this very range) before it retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamledger import fs as filesystems
from streamledger.batch import plan, sinks
from streamledger.batch.config import BatchError
from streamledger.batch.sinks import (
    SinkBatch,
    SinkRange,
    SinkReceipt,
    TableCommit,
    check_table,
    data_files,
    parse_summary,
    schema_problem,
    summary,
)

if TYPE_CHECKING:
    from streamledger.ledger import Ledger, OffsetRange
    from streamledger.ledger.audit import Violation

log = logging.getLogger(__name__)

CATALOG_NAME = "streamledger"
def _uri(location: str) -> str:
    """pyiceberg wants URIs: a plain path becomes ``file:///abs``."""
    if filesystems.scheme(location):
        return location
    return Path(location).resolve().as_uri()


def catalog_properties(catalog: Mapping[str, str] | None, *, ledger_url: str,
                       output_root: str) -> dict[str, str]:
    """The catalog's properties: the given ones, else a SQL catalog in the ledger's database."""
    if catalog:
        return dict(catalog)
    return {"type": "sql", "uri": ledger_url, "warehouse": _uri(filesystems.join(output_root, "_iceberg"))}


def load_catalog(props: Mapping[str, str]) -> Any:
    from pyiceberg.catalog import load_catalog as _load

    props = dict(props)
    name = props.pop("name", CATALOG_NAME)
    return _load(name, **props)


class IcebergSink:
    name = "iceberg"

    def __init__(self, *, pipeline: str, output_root: str, table: str, catalog: Mapping[str, str] | None,
                 ledger_url: str) -> None:
        self.pipeline, self.output_root, self.identifier = pipeline, output_root, table
        self.props = catalog_properties(catalog, ledger_url=ledger_url, output_root=output_root)
        self.table_name = f"iceberg:{table}"
        self._catalog: Any = None

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            for attempt in range(3):
                try:
                    self._catalog = load_catalog(self.props)
                    break
                except Exception as exc:
                    # A SQL catalog's first use creates its tables: two batches starting at once
                    # race on that (one sees "already exists"), and loading again finds them.
                    if attempt < 2 and self.props.get("type") == "sql":
                        time.sleep(sinks.backoff(attempt + 2))
                        continue
                    raise BatchError(f"iceberg table {self.identifier}: the catalog cannot be reached: "
                                     f"{_line(exc)}") from exc
        return self._catalog

    def range_dir(self, broker: str, stream: str, start: int, end: int, epoch: int) -> str:
        # The table references the files where the directory sink would publish them.
        return plan.output_dir(self.output_root, self.pipeline, broker, stream, start, end, epoch=epoch)

    # -- the table --------------------------------------------------------------------------------

    def _load(self, schema_of: str | None) -> Any:
        """The table; created (partitioned by stream) from the first data file's schema if missing."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError

        try:
            return self.catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            if schema_of is None:
                return None
        except BatchError:
            raise
        except Exception as exc:
            raise BatchError(f"iceberg table {self.identifier}: cannot be loaded: {_line(exc)}") from exc
        import pyarrow.parquet as pq

        schema = pq.read_schema(_local(schema_of)).remove_metadata()
        namespace = self.identifier.split(".", 1)[0]
        try:
            self._create_namespace(namespace)
            with self.catalog.create_table_transaction(self.identifier, schema=schema) as tx, \
                    tx.update_spec() as spec:
                spec.add_identity("stream")
            log.info("created iceberg table %s (partitioned by stream)", self.identifier)
        except TableAlreadyExistsError:
            pass  # another batch created it meanwhile
        except Exception as exc:
            raise BatchError(f"iceberg table {self.identifier}: cannot be created: {_line(exc)}") from exc
        return self.catalog.load_table(self.identifier)

    def _create_namespace(self, namespace: str) -> None:
        """The namespace, created unless there: two batches creating it at once both see it missing
        and the second insert fails (a UNIQUE constraint in the SQL catalog); then it exists."""
        try:
            self.catalog.create_namespace_if_not_exists(namespace)
        except Exception as exc:
            try:
                self.catalog.load_namespace_properties(namespace)
            except Exception:
                raise exc from None  # the namespace is not there: the create's own error
            log.info("iceberg namespace %s was created by another batch meanwhile", namespace)

    def commits(self, table: Any) -> list[TableCommit]:
        """The pipeline's commits in the current lineage of ``main``, newest first."""
        meta = table.metadata
        out: list[TableCommit] = []
        snap = table.current_snapshot()
        while snap is not None:
            props = snap.summary.additional_properties if snap.summary is not None else {}
            found = parse_summary(props, self.pipeline, snap.snapshot_id)
            if found is not None:
                out.append(found)
            parent = snap.parent_snapshot_id
            snap = meta.snapshot_by_id(parent) if parent is not None else None
        return out

    def _held(self, table: Any, ids: set[int]) -> dict[int, SinkReceipt]:
        held: dict[int, SinkReceipt] = {}
        for c in self.commits(table):
            for entry in c.ranges:
                if entry.get("id") in ids:
                    held.setdefault(int(entry["id"]), SinkReceipt(self.table_name, c.commit))
        return held

    # -- the sink ---------------------------------------------------------------------------------

    def check(self) -> None:
        """The catalog answers and the table, if it exists, has the job's columns."""
        table = self._load(None)
        if table is None:
            return  # created on first use, with the job's schema
        problem = schema_problem(table.schema().as_arrow())
        if problem is not None:
            raise BatchError(f"iceberg table {self.identifier}: {problem}")

    def published(self, batch: SinkBatch) -> dict[int, SinkReceipt]:
        table = self._load(None)
        return {} if table is None else self._held(table, {r.range.id for r in batch.ranges})

    def publish(self, batch: SinkBatch) -> dict[int, SinkReceipt]:
        from pyiceberg.exceptions import CommitFailedException

        files = {r.range.id: data_files(r.location) for r in batch.ranges}
        first = next((f[0] for f in files.values() if f), None)
        ids = set(files)
        for attempt in range(sinks.COMMIT_ATTEMPTS):
            table = self._load(first)
            held = self._held(table, ids) if table is not None else {}
            todo: list[SinkRange] = [r for r in batch.ranges if r.range.id not in held]
            if not todo:
                return held
            paths = [_uri(p) for r in todo for p in files[r.range.id]]
            what = ", ".join(f"{r.range.source.stream} [{r.range.start}, {r.range.end})" for r in todo)
            # No blind rebase on a concurrent commit (in memory only: the table's properties stay).
            table.metadata = table.metadata.model_copy(update={"properties": {
                **table.metadata.properties, "commit.retry.num-retries": "0"}})
            try:
                table.add_files(paths, snapshot_properties=summary(batch, todo), check_duplicate_files=False)
            except CommitFailedException as exc:
                log.warning("iceberg table %s changed while committing %s (%s): looking again",
                            self.identifier, what, _line(exc))
                time.sleep(sinks.backoff(attempt))
                continue
            except (ValueError, TypeError) as exc:  # pyiceberg's schema / file checks
                raise BatchError(f"iceberg table {self.identifier}: the job's files for {what} cannot be "
                                 f"added: {_line(exc)}") from exc
            log.info("iceberg table %s: snapshot %s appends %d file(s) of %s", self.identifier,
                     table.current_snapshot().snapshot_id, len(paths), what)
        table = self._load(None)
        held = self._held(table, ids) if table is not None else {}
        if set(held) == ids:
            return held
        raise BatchError(f"iceberg table {self.identifier}: {sinks.COMMIT_ATTEMPTS} commits lost to "
                         f"concurrent writers; {what} stay committed and unpublished for the next run")

    def describe(self) -> dict[str, Any] | None:
        table = self._load(None)
        if table is None:
            return {"format": "iceberg", "identifier": self.identifier, "location": None,
                    "metadata_location": None, "snapshot_id": None}
        snap = table.current_snapshot()
        return {"format": "iceberg", "identifier": self.identifier, "location": table.location(),
                "metadata_location": table.metadata_location,
                "snapshot_id": snap.snapshot_id if snap is not None else None}

    def audit(self, ledger: Ledger, pipeline: str, ranges: list[OffsetRange]) -> list[Violation]:
        from streamledger.ledger.audit import Violation, ViolationKind

        table = None
        try:
            table = self._load(None)
        except BatchError as exc:
            problem = str(exc)
        else:
            problem = f"iceberg table {self.identifier} does not exist"
        if table is None:
            return [Violation(ViolationKind.OUTPUT_MISSING, pipeline, r.source.stream, r.source.broker,
                              r.start, r.end, r.id, problem)
                    for r in ranges if r.sink_table == self.table_name]
        rows = table.scan(selected_fields=("stream", "offset")).to_arrow()
        known = {s.snapshot_id for s in table.metadata.snapshots}
        return check_table(self.table_name, pipeline, ranges, self.commits(table), rows, known)


def _local(location: str) -> str:
    return str(filesystems.local_path(location)) if filesystems.scheme(location) in ("", "file") else location


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
