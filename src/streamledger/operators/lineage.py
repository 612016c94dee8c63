"""OpenLineage for a batch: the stream partitions it read (with the exact offset range as a facet) and
the range directories it wrote.

Naming follows OpenLineage's conventions: an input is ``namespace = rabbitmq://host:port/vhost`` or
``mewbase://host:port`` (the ledger's credential-free broker identity), ``name = <stream>``; an output
is ``namespace = file``
(or ``<scheme>://<authority>`` for a URI root such as ``s3a://bucket``) and ``name`` = the range
directory's path. The input facet ``streamledger_range`` holds the pipeline, the half-open range
``[start, end)``, the records, the first/last offsets seen, the ledger's range id and the stream's
epoch, so a lineage consumer can tell which offsets of the stream produced which directory; a stream
the batch read in several ranges (a pinned retry's pieces) is one input per range. Only imported
when the OpenLineage provider asks.

With a table sink the output is the table, named as OpenLineage's Spark integration names Iceberg and
Delta tables: by the table's *location* (``file`` + path, ``s3://bucket`` + path...), which is what
another engine writing or reading the same table reports too; an Iceberg table also carries a
``symlinks`` facet (type ``TABLE``) with its catalog name: ``namespace`` = the catalog's address
without credentials (its ``uri``, else its ``warehouse``), ``name`` = ``namespace.table``. The
``version`` facet holds the snapshot id (Iceberg) or the table version (Delta) the batch left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import attr
from airflow.providers.common.compat.openlineage.facet import (
    Identifier,
    InputDataset,
    OutputDataset,
    OutputStatisticsOutputDatasetFacet,
    SymlinksDatasetFacet,
)
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.generated.base import InputDatasetFacet
from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet

from streamledger.batch import BatchResult
from streamledger.batch.lineage import lineage_of

RANGE_FACET = "streamledger_range"


@attr.define
class StreamRangeInputDatasetFacet(InputDatasetFacet):
    """The offsets of one stream a batch read: ``[start, end)``, half-open (field names in camelCase,
    as OpenLineage facets spell them)."""

    pipeline: str
    start: int
    end: int
    records: int
    status: str
    superStream: str | None = None
    firstOffset: int | None = None
    lastOffset: int | None = None
    rangeId: int | None = None
    epoch: int = 0

    _additional_skip_redact: ClassVar[list[str]] = [
        "pipeline", "start", "end", "records", "status", "superStream", "firstOffset", "lastOffset",
        "rangeId", "epoch",
    ]

    @staticmethod
    def _get_schema() -> str:
        return "urn:streamledger:openlineage:StreamRangeInputDatasetFacet:1-1-0"


def output_dataset_name(path: str) -> tuple[str, str]:
    """``(namespace, name)`` of a range directory: ``("file", "/abs/dir")`` or ``("s3://b", "/dir")``."""
    parts = urlsplit(path)
    if parts.scheme and parts.netloc:
        scheme = "s3" if parts.scheme in ("s3a", "s3n") else parts.scheme
        return f"{scheme}://{parts.netloc}", parts.path or "/"
    return "file", parts.path if parts.scheme == "file" else path


def catalog_namespace(props: Mapping[str, str]) -> str:
    """An Iceberg catalog's address for lineage: its ``uri`` (else ``warehouse``) with no user info,
    query or fragment, so no credential reaches a lineage event."""
    where = props.get("uri") or props.get("warehouse") or props.get("type") or "iceberg"
    parts = urlsplit(where)
    if not parts.scheme:
        return where
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def table_dataset(table: Mapping[str, Any], records: int, catalog: Mapping[str, str]) -> Any:
    """The output dataset of a table sink (see the module docstring)."""
    location = str(table.get("location") or table.get("identifier"))
    namespace, name = output_dataset_name(location)
    name = name.rstrip("/") or "/"  # delta-rs reports its table URI with a trailing slash
    facets: dict[str, Any] = {}
    version = table.get("snapshot_id", table.get("version"))
    if version is not None:
        facets["version"] = DatasetVersionDatasetFacet(datasetVersion=str(version))
    if table.get("format") == "iceberg":
        facets["symlinks"] = SymlinksDatasetFacet(identifiers=[Identifier(
            namespace=catalog_namespace(catalog), name=str(table["identifier"]), type="TABLE")])
    return OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets={
        "outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=records)})


def batch_lineage(result: BatchResult, *, table: Mapping[str, Any] | None = None,
                  catalog: Mapping[str, str] | None = None) -> OperatorLineage:  # type: ignore[type-arg]
    """Inputs: every range the batch planned (empty ones too: the run looked at them), one per range
    even when a stream has several (:func:`~streamledger.batch.lineage.lineage_of`). Outputs: every
    range directory written, with its row count; with a table sink (``table``: the sink's
    ``describe()``; ``catalog``: the Iceberg catalog's properties, None for the default), the table
    instead, with the batch's row count."""
    lineage = lineage_of(result)
    inputs: list[Any] = []
    outputs: list[Any] = []
    for piece in lineage.pieces:
        facet = StreamRangeInputDatasetFacet(
            pipeline=lineage.pipeline, start=piece.start, end=piece.end, records=piece.records,
            status=piece.status, superStream=lineage.super_stream, firstOffset=piece.first_offset,
            lastOffset=piece.last_offset, rangeId=piece.range_id, epoch=piece.epoch,
        )
        inputs.append(InputDataset(namespace=lineage.broker, name=piece.stream,
                                   inputFacets={RANGE_FACET: facet}))
        if piece.output and table is None:
            namespace, name = output_dataset_name(piece.output)
            outputs.append(OutputDataset(
                namespace=namespace, name=name,
                outputFacets={"outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=piece.records)},
            ))
    if table is not None:
        outputs.append(table_dataset(table, lineage.records, catalog or {}))
    return OperatorLineage(inputs=inputs, outputs=outputs)
