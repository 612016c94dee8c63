"""Run one task of a DAG in a run triggered by given asset events, in a real Airflow home.

What the scheduler and the triggerer's supervisor would do, minus the waiting: the DAGs are synced
to the metadata DB, each payload is stored as the asset event ``Trigger.submit_event`` stores
(``AssetManager.register_asset_change`` with ``{"from_trigger": True, "payload": ...}``), an
``asset_triggered`` run consumes the chosen events, and the task runs in process through the Task
SDK (``dag.test``'s ``_run_task``: the in-process execution API over the same DB). Prints one JSON
line: the task's state and the stored event ids.

Usage: ``python tests/unit/airflow/_asset_triggered_run.py SPEC.json`` with SPEC
``{"dag_id", "task_id", "asset_uri", "payloads": [...], "consume": [indexes of payloads]}``.
"""

from __future__ import annotations

import json
import sys
import time
import uuid


def main(spec: dict) -> dict:  # type: ignore[type-arg]
    from airflow.assets.manager import AssetManager
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.dagbag import DBDagBag
    from airflow.models.taskinstance import TaskInstance
    from airflow.sdk import timezone
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import select

    manager = DagBundlesManager()
    with create_session() as s:
        manager.sync_bundles_to_db(session=s)
    dags = {}
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
        sync_bag_to_db(bag, bundle.name, bundle.version)
        dags.update(bag.dags)
    task = dags[spec["dag_id"]].task_dict[spec["task_id"]]

    ids = []
    for payload in spec["payloads"]:  # one transaction each, as the supervisor persists them
        with create_session() as s:
            asset = s.scalar(select(AssetModel).where(AssetModel.uri == spec["asset_uri"]))
            assert asset is not None, f"asset {spec['asset_uri']} not registered"
            event = AssetManager.register_asset_change(
                asset=asset, extra={"from_trigger": True, "payload": payload}, session=s)
            assert event is not None
            s.flush()
            ids.append(event.id)
        time.sleep(0.01)  # distinct timestamps, as a restart between two persists guarantees
    with create_session() as s:
        dag = DBDagBag().get_latest_version_of_dag(spec["dag_id"], session=s)
        assert dag is not None
        now = timezone.utcnow()
        run = dag.create_dagrun(
            run_id=f"asset_triggered__{uuid.uuid4().hex[:8]}", logical_date=None, data_interval=None,
            run_after=now, run_type=DagRunType.ASSET_TRIGGERED, state=DagRunState.RUNNING,
            triggered_by=DagRunTriggeredByType.ASSET, session=s)
        consumed = [s.get(AssetEvent, ids[i]) for i in spec["consume"]]
        run.consumed_asset_events.extend(consumed)
        ti = s.scalar(select(TaskInstance).where(TaskInstance.dag_id == run.dag_id,
                                                 TaskInstance.run_id == run.run_id,
                                                 TaskInstance.task_id == spec["task_id"]))
        assert ti is not None
        ti.try_number = 1
        ti.state = TaskInstanceState.SCHEDULED
        s.commit()
        run_id = run.run_id
    with create_session() as s:
        ti = s.scalar(select(TaskInstance).where(TaskInstance.dag_id == spec["dag_id"],
                                                 TaskInstance.run_id == run_id,
                                                 TaskInstance.task_id == spec["task_id"]))
        _run_task(ti=ti, task=task)
    with create_session() as s:
        state = s.scalar(select(TaskInstance.state).where(TaskInstance.dag_id == spec["dag_id"],
                                                          TaskInstance.run_id == run_id,
                                                          TaskInstance.task_id == spec["task_id"]))
    return {"state": str(state), "event_ids": ids, "run_id": run_id}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        result = main(json.load(f))
    print("RESULT " + json.dumps(result))
