"""How a Dagster run becomes a ledger run identity, and how a claim's holder is found alive or gone.

The ledger hands the same range back to the same identity, so the identity must survive exactly the
events after which the same data should be read again: a step retry and a re-execution of a failed
run. Dagster gives a re-execution a new run id but keeps the *root* run id (``dagster/root_run_id``),
so the identity is (root run id, asset key, partition key). A brand-new run of the same asset is a
different identity: it continues after the committed ranges, or takes over a stale claim only when
the instance says every run of the holder's family has finished.
"""

from __future__ import annotations

from typing import Any

from streamledger.batch import RunId
from streamledger.runs import DAGSTER_DAG

#: ``RunId.dag_id`` of every range claimed from Dagster (Airflow ranges carry their DAG id).
DAG_ID = DAGSTER_DAG
ROOT_RUN_ID_TAG = "dagster/root_run_id"  # dagster._core.storage.tags.ROOT_RUN_ID_TAG (private there)


def task_id(asset_key: Any, partition_key: str | None) -> str:
    """``path/of/asset`` or ``path/of/asset[partition]``: one claim per asset partition."""
    name = str(asset_key.to_user_string())
    return f"{name}[{partition_key}]" if partition_key is not None else name


def root_run_id(run: Any) -> str:
    """The id of the first run of a re-execution family (the run's own id for an original run)."""
    return str(getattr(run, "root_run_id", None) or run.get_root_run_id() or run.run_id)


def attempt(run: Any, instance: Any, retry_number: int) -> int:
    """1 for the first try; +1 per step retry and per re-execution up the parent chain.

    Recorded in the ledger (not part of the identity), so a range's history shows the attempt.
    """
    depth, parent = 0, getattr(run, "parent_run_id", None)
    while parent and depth < 100:
        depth += 1
        earlier = instance.get_run_by_id(parent) if instance is not None else None
        parent = getattr(earlier, "parent_run_id", None) if earlier is not None else None
    return 1 + depth + retry_number


def run_id_for(context: Any) -> RunId:
    """The ledger identity of the asset step running in ``context``."""
    partition = context.partition_key if context.has_partition_key else None
    run = context.run
    return RunId(
        DAG_ID,
        root_run_id(run),
        task_id(context.asset_key, partition),
        -1,
        attempt(run, context.instance, context.retry_number),
    )


def holder_alive(instance: Any, current_run_id: str) -> Any:
    """``holder_alive`` for ``run_batch``: is any run of the holder's re-execution family unfinished?

    A holder this instance does not know (another instance, or an ephemeral one that is gone) counts
    as alive: taking its range over could make two writers. Such a claim is released by re-executing
    its run where it is known, or by ``streamledger ledger release-stale``.
    """

    def alive(holder: RunId) -> bool:
        if holder.dag_id != DAG_ID or instance is None:
            return True
        from dagster import RunsFilter

        family = list(instance.get_runs(filters=RunsFilter(run_ids=[holder.run_id])))
        family += instance.get_runs(filters=RunsFilter(tags={ROOT_RUN_ID_TAG: holder.run_id}))
        family = [r for r in family if r.run_id != current_run_id]
        if not family:
            return True
        return any(not r.is_finished for r in family)

    return alive
