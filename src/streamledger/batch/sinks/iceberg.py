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
from typing import Any

from streamledger import fs as filesystems
from streamledger.batch import plan, sinks
from streamledger.batch.config import BatchError
from streamledger.batch.sinks import (
    SinkBatch,
    SinkRange,
    TableCommit,
    line,
    new_columns,
    parse_summary,
    row_columns,
    schema_problem,
    summary,
    table_fields,
    with_table_columns,
)
from streamledger.batch.sinks.table import LostCommit, TableSink
from streamledger.redaction import scrub, secrets_of
from streamledger.transform import LINEAGE_COLUMNS

log = logging.getLogger(__name__)

CATALOG_NAME = "streamledger"
def _uri(location: str) -> str:
    """pyiceberg wants URIs: a plain path becomes ``file:///abs``."""
    if filesystems.scheme(location):
        return location
    return Path(location).resolve().as_uri()


def catalog_properties(catalog: Mapping[str, str] | None, *, ledger_url: str,
                       output_root: str) -> dict[str, str]:
    """The catalog's properties: the given ones, else a SQL catalog in the ledger's database whose
    file IO reaches S3 as the job's tasks do (:func:`s3_file_io`)."""
    if catalog:
        return dict(catalog)
    # pool_pre_ping: a connection the database dropped (a restart) is replaced, not failed on
    return {"type": "sql", "uri": ledger_url, "warehouse": _uri(filesystems.join(output_root, "_iceberg")),
            "pool_pre_ping": "true", **s3_file_io()}


def s3_file_io() -> dict[str, str]:
    """The S3 settings of the environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``) as pyiceberg file IO
    properties: its ``PyArrowFileIO`` builds its S3 client from its properties, not from these
    variables, and without a region asks AWS itself where the bucket is. Never the keys: its client
    finds those in the environment as pyarrow's does, so they stay out of the properties (which
    reach lineage and logs)."""
    access = filesystems.StoreAccess.s3_environment()
    if access is None:
        return {}
    found = {"s3.endpoint": access.endpoint, "s3.region": access.region}
    return {k: v for k, v in found.items() if v}


def load_catalog(props: Mapping[str, str]) -> Any:
    from pyiceberg.catalog import load_catalog as _load

    props = dict(props)
    name = props.pop("name", CATALOG_NAME)
    return _load(name, **props)


