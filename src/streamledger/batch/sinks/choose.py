"""Which sink a batch writes to: the one place that names the Delta and Iceberg sinks, above them,
so the package's shared vocabulary never imports a sink (no circle)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamledger.batch.rules import sink_library_problem
from streamledger.batch.sinks import DirectorySink, Sink, default_iceberg_table
from streamledger.errors import MissingExtra

if TYPE_CHECKING:
    from streamledger.batch.config import BatchConfig
    from streamledger.ledger import Ledger

__all__ = ["make_sink"]


def make_sink(config: BatchConfig, ledger: Ledger, output_schema: Any = None) -> Sink:
    """The sink a batch's configuration names (the table sinks import their library here; a missing
    one is a :class:`~streamledger.errors.MissingExtra`, a ``BatchError`` naming its extra, raised
    before the batch claims anything).
    ``output_schema``: with a transform, the pyarrow schema it writes (None: not known before the
    job); the table then follows the transform's columns instead of the raw records'."""
    from streamledger.sources import RABBITMQ, find_kind

    problem = sink_library_problem(config.sink)  # one line naming the extra
    if problem is not None:
        raise MissingExtra(f"pipeline {config.pipeline!r}: {problem}")
    transformed = config.transformed
    files_schema = output_schema if transformed else (find_kind(config.url) or RABBITMQ).files_schema()

    if config.sink == "iceberg":
        from streamledger.batch.sinks.iceberg import IcebergSink

        return IcebergSink(pipeline=config.pipeline, output_root=config.output_root,
                           table=config.table or default_iceberg_table(config.pipeline),
                           catalog=config.catalog, ledger_url=ledger.url,
                           files_schema=files_schema, transformed=transformed)
    if config.sink == "delta":
        from streamledger.batch.sinks.delta import DeltaSink

        return DeltaSink(pipeline=config.pipeline, output_root=config.output_root, table=config.table,
                         files_schema=files_schema, transformed=transformed)
    return DirectorySink(config.output_root, config.pipeline)
