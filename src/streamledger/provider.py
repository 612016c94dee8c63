"""Airflow provider description for streamledger.

Airflow discovers providers through the ``apache_airflow_provider`` entry point declared in
``pyproject.toml``; the package lives outside ``airflow.providers.*`` on purpose, because Airflow 3
refuses connection types contributed by third-party packages inside that namespace.

Connection form metadata (``conn-fields``, ``ui-field-behaviour``) is declared here rather than
through ``get_connection_form_widgets()``: since Airflow 3.2 the declarative form is the supported
one, it needs neither wtforms nor Flask, and Airflow reads it without importing the hooks.
This module must stay import-cheap and free of Airflow imports.
"""

from __future__ import annotations

import os
from typing import Any

from streamledger import __version__ as _VERSION

_STRING = {"type": ["string", "null"]}
_BOOL_FALSE = {"type": ["boolean", "null"], "default": False}

RABBITMQ_STREAM_UI: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {"schema": "Virtual host", "login": "User", "password": "Password"},
    "placeholders": {
        "host": "127.0.0.1",
        "port": "5552 (5551 with TLS)",
        "schema": "/",
        "login": "guest",
        "extra": '{"tls": true, "ca_file": "/path/ca.pem"}',
    },
}

RABBITMQ_STREAM_FIELDS: dict[str, Any] = {
    "tls": {
        "label": "Use TLS",
        "description": "Connect with TLS (rabbitmq-stream+tls); the stream TLS listener is usually 5551.",
        "schema": _BOOL_FALSE,
    },
    "ca_file": {
        "label": "CA file",
        "description": "PEM file of the CA that signed the broker certificate (default: system trust).",
        "schema": _STRING,
    },
    "cert_file": {
        "label": "Client certificate",
        "description": "PEM client certificate, for mutual TLS or SASL EXTERNAL.",
        "schema": _STRING,
    },
    "key_file": {
        "label": "Client key",
        "description": "PEM key of the client certificate.",
        "schema": _STRING,
    },
    "verify": {
        "label": "Verify server certificate",
        "description": "Check the broker's certificate and host name (keep on outside tests).",
        "schema": {"type": ["boolean", "null"], "default": True},
    },
    "sasl_mechanism": {
        "label": "SASL mechanism",
        "description": "PLAIN (user/password, default) or EXTERNAL (client certificate).",
        "schema": {"type": ["string", "null"], "default": "PLAIN"},
    },
    "timeout": {
        "label": "Request timeout (s)",
        "description": "Timeout of every request to the broker, in seconds.",
        "schema": {"type": ["number", "null"], "default": 10},
    },
    "topology": {
        "label": "Topology over",
        "description": "stream (default) or amqp10: create/delete streams and super streams through "
        "RabbitMQ 4's AMQP 1.0 /management node.",
        "schema": {"type": ["string", "null"], "default": "stream"},
    },
    "amqp_port": {
        "label": "AMQP 1.0 port",
        "description": "Port of the AMQP 1.0 listener for topology: amqp10 (default 5672, 5671 with TLS).",
        "schema": {"type": ["integer", "null"]},
    },
}

MEWBASE_UI: dict[str, Any] = {
    "hidden-fields": ["schema"],
    "relabeling": {"login": "User", "password": "Password"},
    "placeholders": {
        "host": "127.0.0.1",
        "port": "(required: the protocol has no default port)",
        "login": "(optional) user name",
        "extra": '{"timeout": 10}',
    },
}

MEWBASE_FIELDS: dict[str, Any] = {
    "timeout": {
        "label": "Request timeout (s)",
        "description": "Timeout of every request to the server, in seconds.",
        "schema": {"type": ["number", "null"], "default": 10},
    },
}

TUBEMQ_UI: dict[str, Any] = {
    "hidden-fields": ["schema", "port"],
    "relabeling": {"host": "Master list", "login": "User", "password": "Secret"},
    "placeholders": {
        "host": "master1:8715,master2:8715",
        "login": "(optional) user name for authenticated masters",
        "extra": '{"timeout": 10}',
    },
}

TUBEMQ_FIELDS: dict[str, Any] = {
    "timeout": {
        "label": "Request timeout (s)",
        "description": "Timeout of every request to a master, in seconds.",
        "schema": {"type": ["number", "null"], "default": 10},
    },
}

LEDGER_UI: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {"schema": "Database / SQLite file"},
    "placeholders": {
        "host": "db.example.internal (empty for SQLite)",
        "schema": "streamledger  or  /var/tmp/streamledger/ledger.sqlite",
        "extra": '{"dialect": "postgresql+psycopg"}',
    },
}

