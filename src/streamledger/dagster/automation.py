"""``BacklogAbove``: declarative automation that materializes a stream's asset when its backlog passes
a threshold, in records waiting or in time (lag, from chunk timestamps).

A custom ``AutomationCondition`` (Dagster's "arbitrary Python automation conditions"): each
evaluation makes one broker connection and asks the same question as the backlog sensor
(:func:`streamledger.dagster.sensors.backlog_of`: the ledger's frontier per stream, then user records
counted from it up to the threshold) and, for ``max_lag_seconds``, the freshness lag of
:mod:`streamledger.dagster.freshness`. It commits nothing, so like the sensor it can never run ahead
of committed work. Compose it with Dagster's operands, e.g.
``BacklogAbove(...) & ~AutomationCondition.in_progress()``. Because it runs Python, the automation
sensor evaluating it must run on the code server:
``AutomationConditionSensorDefinition(..., use_user_code_server=True)``.

The condition holds the *name* of the environment variable with the broker URL, never the URL: a
condition is part of the asset's definition (shown in the UI), and the URL may carry a password.
"""

import os
from typing import Any

from dagster import AssetKey, AutomationCondition, AutomationContext, AutomationResult, MetadataValue

from streamledger.batch.position import PipelineSource, source_problem
from streamledger.dagster.freshness import lag_by_stream
from streamledger.errors import StreamledgerError


class BacklogAbove(AutomationCondition[AssetKey]):
    """True for the asset while ``pipeline`` has at least ``min_backlog`` user records waiting, or
    (with ``max_lag_seconds``) its output is that many seconds of stream time behind.

    :param broker_url_env: environment variable holding the broker URL (read at each evaluation).
    :param ledger_url: the ledger's SQLAlchemy URL (``None``: ``$STREAMLEDGER_LEDGER_URL`` or SQLite
        under ``$STREAMLEDGER_HOME``), or ``ledger_url_env`` naming a variable that holds it.
    """

    def __init__(self, *, pipeline: str, min_backlog: int | None = None, max_lag_seconds: float | None = None,
                 super_stream: str | None = None, stream: str | None = None,
                 broker_url_env: str = "STREAMLEDGER_RABBITMQ_URL", ledger_url: str | None = None,
                 ledger_url_env: str | None = None) -> None:
        problem = source_problem(pipeline, stream, super_stream)
        if problem is not None:
            raise StreamledgerError(problem)
        if min_backlog is None and max_lag_seconds is None:
            raise StreamledgerError(
                f"pipeline {pipeline!r}: BacklogAbove needs min_backlog or max_lag_seconds"
            )
        if min_backlog is not None and min_backlog < 1:
            raise StreamledgerError(f"pipeline {pipeline!r}: min_backlog must be >= 1, got {min_backlog}")
        self.pipeline, self.stream, self.super_stream = pipeline, stream, super_stream
        self.min_backlog, self.max_lag_seconds = min_backlog, max_lag_seconds
        self.broker_url_env, self.ledger_url, self.ledger_url_env = broker_url_env, ledger_url, ledger_url_env
        self._ledger: Any = None

    @property
    def name(self) -> str:
        return "backlog_above"

    @property
    def requires_cursor(self) -> bool:
        return False

    @property
    def description(self) -> str:
        parts = []
        if self.min_backlog is not None:
            parts.append(f">= {self.min_backlog} records waiting")
        if self.max_lag_seconds is not None:
            parts.append(f">= {self.max_lag_seconds:g} s behind the stream")
        return f"Pipeline {self.pipeline}: {' or '.join(parts)}"

    def ledger(self) -> Any:
        if self._ledger is None:
            from streamledger.ledger import Ledger

            url = os.environ.get(self.ledger_url_env) if self.ledger_url_env else self.ledger_url
            self._ledger = Ledger(url or None, create=True)  # as StreamLedgerResource does
        return self._ledger

    def measure(self) -> tuple[int, float]:
        """(user records waiting, counted up to ``min_backlog``; lag in seconds, 0 unless asked)."""
        from streamledger.dagster.sensors import backlog_of
        from streamledger.sources import connect_log

        url = os.environ.get(self.broker_url_env, "")
        if not url:
            raise StreamledgerError(f"pipeline {self.pipeline!r}: ${self.broker_url_env} is not set")
        source = PipelineSource(self.pipeline, url, stream=self.stream, super_stream=self.super_stream)
        with connect_log(url) as client:  # any source the URL names, as the sensor
            waiting = backlog_of(client, self.ledger(), source, need=self.min_backlog or 0)
            lag = 0.0
            if self.max_lag_seconds is not None:
                lag = max(lag_by_stream(client, ((s.stream, s.resume) for s in waiting.states)).values(),
                          default=0.0)
        return waiting.records, lag

    def evaluate(self, context: AutomationContext[AssetKey]) -> AutomationResult[AssetKey]:
        records, lag = self.measure()
        due = (self.min_backlog is not None and records >= self.min_backlog) or (
            self.max_lag_seconds is not None and lag >= self.max_lag_seconds
        )
        true = context.candidate_subset if due else context.get_empty_subset()
        return AutomationResult(
            context, true,
            metadata={"records_waiting": MetadataValue.int(records), "lag_seconds": MetadataValue.float(lag)},
        )
