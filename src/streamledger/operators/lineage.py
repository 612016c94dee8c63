"""OpenLineage for a batch: the stream partitions it read (with the exact offset range as a facet) and
the range directories it wrote.

Naming follows OpenLineage's conventions: an input is ``namespace = rabbitmq://host:port/vhost`` or
``mewbase://host:port`` (the ledger's credential-free broker identity), ``name = <stream>``; an output
is ``namespace = file``
(or ``<scheme>://<authority>`` for a URI root such as ``s3a://bucket``) and ``name`` = the range
directory's path. The input facet ``streamledger_range`` holds the pipeline, the half-open range
``[start, end)``, the records and the first/last offsets seen, so a lineage consumer can tell which
offsets of the stream produced which directory. Only imported when the OpenLineage provider asks.
"""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import urlsplit

import attr
from airflow.providers.common.compat.openlineage.facet import (
    InputDataset,
    OutputDataset,
    OutputStatisticsOutputDatasetFacet,
)
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.generated.base import InputDatasetFacet

from streamledger.batch import BatchResult

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

    _additional_skip_redact: ClassVar[list[str]] = [
        "pipeline", "start", "end", "records", "status", "superStream", "firstOffset", "lastOffset",
    ]

    @staticmethod
    def _get_schema() -> str:
        return "urn:streamledger:openlineage:StreamRangeInputDatasetFacet:1-0-0"


def output_dataset_name(path: str) -> tuple[str, str]:
    """``(namespace, name)`` of a range directory: ``("file", "/abs/dir")`` or ``("s3://b", "/dir")``."""
    parts = urlsplit(path)
    if parts.scheme and parts.netloc:
        scheme = "s3" if parts.scheme in ("s3a", "s3n") else parts.scheme
        return f"{scheme}://{parts.netloc}", parts.path or "/"
    return "file", parts.path if parts.scheme == "file" else path


def batch_lineage(result: BatchResult) -> OperatorLineage:  # type: ignore[type-arg]
    """Inputs: every partition the batch planned (empty ranges too: the run looked at them).
    Outputs: every range directory written, with its row count."""
    inputs: list[Any] = []
    outputs: list[Any] = []
    for part in result.partitions:
        facet = StreamRangeInputDatasetFacet(
            pipeline=result.pipeline, start=part.start, end=part.end, records=part.records,
            status=part.status, superStream=result.super_stream, firstOffset=part.first_offset,
            lastOffset=part.last_offset,
        )
        inputs.append(InputDataset(namespace=result.broker, name=part.stream,
                                   inputFacets={RANGE_FACET: facet}))
        if part.output:
            namespace, name = output_dataset_name(part.output)
            outputs.append(OutputDataset(
                namespace=namespace, name=name,
                outputFacets={"outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=part.records)},
            ))
    return OperatorLineage(inputs=inputs, outputs=outputs)