LEDGER_FIELDS: dict[str, Any] = {
    "url": {
        "label": "SQLAlchemy URL",
        "description": "Full URL; wins over the other fields (stored as a secret because it may hold one).",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "dialect": {
        "label": "SQLAlchemy dialect",
        "description": "Driver used with host/login/schema, e.g. postgresql+psycopg.",
        "schema": {"type": ["string", "null"], "default": "postgresql+psycopg"},
    },
}


def field_behaviour(ui: dict[str, Any]) -> dict[str, Any]:
    """A hook's ``get_ui_field_behaviour()`` from the provider's declarative ``ui-field-behaviour``
    (one source for both: the hooks' forms and the provider info say the same)."""
    return {"hidden_fields": ui["hidden-fields"], "relabeling": ui["relabeling"],
            "placeholders": ui["placeholders"]}


def get_provider_info() -> dict[str, Any]:
    """What ``airflow providers list`` and the connection form know about streamledger."""
    return {
        "package-name": "streamledger",
        "name": "streamledger",
        "description": (
            "Auditable bounded batch reads from RabbitMQ Streams and mewbase channels (and TubeMQ) "
            "with an offset ledger."
        ),
        "versions": [_VERSION],
        "integrations": [
            {"integration-name": "RabbitMQ Streams", "tags": ["service"]},
            {"integration-name": "streamledger ledger", "tags": ["software"]},
            {"integration-name": "mewbase", "tags": ["service"]},
            {"integration-name": "TubeMQ", "tags": ["service"]},
        ],
        "hooks": [
            {
                "integration-name": "RabbitMQ Streams",
                "python-modules": ["streamledger.hooks.rabbitmq_stream"],
            },
            {"integration-name": "streamledger ledger", "python-modules": ["streamledger.hooks.ledger"]},
            {"integration-name": "mewbase", "python-modules": ["streamledger.hooks.mewbase"]},
            {"integration-name": "TubeMQ", "python-modules": ["streamledger.hooks.tubemq"]},
        ],
        "operators": [
            {
                "integration-name": "RabbitMQ Streams",
                "python-modules": ["streamledger.operators.batch", "streamledger.operators.streams"],
            },
            {"integration-name": "streamledger ledger", "python-modules": ["streamledger.operators.audit"]},
        ],
        "sensors": [
            {"integration-name": "RabbitMQ Streams", "python-modules": ["streamledger.sensors.backlog"]},
        ],
        "triggers": [
            {
                "integration-name": "RabbitMQ Streams",
                "python-modules": ["streamledger.triggers.backlog", "streamledger.triggers.new_data"],
            },
        ],
        # Event-driven scheduling: MessageQueueTrigger(scheme="rabbitmq-stream", ...) of the
        # common-messaging provider (skipped by Airflow when that provider is not installed).
        "queues": [
            "streamledger.queues.rabbitmq_stream.RabbitMQStreamMessageQueueProvider",
            "streamledger.queues.rabbitmq_stream.MewbaseMessageQueueProvider",
        ],
        "connection-types": [
            {
                "connection-type": "rabbitmq_stream",
                "hook-class-name": "streamledger.hooks.rabbitmq_stream.RabbitMQStreamHook",
                "hook-name": "RabbitMQ Stream",
                "ui-field-behaviour": RABBITMQ_STREAM_UI,
                "conn-fields": RABBITMQ_STREAM_FIELDS,
            },
            {
                "connection-type": "mewbase",
                "hook-class-name": "streamledger.hooks.mewbase.MewbaseHook",
                "hook-name": "mewbase",
                "ui-field-behaviour": MEWBASE_UI,
                "conn-fields": MEWBASE_FIELDS,
            },
            {
                "connection-type": "streamledger_ledger",
                "hook-class-name": "streamledger.hooks.ledger.OffsetLedgerHook",
                "hook-name": "streamledger offset ledger",
                "ui-field-behaviour": LEDGER_UI,
                "conn-fields": LEDGER_FIELDS,
            },
            {
                "connection-type": "tubemq",
                "hook-class-name": "streamledger.hooks.tubemq.TubeMQHook",
                "hook-name": "TubeMQ",
                "ui-field-behaviour": TUBEMQ_UI,
                "conn-fields": TUBEMQ_FIELDS,
            },
        ],
        # The "Stream ledger" UI page; the airflow.plugins entry point registers it too (Airflow
        # reads this list only when providers are not discovered lazily).
        "plugins": [
            {"name": "streamledger", "plugin-class": "streamledger.plugins.ledger_ui.StreamLedgerPlugin"},
        ],
        "config": {
            "streamledger": {
                "description": "Settings of the streamledger provider's Stream ledger UI page.\n",
                "options": {
                    "ui_ledger_conn_id": {
                        "description": "Connection (type streamledger_ledger) of the ledger the Stream "
                        "ledger page shows. Empty: STREAMLEDGER_LEDGER_URL, else the SQLite file under "
                        "STREAMLEDGER_HOME (the example DAGs' default).\n",
                        "version_added": None,
                        "type": "string",
                        "example": "streamledger_ledger_default",
                        "default": "",
                    },
                    "ui_stale_after": {
                        "description": "Seconds after which a claim not heard from shows as stuck on the "
                        "page.\n",
                        "version_added": None,
                        "type": "float",
                        "example": "600",
                        "default": "3600",
                    },
                },
            },
        },
        # Only offered when the ledger's migrations ship with the package, so a partial install
        # never breaks `airflow db migrate`.
        "db-managers": (
            ["streamledger.hooks.airflow_db_manager.LedgerDBManager"]
            if os.path.exists(os.path.join(os.path.dirname(__file__), "migrations", "env.py"))
            else []
        ),
    }
