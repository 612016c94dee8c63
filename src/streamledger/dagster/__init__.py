"""Dagster integration: ledgered, exactly-once batches from RabbitMQ streams as Dagster assets.

Shaped like Dagster's own integration libraries: one ``ConfigurableResource`` per external system,
factories that return ordinary definitions (an asset, an asset check, a sensor), nothing implicit.
See docs/dagster.md; ``streamledger.dagster.example`` is a ready ``Definitions`` object.
"""

from streamledger.dagster.assets import (
    StreamBatchOrderError,
    batch_metadata,
    build_stream_batch_asset,
)
from streamledger.dagster.checks import build_ledger_audit_check
from streamledger.dagster.identity import DAG_ID
from streamledger.dagster.resources import (
    RabbitMQStreamResource,
    ResourceConfigError,
    StreamLedgerResource,
    StreamSparkResource,
)
from streamledger.dagster.sensors import build_stream_backlog_sensor

__all__ = [
    "DAG_ID",
    "RabbitMQStreamResource",
    "ResourceConfigError",
    "StreamBatchOrderError",
    "StreamLedgerResource",
    "StreamSparkResource",
    "batch_metadata",
    "build_ledger_audit_check",
    "build_stream_backlog_sensor",
    "build_stream_batch_asset",
]
