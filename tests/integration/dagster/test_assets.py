"""The stream batch asset through Dagster's own ``materialize`` on the real broker and local Spark:
ranges per partition, metadata, the audit check, and output that holds every event exactly once."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import AssetKey, DagsterInstance, materialize

from streamledger.dagster import build_ledger_audit_check, build_stream_batch_asset
from tests.integration.dagster.conftest import Setup, materializations

pytestmark = [pytest.mark.dagster, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(180)]


def test_two_materializations_read_consecutive_ranges_once(setup: Setup) -> None:
    asset = build_stream_batch_asset(
        pipeline=setup.pipeline, super_stream=setup.super_stream, output_root=setup.output_root
    )
    check = build_ledger_audit_check(asset, pipeline=setup.pipeline)
    instance = DagsterInstance.ephemeral()
    setup.publish(range(0, 60))

    first = materialize([asset, check], resources=setup.resources(), instance=instance)
    assert first.success
    [mat] = materializations(first)
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["records"] == 60 and meta["dagster/row_count"] == 60
    assert meta["ranges"] == {p: [0, 30] for p in setup.partitions}
    assert meta["stored_offsets"] == {p: 29 for p in setup.partitions}
    assert set(meta["outputs"]) == set(setup.partitions)
    assert all(path.endswith("000000000000-000000000030") for path in meta["outputs"].values())
    [evaluation] = first.get_asset_check_evaluations()
    assert evaluation.passed and evaluation.asset_key == AssetKey("stream_batch")

    setup.publish(range(60, 100))
    second = materialize([asset, check], resources=setup.resources(), instance=instance)
    [mat] = materializations(second)
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["records"] == 40
    # each range starts where the last ended (offset 30 is the tracking chunk of the stored offset 29)
    assert {p: r[0] for p, r in meta["ranges"].items()} == {p: 30 for p in setup.partitions}
    assert second.get_asset_check_evaluations()[0].passed

    assert sorted(setup.written_ids()) == list(range(100))
    committed = [r for r in setup.ranges() if str(r.status) == "committed"]
    assert len(committed) == 4 and sum(r.records for r in committed) == 100
    assert {r.run.dag_id for r in committed} == {"dagster"}
    runs = {r.run.run_id for r in committed}
    assert runs == {first.run_id, second.run_id}


def test_nothing_new_is_an_empty_materialization(setup: Setup) -> None:
    asset = build_stream_batch_asset(
        pipeline=setup.pipeline, super_stream=setup.super_stream, output_root=setup.output_root
    )
    result = materialize([asset], resources=setup.resources(), instance=DagsterInstance.ephemeral())
    [mat] = materializations(result)
    meta: dict[str, Any] = {k: v.value for k, v in mat.metadata.items()}
    assert meta["records"] == 0 and meta["empty"] is True and meta["outputs"] == {}
    assert all(r.empty for r in setup.ranges())  # at most empty bookkeeping rows, nothing to read
