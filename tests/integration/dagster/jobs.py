"""A reconstructable job for ``execute_job`` (re-execution needs one): the stream batch asset of one
test's setup (its ``STREAMLEDGER_*`` settings as keyword arguments, which also keep Dagster's
in-process cache of reconstructed jobs apart between tests), run in process so the shared Spark
session is reused. With ``KILL_AFTER_READ=1`` its Spark step dies right after the job wrote its
staging output, by a ``BaseException``, so none of the batch's clean-up runs: a kill."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dagster import Definitions, JobDefinition, define_asset_job, in_process_executor

from streamledger.batch import InjectedCrash, JobRunner
from streamledger.dagster import (
    RabbitMQStreamResource,
    StreamLedgerResource,
    StreamSparkResource,
    build_stream_batch_asset,
)

KILL_ENV = "KILL_AFTER_READ"


class KillableSparkResource(StreamSparkResource):
    """Runs the real job, then, while ``KILL_AFTER_READ=1`` (read at call time: Dagster caches the
    reconstructed job in process), dies before the batch can verify or commit anything."""

    def get_runner(self) -> JobRunner:
        real = super().get_runner()

        def runner(**kwargs: Any) -> Mapping[str, Any]:
            manifest = real(**kwargs)
            if os.environ.get(KILL_ENV) == "1":
                raise InjectedCrash("killed after the Spark job wrote its staging output")
            return manifest

        return runner


def batch_job(**env: str) -> JobDefinition:
    asset = build_stream_batch_asset(
        pipeline=env["STREAMLEDGER_PIPELINE"],
        super_stream=env["STREAMLEDGER_SUPER_STREAM"],
        output_root=env["STREAMLEDGER_OUTPUT_ROOT"],
    )
    defs = Definitions(
        assets=[asset],
        jobs=[define_asset_job("batch_job", selection=[asset.key])],
        executor=in_process_executor,
        resources={
            "rabbitmq": RabbitMQStreamResource(url=env["STREAMLEDGER_RABBITMQ_URL"]),
            "ledger": StreamLedgerResource(url=env["STREAMLEDGER_LEDGER_URL"]),
            "spark": KillableSparkResource(),
        },
    )
    return defs.resolve_job_def("batch_job")


def reconstructable_batch_job(env: Mapping[str, str]) -> Any:
    from dagster import build_reconstructable_job

    return build_reconstructable_job(__name__, "batch_job", reconstructable_kwargs=dict(env))
