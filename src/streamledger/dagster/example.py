"""Example code location: one bounded batch over every partition of a super stream per run.

Configured from the environment (read when the module loads)::

    STREAMLEDGER_RABBITMQ_URL   broker URL        (default rabbitmq-stream://guest:guest@127.0.0.1:5552/)
    STREAMLEDGER_LEDGER_URL     ledger database   (default SQLite under $STREAMLEDGER_HOME)
    STREAMLEDGER_OUTPUT_ROOT    output directory  (default $STREAMLEDGER_HOME/output)
    STREAMLEDGER_SUPER_STREAM   super stream      (default events)
    STREAMLEDGER_PIPELINE       consumer reference (default dagster-stream-batch)

Run it with ``dagster asset materialize -m streamledger.dagster.example --select stream_batch`` or
``dagster dev -m streamledger.dagster.example``. URLs given in the environment are passed as
``EnvVar``s, so their passwords never appear in the Dagster UI or in run configuration.
"""

from __future__ import annotations

import os
from typing import Any

from dagster import Definitions, EnvVar, define_asset_job, in_process_executor

from streamledger.dagster import (
    StreamLedgerResource,
    StreamSourceResource,
    StreamSparkResource,
    build_ledger_audit_check,
    build_stream_backlog_sensor,
    build_stream_batch_asset,
)
from streamledger.home import state_dir

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"


def _secret(name: str, default: str | None) -> Any:
    """An ``EnvVar`` when set (resolved at run time, masked in the UI), else the default."""
    return EnvVar(name) if os.environ.get(name) else default


PIPELINE = os.environ.get("STREAMLEDGER_PIPELINE", "dagster-stream-batch")
SUPER_STREAM = os.environ.get("STREAMLEDGER_SUPER_STREAM", "events")
OUTPUT_ROOT = os.environ.get("STREAMLEDGER_OUTPUT_ROOT") or os.path.join(state_dir(), "output")

stream_batch = build_stream_batch_asset(
    key="stream_batch",
    pipeline=PIPELINE,
    super_stream=SUPER_STREAM,
    output_root=OUTPUT_ROOT,
    group_name="streamledger",
)
stream_batch_job = define_asset_job("stream_batch_job", selection=[stream_batch.key])
stream_batch_audit = build_ledger_audit_check(stream_batch, pipeline=PIPELINE)
stream_batch_sensor = build_stream_backlog_sensor(
    stream_batch, pipeline=PIPELINE, super_stream=SUPER_STREAM, minimum_interval_seconds=30
)

defs = Definitions(
    assets=[stream_batch],
    asset_checks=[stream_batch_audit],
    jobs=[stream_batch_job],
    sensors=[stream_batch_sensor],
    # One process per run: the Spark session started by the batch step is not paid for twice, and the
    # audit check that follows needs no process of its own.
    executor=in_process_executor,
    resources={
        "rabbitmq": StreamSourceResource(url=_secret("STREAMLEDGER_RABBITMQ_URL", DEFAULT_URL)),
        "ledger": StreamLedgerResource(url=_secret("STREAMLEDGER_LEDGER_URL", None)),
        # Each CLI run starts a fresh step process: the quick-start JVM flags halve Spark's start-up.
        "spark": StreamSparkResource(quick_start=True),
    },
)
