"""The rules a pipeline's settings must meet, refused before anything is claimed: which source it
names (:func:`source_problem`), which sink it writes to (:func:`sink_problem`) and whether that
sink's library is installed where the batch runs (:func:`sink_library_problem`).

One room below ``config``, ``position`` and ``sinks``, so each asks the same rule without importing
the others (``BatchConfig``, the operators, the Dagster assets and the CLI all ask here).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from streamledger import fs as filesystems
from streamledger.errors import extra_problem
from streamledger.ledger.types import pipeline_name_problem
from streamledger.paths import name_problem

__all__ = [
    "FORMATS", "INITIAL_POSITIONS", "ON_DATA_LOSS", "SINKS", "absolute_location", "catalog_problem",
    "default_iceberg_table", "fmt_problem", "initial_position_problem", "on_data_loss_problem",
    "placement_problem", "sink_library_problem", "sink_problem", "source_problem", "splits_problem",
]

SINKS = ("directory", "iceberg", "delta")
FORMATS = ("parquet", "orc", "json")
INITIAL_POSITIONS = ("first", "tail", "interval_start")
ON_DATA_LOSS = ("fail", "record")

_IDENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*\.[A-Za-z0-9_][A-Za-z0-9_-]*$")


def source_problem(pipeline: str, stream: str | None, super_stream: str | None,
                   url: str | None = None, *, keywords: bool = False) -> str | None:
    """Why these cannot name a pipeline's source, or None: the one place the rule is written.
    ``keywords`` names the arguments as Python keywords (``stream=``), as operators are called."""
    problem = pipeline_name_problem(pipeline)
    if problem is not None:
        return problem
    if (stream is None) == (super_stream is None):
        eq = "=" if keywords else ""
        return f"pipeline {pipeline!r}: give exactly one of stream{eq} or super_stream{eq}"
    for what, given in (("stream", stream), ("super stream", super_stream)):
        problem = None if given is None else name_problem(what, given)
        if problem is not None:
            return problem
    if super_stream is not None and url is not None:
        from streamledger.sources import find_kind

        kind = find_kind(url)  # None: an unknown scheme, reported when the log is connected
        if kind is not None and not kind.super_streams:
            return (f"pipeline {pipeline!r}: super_stream is only available for rabbitmq sources; a "
                    f"{kind.name} URL names one {kind.unit}: give stream=")
    return None



def absolute_location(location: str) -> str:
    """Where a plain path names, made absolute against the working directory when the spec is built
    (what the ledger records and every later retry, publish and audit reads must name one place from
    any directory); a URI (``file://`` and the stores') and an empty location (refused by
    :func:`placement_problem`) unchanged."""
    if not isinstance(location, str) or not location.strip() or filesystems.scheme(location):
        return location
    return os.path.abspath(location)


def _filesystem(location: str) -> str:
    """Which file system a location is on, as far as the batch moves files between two locations:
    local; an object store (every bucket of one store is one file system to pyarrow: a Delta table in
    another bucket than the root is published by copies, as any object store publish is); a named HDFS
    cluster."""
    kind = filesystems.scheme(location)
    if kind in ("", "file"):
        return "local"
    if kind in ("hdfs", "viewfs"):
        return f"{kind}://{urlsplit(location).netloc}"
    return {"s3a": "s3", "s3n": "s3", "gcs": "gs"}.get(kind, kind)


def placement_problem(output_root: str, sink: str, table: str | None) -> str | None:
    """Why a pipeline's outputs cannot be placed there, or None: an empty output root (it would write
    into the working directory), and a Delta table location on another file system than the root
    (the batch stages, publishes and checks under the root's file system only)."""
    if not output_root.strip():
        return "output root must not be empty (a directory or store URI the batch writes under)"
    if sink != "delta" or table is None or not table.strip():
        return None
    if _filesystem(table) != _filesystem(output_root):
        return (f"delta table {filesystems.redact(table)} is on another file system than the output root "
                f"{filesystems.redact(output_root)}; give a location on the root's (e.g. under it)")
    return None


def default_iceberg_table(pipeline: str) -> str:
    """``streamledger.<pipeline>`` with every character outside ``[A-Za-z0-9_]`` as ``_``."""
    return "streamledger." + re.sub(r"[^A-Za-z0-9_]", "_", pipeline)


SINK_LIBRARIES = {"iceberg": "pyiceberg", "delta": "deltalake"}
"""The optional library each table sink imports (its extra: :data:`streamledger.errors.EXTRAS`)."""


def sink_library_problem(sink: str) -> str | None:
    """``the iceberg sink: pyiceberg is not installed: pip install "streamledger[iceberg]"`` when the
    sink's library cannot be imported here, else None. Asked where a batch is about to run (the sink
    is built, ``batch run`` reads its options, Dagster definitions load), never where a DAG is only
    parsed: Airflow's DAG processor need not have the workers' extras. (The output store's library,
    boto3 for S3 through pyarrow, depends on the runner: ``fs.create_library_problem``.)"""
    library = SINK_LIBRARIES.get(sink)
    problem = extra_problem(library) if library else None
    return None if problem is None else f"the {sink} sink: {problem}"


def sink_problem(sink: str, table: str | None, catalog: Mapping[str, str] | None, fmt: str) -> str | None:
    """Why a sink's settings cannot work, or None (the one rule: config, CLI and operators ask it)."""
    if sink not in SINKS:
        return f"sink must be one of {', '.join(SINKS)}, got {sink!r}"
    if sink == "directory":
        if table is not None or catalog:
            return "table and catalog are for the iceberg and delta sinks; the directory sink takes neither"
        return None
    if fmt != "parquet":
        return (f"the {sink} sink adds the job's Parquet files to the table: fmt must be 'parquet', "
                f"got {fmt!r}")
    if sink == "iceberg":
        if table is not None and not _IDENT.match(table):
            return f"iceberg table {table!r} is not 'namespace.name'"
        if catalog is not None and not isinstance(catalog, Mapping):
            return "catalog must be a mapping of pyiceberg catalog properties"
        return iceberg_catalog_problem(catalog)
    if catalog:
        return f"the delta sink takes a table location, not a catalog (table {table!r})"
    if table is not None and not table.strip():
        return "delta table location must not be empty"
    where = filesystems.location_problem(table) if table is not None else None
    return None if where is None or table is None else f"delta table {filesystems.redact(table)}: {where}"


def iceberg_catalog_problem(catalog: Mapping[str, str] | None) -> str | None:
    """Why pyiceberg cannot load a catalog of this ``type``, or None: its known types (pyiceberg's own
    list, when it is installed; without it the batch names the missing extra) or a ``py-catalog-impl``."""
    kind = (catalog or {}).get("type")
    if kind is None:
        return None
    if "py-catalog-impl" in (catalog or {}):
        return "iceberg catalog: set either type or py-catalog-impl, not both"
    from importlib.util import find_spec

    if find_spec("pyiceberg") is None:
        return None
    from pyiceberg.catalog import CatalogType

    known = [t.value for t in CatalogType]
    if str(kind).lower() not in known:
        return f"iceberg catalog type {kind!r} is not one pyiceberg loads ({', '.join(known)})"
    return None


def initial_position_problem(position: object) -> str | None:
    """Why ``position`` cannot say where a partition without history starts, or None."""
    if isinstance(position, int):
        return None if position >= 0 else "initial offset must be >= 0"
    if position in INITIAL_POSITIONS:
        return None
    return f"initial_position {position!r} is not 'first', 'tail', 'interval_start' or an offset"


def fmt_problem(fmt: object) -> str | None:
    """Why ``fmt`` is not a file format the job writes, or None."""
    return None if fmt in FORMATS else f"fmt {fmt!r} is not parquet, orc or json"


def splits_problem(splits: int) -> str | None:
    """Why ``splits`` (Spark partitions per range) cannot work, or None."""
    return None if splits >= 1 else f"splits must be >= 1, got {splits}"


def on_data_loss_problem(value: object) -> str | None:
    """Why ``value`` is not an answer to "retention removed offsets the pipeline has not read", or None."""
    return None if value in ON_DATA_LOSS else f"on_data_loss must be 'fail' or 'record', got {value!r}"


def catalog_problem(sink: str, given: str, *, iceberg: str = "the iceberg sink") -> str | None:
    """A catalog is for the iceberg sink only: why ``given`` (the front door's catalog setting, with its
    verb: "catalog_conn_id is") cannot be used with ``sink``, or None. ``iceberg`` names that sink as
    the front door spells it."""
    return None if sink == "iceberg" else f"{given} for {iceberg}, not {sink!r}"
