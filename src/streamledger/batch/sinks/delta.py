"""The Delta sink: one Delta commit per batch adding the job's Parquet files (delta-rs).

The table lives at ``table`` (a path or URI; default ``<output_root>/<pipeline>``, the pipeline's
name encoded as every sink encodes it: :func:`streamledger.batch.plan.pipeline_dir`), and each
range's files are published under it (``<table>/<broker>/<stream>/<start>-<end>/``,
:func:`streamledger.batch.plan.range_dir`), since a Delta add action names a file relative to the
table root. The table is created on first use with the job's
schema, not partitioned (every file holds one stream; the add actions carry per-file
``stream``/``offset`` min/max statistics, so readers skip files by stream anyway).

Every commit carries an app transaction ``streamledger:<pipeline>`` whose version only grows
(the table's last version for it + 1) and commit info naming the pipeline, the attempt and the
ranges. It is made with no commit retries: a concurrent commit makes ours fail and the batch looks
for its ranges again before it retries, so a repeated commit is a no-op.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from streamledger import fs as filesystems
from streamledger.batch import plan, sinks
from streamledger.batch.config import BatchError
from streamledger.batch.sinks import (
    FILE_COLUMN,
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
from streamledger.transform import LINEAGE_COLUMNS

log = logging.getLogger(__name__)


def app_id(pipeline: str) -> str:
    """The Delta app transaction id of a pipeline."""
    return f"streamledger:{pipeline}"


class DeltaSink(TableSink):
    name = "delta"
    log = log

    def __init__(self, *, pipeline: str, output_root: str, table: str | None,
                 files_schema: Any = None, transformed: bool = False) -> None:
        self.pipeline, self.output_root, self.files_schema = pipeline, output_root, files_schema
        self.transformed = transformed
        self.location = (table or plan.pipeline_dir(output_root, pipeline)).rstrip("/")
        self.table_name = f"delta:{self.location}"
        self.label = f"delta table {self.location}"
        self.storage = storage_options(self.location)

    def range_dir(self, broker: str, stream: str, start: int, end: int, epoch: int) -> str:
        return plan.range_dir(self.location, broker, stream, start, end, epoch=epoch)

    # -- the table --------------------------------------------------------------------------------

    def _open(self, schema_of: str | None) -> Any:
        from deltalake import DeltaTable

        try:
            if DeltaTable.is_deltatable(self.location, self.storage):
                return DeltaTable(self.location, storage_options=self.storage)
        except Exception as exc:
            raise BatchError(f"delta table {self.location}: cannot be opened: {line(exc)}") from exc
        if schema_of is None:
            return None
        self._refuse_foreign_log()
        import pyarrow.parquet as pq

        schema = with_table_columns(pq.read_schema(_local(schema_of)).remove_metadata())
        try:
            DeltaTable.create(self.location, schema, mode="ignore", name=self.pipeline[:255],
                              storage_options=self.storage)
            log.info("created delta table %s", self.location)
        except Exception as exc:  # a concurrent create: open what the winner made
            if not DeltaTable.is_deltatable(self.location, self.storage):
                raise BatchError(f"delta table {self.location}: cannot be created: {line(exc)}") from exc
        return DeltaTable(self.location, storage_options=self.storage)

    def _refuse_foreign_log(self) -> None:
        """No Delta table here: refuse a ``_delta_log`` that is not one's, asking the location's own
        file system (the local one only for a path or ``file://``)."""
        log_dir = filesystems.join(self.location, "_delta_log")
        try:
            there = filesystems.filesystem_for(self.location).exists(log_dir)
        except Exception as exc:  # an object store's credentials, network, an unknown bucket
            raise BatchError(f"delta table {self.location}: cannot be reached: {line(exc)}") from exc
        if there:
            raise BatchError(f"delta table {self.location}: its _delta_log is not a Delta table's log")

    def _history(self, dt: Any) -> list[dict[str, Any]]:
        """The table's commit infos, newest first, each with the version its commit made.

        delta-rs' ``history()`` lists the log's newest commit infos but numbers them down from the
        version ``dt`` was loaded at: a commit another writer made since the load shifts every
        number by one (a range recorded at the version before its own). So a listing counts only
        if the log still ends at that version afterwards; else the table is loaded again (``dt``
        itself is left as it is: a commit is made on the state the sink looked at)."""
        from deltalake import DeltaTable

        for _ in range(sinks.COMMIT_ATTEMPTS):
            at = dt.version()
            entries: list[dict[str, Any]] = dt.history()
            if not self._has_version(at + 1):
                return entries
            dt = DeltaTable(self.location)
        raise BatchError(f"delta table {self.location}: its log moved on while it was read, "
                         f"{sinks.COMMIT_ATTEMPTS} times; try again")

    def _has_version(self, version: int) -> bool:
        """Whether the log holds ``version`` (its commit file; the newest is never cleaned up)."""
        name = filesystems.join(self.location, "_delta_log", f"{version:020d}.json")
        try:
            return bool(filesystems.filesystem_for(self.location).exists(name))
        except Exception as exc:
            raise BatchError(f"delta table {self.location}: its log cannot be read: {line(exc)}") from exc

    def commits(self, dt: Any) -> list[TableCommit]:
        """The pipeline's commits in the table's log, newest first."""
        out: list[TableCommit] = []
        for info in self._history(dt):
            found = parse_summary(info, self.pipeline, int(info.get("version", -1)))
            if found is not None:
                out.append(found)
        return out

    def _add_action(self, path: str) -> Any:
        import pyarrow.parquet as pq
        from deltalake.transaction import AddAction

        local = _local(path)
        meta = pq.ParquetFile(local).metadata
        stats: dict[str, Any] = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}}
        names = meta.schema.names
        for col in ("stream", "offset"):
            if col not in names:
                continue
            i = names.index(col)
            lows, highs = [], []
            for g in range(meta.num_row_groups):
                st = meta.row_group(g).column(i).statistics
                if st is not None and st.has_min_max:
                    lows.append(st.min)
                    highs.append(st.max)
            if lows and len(lows) == meta.num_row_groups:
                stats["minValues"][col], stats["maxValues"][col] = min(lows), max(highs)
        rel = path[len(self.location):].lstrip("/")
        if filesystems.scheme(path) in ("", "file"):
            st = os.stat(local)
            size, mtime = st.st_size, int(st.st_mtime * 1000)
        else:  # pragma: no cover - object stores
            from pyarrow import fs as pafs

            afs, p = pafs.FileSystem.from_uri(path)
            fi = afs.get_file_info(p)
            size, mtime = fi.size, int(fi.mtime.timestamp() * 1000) if fi.mtime else 0
        return AddAction(quote(rel, safe="/"), size, {}, mtime, True, json.dumps(stats, default=str))

    # -- the sink ---------------------------------------------------------------------------------

    def check(self) -> None:
        """The location is a Delta table with the job's columns, or nothing yet (created on first
        use), or a directory holding only this sink's range directories (a batch that placed its
        files died before the table's first commit). A file, a ``_delta_log`` that is not a Delta
        log, or a directory of someone's plain data files is refused; so is an object store's
        location pyarrow cannot reach, as the output root is (one metadata call; delta-rs would
        retry an unreachable store for minutes)."""
        try:
            filesystems.check_location(self.location, what="delta table")
        except filesystems.LocationError as exc:
            raise BatchError(str(exc)) from None
        if filesystems.scheme(self.location) in ("", "file"):
            local = filesystems.local_path(self.location)
            if local.exists() and not local.is_dir():
                raise BatchError(f"delta table {self.location}: the location is a file, not a Delta table")
            if local.is_dir() and not (local / "_delta_log").exists():
                plain = sorted(p.name for p in local.iterdir()
                               if not p.name.startswith(("_", ".")) and (p.is_file() or "=" in p.name))
                if plain:
                    raise BatchError(f"delta table {self.location}: not a Delta table (no _delta_log) but a "
                                     f"directory of other files ({', '.join(plain[:3])}"
                                     f"{', ...' if len(plain) > 3 else ''})")
        dt = self._open(None)
        if dt is None:
            self._refuse_foreign_log()
            return
        problem = schema_problem(_arrow_schema(dt), self.files_schema, transformed=self.transformed)
        if problem is not None:
            raise BatchError(f"delta table {self.location}: {problem}")

    def _check_files(self, files: dict[int, list[str]]) -> None:
        """A Delta add action names a file relative to the table root: every file must be under it."""
        for rid, names in files.items():
            outside = [f for f in names if not f.startswith(self.location + "/")]
            if outside:
                raise BatchError(f"delta table {self.location}: range {rid}'s files are not under the table "
                                 f"(first: {outside[0]})")

    def _commit(self, dt: Any, batch: SinkBatch, todo: list[SinkRange], files: dict[int, list[str]],
                what: str) -> None:
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError

        schema = dt.schema()
        problem = schema_problem(_arrow_schema(dt), self.files_schema, transformed=self.transformed)
        if problem is not None:  # a table made or changed by someone else since the check
            raise BatchError(f"delta table {self.location}: {problem}; nothing of {what} was added")
        version = (dt.transaction_version(app_id(self.pipeline)) or 0) + 1
        props = CommitProperties(custom_metadata=summary(batch, todo), max_commit_retries=0,
                                 app_transactions=[Transaction(app_id(self.pipeline), version)])
        actions = [self._add_action(p) for r in todo for p in files[r.range.id]]
        try:
            dt.create_write_transaction(actions, "append", schema, commit_properties=props)
        except CommitFailedError as exc:
            raise LostCommit(line(exc)) from exc
        except Exception as exc:
            raise BatchError(f"delta table {self.location}: the job's files for {what} cannot be added: "
                             f"{line(exc)}") from exc
        log.info("delta table %s: a commit (app transaction %s) adds %d file(s) of %s", self.location,
                 version, len(actions), what)

    def describe(self) -> dict[str, Any] | None:
        dt = self._open(None)
        return {"format": "delta", "identifier": self.location,
                "location": dt.table_uri if dt is not None else self.location,
                "version": dt.version() if dt is not None else None}

    def _rows(self, dt: Any, without: frozenset[str] = frozenset()) -> Any:
        columns = row_columns(set(_arrow_schema(dt).names))
        import pyarrow.dataset as ds

        # the table's own dataset (delta-rs' file system, its credentials), less the files gone
        dataset = dt.to_pyarrow_dataset()
        if without:
            gone = {unquote(u) for u in without}
            kept = [f for f in dataset.get_fragments()
                    if not any(g.endswith("/" + unquote(f.path)) for g in gone)]
            dataset = ds.FileSystemDataset(kept, dataset.schema, dataset.format, dataset.filesystem)
        if LINEAGE_COLUMNS[0] not in columns:
            return dataset.to_table(columns=columns)
        # a transform's rows: which file each is in (check_table), as a location: the dataset's paths
        # are relative to the table's root
        import pyarrow as pa

        got = dataset.to_table(columns=[*columns, FILE_COLUMN])
        root = self.location.rstrip("/")
        located = [p if "://" in p or p.startswith("/") else f"{root}/{unquote(p)}"
                   for p in got[FILE_COLUMN].to_pylist()]
        return got.set_column(got.schema.get_field_index(FILE_COLUMN), FILE_COLUMN, pa.array(located))

    def _missing_files(self, dt: Any) -> list[str] | None:
        """The add actions' files that are not there (as URIs: a local path as ``file://``), asked
        of the location's own file system."""
        fs = filesystems.filesystem_for(self.location)
        files = [u if "://" in u else Path(u).as_uri() for u in dt.file_uris()]
        return [u for u in files if not fs.exists(u)]

    def _evolve(self, dt: Any) -> bool:
        from deltalake.schema import Field

        current = _arrow_schema(dt)
        missing = [f for f in table_fields() if f.name not in set(current.names)]
        if self.transformed and self.files_schema is not None:
            missing += new_columns(current, self.files_schema)
        if not missing:
            return False
        try:
            dt.alter.add_columns([Field.from_arrow(f) for f in missing])
        except Exception as exc:
            raise BatchError(f"delta table {self.location}: cannot add the columns "
                             f"{', '.join(f.name for f in missing)}: {line(exc)}") from exc
        log.info("delta table %s: added the columns %s", self.location, ", ".join(f.name for f in missing))
        return True

    def _known_commits(self, dt: Any) -> set[int]:
        versions = [int(c["version"]) for c in self._history(dt)]
        return set(range(min(versions, default=0), max(versions, default=dt.version()) + 1))


def storage_options(location: str) -> dict[str, str] | None:
    """What delta-rs needs beyond the ``AWS_*`` environment it reads itself: leave to use plain
    http when the environment's S3 endpoint is ``http://`` (pyarrow, which writes the job's files,
    follows such an endpoint as given). Never a key: delta-rs takes those from the environment.
    Nothing about commits: delta-rs commits to S3 with a conditional put (``If-None-Match``), so
    neither a locking provider nor ``AWS_S3_ALLOW_UNSAFE_RENAME`` is wanted."""
    access = filesystems.StoreAccess.from_environment(location)
    return {"AWS_ALLOW_HTTP": "true"} if access is not None and access.plain_http else None


def _arrow_schema(dt: Any) -> Any:
    import pyarrow as pa

    return pa.schema(dt.schema().to_arrow())


def _local(location: str) -> str:
    return str(filesystems.local_path(location)) if filesystems.scheme(location) in ("", "file") else location
