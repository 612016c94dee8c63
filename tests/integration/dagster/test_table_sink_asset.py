"""Issue 21 item 7: the stream batch asset with ``sink="delta"`` through Dagster's ``materialize`` on the
real broker and local Spark: each materialization is one Delta commit holding every record once, the
materialization's metadata names the table and its version, and the audit check checks the table."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from streamledger.dagster import build_ledger_audit_check, build_stream_batch_asset
from tests.integration.dagster.conftest import Setup, materializations

pytestmark = [pytest.mark.dagster, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(180)]


def test_delta_sink_materializations_commit_once_each_and_name_the_table(setup: Setup,
                                                                        tmp_path: Path) -> None:
    from deltalake import DeltaTable

    location = str(tmp_path / "lake" / "events")
    asset = build_stream_batch_asset(pipeline=setup.pipeline, super_stream=setup.super_stream,
                                     output_root=setup.output_root, sink="delta", table=location)
    check = build_ledger_audit_check(asset, pipeline=setup.pipeline)
    instance = DagsterInstance.ephemeral()
    versions = []
    for ids in (range(0, 40), range(40, 70)):
        setup.publish(ids)
        result = materialize([asset, check], resources=setup.resources(), instance=instance)
        assert result.success
        [mat] = materializations(result)
        meta = {k: v.value for k, v in mat.metadata.items()}
        assert meta["records"] == len(ids)
        table = meta["streamledger/table"]
        assert (table["format"], table["identifier"]) == ("delta", location)
        assert meta["dagster/uri"] == table["location"]
        assert table["location"].rstrip("/").endswith("/lake/events")
        versions.append(table["version"])
        [evaluation] = result.get_asset_check_evaluations()
        assert evaluation.passed, evaluation.metadata

    dt = DeltaTable(location)
    assert versions[1] == versions[0] + 1 == dt.version()  # one Delta commit per materialization
    rows = dt.to_pyarrow_table(columns=["stream", "offset"])
    keys = list(zip(rows.column("stream").to_pylist(), rows.column("offset").to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == 70  # every record once
    assert all(r.sink_table == f"delta:{location}" for r in setup.ranges() if r.records)