class IcebergSink(TableSink):
    name = "iceberg"
    log = log

    def __init__(self, *, pipeline: str, output_root: str, table: str, catalog: Mapping[str, str] | None,
                 ledger_url: str, files_schema: Any = None, transformed: bool = False) -> None:
        self.pipeline, self.output_root, self.identifier = pipeline, output_root, table
        self.files_schema = files_schema  # the job's files' schema (LogKind.files_schema; None: RabbitMQ's)
        self.transformed = transformed
        self.props = catalog_properties(catalog, ledger_url=ledger_url, output_root=output_root)
        self.table_name = f"iceberg:{table}"
        self.label = f"iceberg table {table}"
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
                    # pyiceberg's errors may quote every property: its secrets never reach the line,
                    # nor (through the cause) a traceback
                    said = line(exc)
                    shown = scrub(said, secrets_of(self.props))
                    raise BatchError(f"iceberg table {self.identifier}: the catalog cannot be reached: "
                                     f"{shown}") from (exc if shown == said else None)
        return self._catalog

    def range_dir(self, broker: str, stream: str, start: int, end: int, epoch: int) -> str:
        # The table references the files where the directory sink would publish them.
        return plan.output_dir(self.output_root, self.pipeline, broker, stream, start, end, epoch=epoch)

    # -- the table --------------------------------------------------------------------------------

    def _open(self, schema_of: str | None) -> Any:
        """The table; created (partitioned by stream, or a transform's rows by the stream of their
        lineage) from the first data file's schema if missing."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            if schema_of is None:
                return None
        except BatchError:
            raise
        except Exception as exc:
            raise BatchError(f"iceberg table {self.identifier}: cannot be loaded: {line(exc)}") from exc
        import pyarrow.parquet as pq

        schema = with_table_columns(pq.read_schema(_local(schema_of)).remove_metadata())
        namespace = self.identifier.split(".", 1)[0]
        try:
            self._create_namespace(namespace)
            by = LINEAGE_COLUMNS[0] if LINEAGE_COLUMNS[0] in schema.names else "stream"  # a transform's rows
            with self.catalog.create_table_transaction(self.identifier, schema=schema) as tx, \
                    tx.update_spec() as spec:
                spec.add_identity(by)
            log.info("created iceberg table %s (partitioned by %s)", self.identifier, by)
        except Exception as exc:
            # Another batch created it meanwhile: the catalog's insert says TableAlreadyExistsError,
            # the create transaction's assert-create a CommitFailedException. Either way its table
            # is there now; anything else is this create's own error.
            try:
                table = self.catalog.load_table(self.identifier)
            except Exception:
                raise BatchError(f"iceberg table {self.identifier}: cannot be created: "
                                 f"{line(exc)}") from exc
            log.info("iceberg table %s was created by another batch meanwhile", self.identifier)
            return table
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

    # -- the sink ---------------------------------------------------------------------------------

    def check(self) -> None:
        """The catalog answers and the table, if it exists, has the job's columns."""
        table = self._open(None)
        if table is None:
            return  # created on first use, with the job's schema
        problem = schema_problem(table.schema().as_arrow(), self.files_schema, transformed=self.transformed)
        if problem is not None:
            raise BatchError(f"iceberg table {self.identifier}: {problem}")

    def _commit(self, table: Any, batch: SinkBatch, todo: list[SinkRange], files: dict[int, list[str]],
                what: str) -> None:
        from pyiceberg.exceptions import CommitFailedException

        paths = [_uri(p) for r in todo for p in files[r.range.id]]
        # No blind rebase on a concurrent commit (in memory only: the table's properties stay).
        table.metadata = table.metadata.model_copy(update={"properties": {
            **table.metadata.properties, "commit.retry.num-retries": "0"}})
        try:
            table.add_files(paths, snapshot_properties=summary(batch, todo), check_duplicate_files=False)
        except CommitFailedException as exc:
            raise LostCommit(line(exc)) from exc
        except (ValueError, TypeError) as exc:  # pyiceberg's schema / file checks
            raise BatchError(f"iceberg table {self.identifier}: the job's files for {what} cannot be "
                             f"added: {line(exc)}") from exc
        except Exception as exc:  # the catalog's database or the store gone: one line, the retry looks again
            said = scrub(line(getattr(exc, "orig", None) or exc), secrets_of(self.props))
            raise BatchError(f"iceberg table {self.identifier}: the commit of {what} failed: "
                             f"{said}") from None
        log.info("iceberg table %s: snapshot %s appends %d file(s) of %s", self.identifier,
                 table.current_snapshot().snapshot_id, len(paths), what)

    def describe(self) -> dict[str, Any] | None:
        table = self._open(None)
        if table is None:
            return {"format": "iceberg", "identifier": self.identifier, "location": None,
                    "metadata_location": None, "snapshot_id": None}
        snap = table.current_snapshot()
        return {"format": "iceberg", "identifier": self.identifier, "location": table.location(),
                "metadata_location": table.metadata_location,
                "snapshot_id": snap.snapshot_id if snap is not None else None}

    def _rows(self, table: Any, without: frozenset[str] = frozenset()) -> Any:
        have = set(table.schema().as_arrow().names)
        scan = table.scan(selected_fields=tuple(row_columns(have)))
        if not without:
            return scan.to_arrow()
        from pyiceberg.io.pyarrow import ArrowScan

        tasks = [t for t in scan.plan_files() if t.file.file_path not in without]
        return ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter,
                         scan.case_sensitive).to_table(tasks)

    def _missing_files(self, table: Any) -> list[str] | None:
        return [t.file.file_path for t in table.scan().plan_files()
                if not table.io.new_input(t.file.file_path).exists()]

    def _evolve(self, table: Any) -> bool:
        import pyarrow as pa

        current = table.schema().as_arrow()
        missing = [f for f in table_fields() if f.name not in set(current.names)]
        if self.transformed and self.files_schema is not None:
            missing += new_columns(current, self.files_schema)
        if not missing:
            return False
        try:
            with table.update_schema() as update:
                update.union_by_name(pa.schema(missing))
        except Exception as exc:
            raise BatchError(f"iceberg table {self.identifier}: cannot add the columns "
                             f"{', '.join(f.name for f in missing)}: {line(exc)}") from exc
        log.info("iceberg table %s: added the columns %s", self.identifier,
                 ", ".join(f.name for f in missing))
        return True

    def _known_commits(self, table: Any) -> set[int]:
        return {s.snapshot_id for s in table.metadata.snapshots}


def _local(location: str) -> str:
    return str(filesystems.local_path(location)) if filesystems.scheme(location) in ("", "file") else location
