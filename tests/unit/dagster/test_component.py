"""``StreamBatchComponent`` without servers: YAML resolved into the factories' definitions, the
translator's attributes, state (discovered partitions) read at load with no broker call, the
scaffolded defs.yaml itself resolving, and configuration errors at load."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, ComponentTree

from streamledger.dagster.components import (
    ComponentConfigError,
    StreamBatchComponent,
    scaffold_yaml,
)

TYPE = "streamledger.dagster.components.StreamBatchComponent"
DOWN = "rabbitmq-stream://guest:guest@127.0.0.1:9/"  # nothing listens: any broker call would fail


def component(attributes: str) -> StreamBatchComponent:
    return StreamBatchComponent.resolve_from_yaml(textwrap.dedent(attributes))


def build(comp: StreamBatchComponent, state: Path | None = None):  # type: ignore[no-untyped-def]
    return comp.build_defs_from_state(ComponentTree.for_test().load_context, state)


def check_names(defs) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(k.name for c in defs.asset_checks or [] for k in c.check_keys)


BASE = f"""\
    pipeline: orders-eu
    super_stream: orders
    output_root: /tmp/out
    broker_url: {DOWN}
"""


def test_yaml_builds_asset_checks_sensor_and_own_resources_without_the_broker(tmp_path: Path) -> None:
    comp = component(BASE + """\
    asset_attributes:
      key: "streams/{{ pipeline }}"
      owners: ["team:data"]
      tags: {tier: gold}
    freshness:
      fail_after_seconds: 3600
    backlog_sensor:
      min_backlog: 5
    """)
    defs = build(comp)
    key = AssetKey(["streams", "orders-eu"])
    asset = defs.resolve_assets_def(key)
    spec = next(iter(asset.specs))
    assert spec.owners == ["team:data"] and spec.tags["tier"] == "gold"
    assert set(spec.kinds) == {"rabbitmq", "spark", "parquet"}
    assert spec.metadata["pipeline"] == "orders-eu"
    assert "refresh-defs-state" in spec.metadata["streamledger/partitions"]  # nothing discovered yet
    assert spec.freshness_policy is not None
    assert check_names(defs) == ["ledger_audit"]
    [sensor] = defs.sensors or []
    assert sensor.name == "streams__orders_eu_backlog_sensor"
    assert set(defs.resources or {}) == {
        "streamledger_orders_eu_rabbitmq", "streamledger_orders_eu_ledger", "streamledger_orders_eu_spark"
    }


def test_discovered_partitions_come_from_state_not_the_broker(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text(json.dumps({"streams": ["orders-0", "orders-1", "orders-2"], "discovered_at": "x"}))
    defs = build(component(BASE), state)
    spec = next(iter(defs.resolve_assets_def("orders_eu").specs))
    assert spec.metadata["streamledger/partitions"] == ["orders-0", "orders-1", "orders-2"]


def test_time_window_partitions_get_a_partition_check_and_no_sensor() -> None:
    defs = build(component(BASE + """\
    partitions_def:
      type: daily
      start_date: "2026-01-01"
    """))
    asset = defs.resolve_assets_def("orders_eu")
    assert asset.partitions_def is not None
    assert check_names(defs) == ["ledger_audit", "partition_audit"]
    assert not defs.sensors


def test_the_scaffolded_defs_yaml_resolves() -> None:
    data = yaml.safe_load(scaffold_yaml(TYPE))
    assert data["type"] == TYPE
    comp = StreamBatchComponent.resolve_from_yaml(yaml.safe_dump(data["attributes"]))
    assert comp.broker_url_env == "STREAMLEDGER_RABBITMQ_URL" and comp.super_stream == "events"
    defs = build(comp)
    assert defs.resolve_assets_def(AssetKey(["streams", "my-pipeline"])) is not None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("stream: one\n", "exactly one of stream or super_stream"),
        ("broker_url_env: X\n", "exactly one of broker_url or broker_url_env"),
        ("sink: delta\n    catalog_uri_env: X\n", "catalog settings are for sink: iceberg"),
    ],
)
def test_bad_yaml_is_one_line_naming_the_pipeline(extra: str, message: str) -> None:
    with pytest.raises(ComponentConfigError, match=message) as err:
        component(BASE + "    " + extra)
    assert "orders-eu" in str(err.value) and "\n" not in str(err.value) and "guest" not in str(err.value)


def test_backlog_above_in_asset_attributes_is_bound_to_the_components_pipeline() -> None:
    from dagster import AutomationCondition

    from streamledger.dagster.automation import BacklogAbove

    comp = component("""\
    pipeline: orders-eu
    super_stream: orders
    output_root: /tmp/out
    broker_url_env: SL_BROKER
    ledger_url: sqlite:////tmp/ledger.db
    asset_attributes:
      automation_condition: "{{ backlog_above(500, max_lag_seconds=600) }}"
    """)
    defs = build(comp)
    spec = next(iter(defs.resolve_assets_def("orders_eu").specs))
    condition = spec.automation_condition
    assert condition is not None and condition.get_label() == "backlog_above"
    [backlog] = [c for c in condition.children if isinstance(c, BacklogAbove)]
    assert (backlog.pipeline, backlog.super_stream, backlog.min_backlog, backlog.max_lag_seconds) == (
        "orders-eu", "orders", 500, 600
    )
    assert (backlog.broker_url_env, backlog.ledger_url) == ("SL_BROKER", "sqlite:////tmp/ledger.db")
    assert "orders-eu" in backlog.description and ">= 500 records" in backlog.description
    assert any(isinstance(c, type(~AutomationCondition.in_progress())) for c in condition.children)
    # a Python condition is evaluated on the code server, by the component's own automation sensor
    [automation] = [s for s in defs.sensors or [] if s.name == "orders_eu_automation"]
    assert automation.sensor_type.name == "AUTOMATION"


def test_backlog_above_refuses_a_broker_url_in_the_yaml() -> None:
    comp = component(BASE + """\
    asset_attributes:
      automation_condition: "{{ backlog_above(10) }}"
    """)
    with pytest.raises(Exception, match="backlog_above needs broker_url_env"):
        build(comp)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"super_stream": "orders"}, "needs min_backlog or max_lag_seconds"),
        ({"super_stream": "orders", "min_backlog": 0}, "min_backlog must be >= 1"),
        ({"min_backlog": 5}, "stream"),
    ],
)
def test_backlog_above_refuses_bad_arguments_in_one_line(kwargs: dict[str, object], message: str) -> None:
    from streamledger.dagster.automation import BacklogAbove
    from streamledger.errors import StreamledgerError

    with pytest.raises(StreamledgerError, match=message) as err:
        BacklogAbove(pipeline="orders-eu", **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_table_sink_yaml_gives_the_asset_its_sink_and_an_env_backed_catalog_resource(
        monkeypatch: pytest.MonkeyPatch) -> None:
    comp = component(BASE + """\
    sink: iceberg
    table: lake.orders
    catalog: {type: rest, warehouse: wh}
    catalog_uri_env: LAKE_CATALOG_URI
    catalog_credential_env: LAKE_CATALOG_CREDENTIAL
    """)
    defs = build(comp)
    spec = next(iter(defs.resolve_assets_def("orders_eu").specs))
    assert set(spec.kinds) == {"rabbitmq", "spark", "iceberg"}
    # the audit check reads the table in the same (non-default) catalog as the batch writes it
    [audit_check] = [c for c in defs.asset_checks or []
                     if any(k.name == "ledger_audit" for k in c.check_keys)]
    assert "streamledger_orders_eu_catalog" in audit_check.required_resource_keys
    catalog = (defs.resources or {})["streamledger_orders_eu_catalog"]
    # the secrets stay environment variables in the definitions (resolved at run time only)
    assert catalog.uri.env_var_name == "LAKE_CATALOG_URI"
    assert catalog.credential.env_var_name == "LAKE_CATALOG_CREDENTIAL"
    monkeypatch.setenv("LAKE_CATALOG_URI", "https://cat.example/api")
    monkeypatch.setenv("LAKE_CATALOG_CREDENTIAL", "id:s3cr3t")
    resolved = catalog.process_config_and_initialize()
    assert resolved.catalog_properties() == {"type": "rest", "warehouse": "wh", "uri": "https://cat.example/api",
                                             "credential": "id:s3cr3t"}


@pytest.mark.parametrize(("sink", "library", "extra"), [("iceberg", "pyiceberg", "iceberg"),
                                                         ("delta", "deltalake", "delta")])
def test_a_table_sink_without_its_extra_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, sink: str, library: str, extra: str,
) -> None:
    """Issue 41 item 5: ``sink: iceberg`` where the ``[iceberg]`` extra is not installed ends in one
    line naming the extra (docs/install.md), when the definitions load, not in a traceback later."""
    monkeypatch.setitem(sys.modules, library, None)  # what importing it finds where it is not installed
    with pytest.raises(ComponentConfigError) as err:
        component(BASE + f"    sink: {sink}\n")
    said = str(err.value)
    assert "\n" not in said and "orders-eu" in said, said
    assert f'{library} is not installed: pip install "streamledger[{extra}]"' in said, said


def test_the_specs_claim_store_and_interval_settings_resolve_from_yaml() -> None:
    """Issue 41 item 1: every setting of the pipeline spec is a YAML field of the same name."""
    comp = component(BASE + """\
    store_offset: false
    store_timeout: 2.5
    broker_name: rabbit-eu
    heartbeat_interval: 5
    claim_timeout: 90
    bound_by_interval: true
    interval_grace: 15
    partitions_def:
      type: daily
      start_date: "2026-01-01"
""")
    spec = comp.pipeline_spec(windowed=True)
    assert (spec.store_offset, spec.store_timeout, spec.broker_name) == (False, 2.5, "rabbit-eu")
    assert (spec.heartbeat_interval, spec.claim_timeout) == (5, 90)
    assert (spec.bound_by_interval, spec.interval_grace) == (True, 15)
    assert spec.initial_position == "interval_start"  # the windowed asset's own default
    with pytest.raises(ComponentConfigError, match="bound_by_interval needs the data interval"):
        component(BASE + "    bound_by_interval: true\n")  # no time windows, no interval
