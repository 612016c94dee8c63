"""Dagster integration: ledgered, exactly-once batches from RabbitMQ streams or mewbase channels as
Dagster assets.

Shaped like Dagster's own integration libraries: one ``ConfigurableResource`` per external system,
factories that return ordinary definitions (an asset, asset checks, a sensor), nothing implicit, and
``StreamBatchComponent``, the same definitions configured in a ``defs.yaml`` (``dg``).
See docs/dagster.md; ``streamledger.dagster.example`` is a ready ``Definitions`` object.
"""

from streamledger.dagster.assets import (
    StreamBatchOrderError,
    batch_metadata,
    build_stream_batch_asset,
)
from streamledger.dagster.automation import BacklogAbove
from streamledger.dagster.checks import build_ledger_audit_check, build_partition_audit_check
from streamledger.dagster.components import StreamBatchComponent
from streamledger.dagster.identity import DAG_ID
from streamledger.dagster.resources import (
    IcebergCatalogResource,
    RabbitMQStreamResource,
    ResourceConfigError,
    StreamLedgerResource,
    StreamSourceResource,
    StreamSparkResource,
)
from streamledger.dagster.sensors import build_stream_backlog_sensor

__all__ = [
    "DAG_ID",
    "BacklogAbove",
    "IcebergCatalogResource",
    "RabbitMQStreamResource",
    "ResourceConfigError",
    "StreamBatchComponent",
    "StreamBatchOrderError",
    "StreamLedgerResource",
    "StreamSourceResource",
    "StreamSparkResource",
    "batch_metadata",
    "build_ledger_audit_check",
    "build_partition_audit_check",
    "build_stream_backlog_sensor",
    "build_stream_batch_asset",
]
