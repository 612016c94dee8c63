"""The provider description: valid for Airflow's schema, every class it names importable."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import airflow
import jsonschema
import pytest

from streamledger.provider import get_provider_info


def _import(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_matches_airflow_provider_schema() -> None:
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_every_module_and_class_named_exists() -> None:
    info = get_provider_info()
    for key in ("hooks", "operators", "sensors", "triggers"):
        for entry in info[key]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for conn in info["connection-types"]:
        hook = _import(conn["hook-class-name"])
        assert hook.conn_type == conn["connection-type"]  # type: ignore[attr-defined]
    for plugin in info["plugins"]:
        cls = _import(plugin["plugin-class"])
        assert cls.name == plugin["name"]  # type: ignore[attr-defined]
    for manager in info["db-managers"]:
        cls = _import(manager)
        assert cls.version_table_name == "streamledger_ledger_version"  # type: ignore[attr-defined]


@pytest.mark.parametrize("conn_type", ["rabbitmq_stream", "mewbase", "tubemq", "streamledger_ledger"])
def test_connection_forms_are_declarative_and_consistent(conn_type: str) -> None:
    (conn,) = [c for c in get_provider_info()["connection-types"] if c["connection-type"] == conn_type]
    behaviour = conn["ui-field-behaviour"]
    assert set(behaviour) == {"hidden-fields", "relabeling", "placeholders"}
    hook = _import(conn["hook-class-name"])
    legacy = hook.get_ui_field_behaviour()  # type: ignore[attr-defined]
    assert legacy == {
        "hidden_fields": behaviour["hidden-fields"],
        "relabeling": behaviour["relabeling"],
        "placeholders": behaviour["placeholders"],
    }
    for name, field in conn.get("conn-fields", {}).items():
        assert field["label"] and "type" in field["schema"], name


def test_airflow_providers_manager_sees_it() -> None:
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    pm = ProvidersManager()
    assert "streamledger" in pm.providers
    hooks = ProvidersManagerTaskRuntime().hooks
    assert hooks["rabbitmq_stream"] is not None
    assert hooks["rabbitmq_stream"].connection_id_attribute_name == "rabbitmq_stream_conn_id"
    widgets = pm.connection_form_widgets
    assert "extra__rabbitmq_stream__ca_file" in widgets
    assert pm.field_behaviours["rabbitmq_stream"]["relabeling"]["schema"] == "Virtual host"


def test_message_queue_provider_is_registered_for_the_scheme() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MESSAGE_QUEUE_PROVIDERS
    from airflow.providers_manager import ProvidersManager

    names = get_provider_info()["queues"]
    assert len(names) == 2 and set(names) <= set(ProvidersManager().queue_class_names)
    for scheme, provider in (("rabbitmq-stream", "RabbitMQStreamMessageQueueProvider"),
                             ("mewbase", "MewbaseMessageQueueProvider")):
        matching = [p for p in MESSAGE_QUEUE_PROVIDERS if p.scheme_matches(scheme)]
        assert [type(p).__name__ for p in matching] == [provider]
    assert not any(p.scheme_matches("rabbitmq") for p in MESSAGE_QUEUE_PROVIDERS)


def test_ui_plugin_entry_point_matches_the_provider_info() -> None:
    """Airflow discovers providers lazily by default and then reads only the airflow.plugins entry
    point; both registrations must name the same class, and the page must ship with the package."""
    import tomllib
    from importlib.resources import files

    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    entry = pyproject["project"]["entry-points"]["airflow.plugins"]["streamledger"]
    (plugin,) = get_provider_info()["plugins"]
    assert entry.replace(":", ".") == plugin["plugin-class"]
    assert "plugins/*.html" in pyproject["tool"]["setuptools"]["package-data"]["streamledger"]
    assert files("streamledger.plugins").joinpath("ledger_page.html").is_file()
