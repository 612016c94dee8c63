"""A reconstructable job for ``execute_job`` (re-execution needs one): the stream batch asset of the
setup named by the ``STREAMLEDGER_*`` environment variables, run in process so the shared Spark
session is reused."""

from __future__ import annotations

import os

from dagster import Definitions, JobDefinition, define_asset_job, in_process_executor

from streamledger.dagster import (
    RabbitMQStreamResource,
    StreamLedgerResource,
    StreamSparkResource,
    build_stream_batch_asset,
)


def batch_job() -> JobDefinition:
    asset = build_stream_batch_asset(
        pipeline=os.environ["STREAMLEDGER_PIPELINE"],
        super_stream=os.environ["STREAMLEDGER_SUPER_STREAM"],
        output_root=os.environ["STREAMLEDGER_OUTPUT_ROOT"],
    )
    defs = Definitions(
        assets=[asset],
        jobs=[define_asset_job("batch_job", selection=[asset.key])],
        executor=in_process_executor,
        resources={
            "rabbitmq": RabbitMQStreamResource(url=os.environ["STREAMLEDGER_RABBITMQ_URL"]),
            "ledger": StreamLedgerResource(url=os.environ["STREAMLEDGER_LEDGER_URL"]),
            "spark": StreamSparkResource(),
        },
    )
    return defs.resolve_job_def("batch_job")
