"""Who claims a range: the run identity each entry point records, and how a person reads one.

Every range carries a ``RunIdentity`` (dag id, run id, task id, map index, try). Each entry point
fills it by its own convention: the CLI, Dagster, Spark's Structured Streaming and the ledger's own
markers (skipped spans, epochs) under fixed dag ids, Airflow with its task instance. The exact
identity is what the ledger keys on (and what ``--json`` shows); :func:`describe` is the line for a
table. Plain strings only, so the CLI's parser can load it without the ledger.
"""

from __future__ import annotations

from typing import Protocol

CLI_DAG = "streamledger-cli"  # a ``streamledger batch run``: run id ``cli-<12 hex>`` unless --run-id
CLI_RUN_PREFIX = "cli-"
DAGSTER_DAG = "dagster"  # run id: the root run id; task id: asset key [partition]
STREAMING_PREFIX = "spark-streaming:"  # dag id ``spark-streaming:<query id>``, run id ``batch-<n>``
LEDGER_DAG = "streamledger"  # the ledger's own markers: skipped spans, a new epoch, the origin


class Identity(Protocol):
    """The fields of ``streamledger.ledger.RunIdentity`` that :func:`describe` reads."""

    @property
    def dag_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def map_index(self) -> int: ...
    @property
    def try_number(self) -> int: ...


def describe(run: Identity) -> str:
    """Who ran it, in words: ``CLI``, ``Airflow <dag> / <task>, run <run>``, ``Dagster run <id8>, asset
    <key>``, ``Spark streaming <query8> batch-<n>``, ``ledger: <marker>``; ``, try N`` after a retry."""
    if run.dag_id == CLI_DAG:
        auto = run.run_id.startswith(CLI_RUN_PREFIX)
        who = "CLI" if auto else f"CLI run {run.run_id}"
    elif run.dag_id == DAGSTER_DAG:
        who = f"Dagster run {run.run_id[:8]}, asset {run.task_id}"
    elif run.dag_id.startswith(STREAMING_PREFIX):
        who = f"Spark streaming {run.dag_id.removeprefix(STREAMING_PREFIX)[:8]} {run.run_id}"
    elif run.dag_id == LEDGER_DAG:
        who = f"ledger: {run.run_id}"
    else:
        mapped = f"[{run.map_index}]" if run.map_index >= 0 else ""
        who = f"Airflow {run.dag_id} / {run.task_id}{mapped}, run {run.run_id}"
    return who if run.try_number <= 1 else f"{who}, try {run.try_number}"
