"""The README's quickstart on a user's own servers: the broker and the ledger come from
``$STREAMLEDGER_BROKER_URL`` and ``$STREAMLEDGER_LEDGER_URL`` (a password never on the command line),
and the ledger is a new, empty PostgreSQL database. ``check`` must not call that database a failure
(the first ``batch run`` migrates it), and ``ledger audit`` must compare the broker's stored offsets
without the URL being repeated as a flag (issue 33, found following the quickstart)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamledger.ledger import Ledger, SourceRef
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.sources import source_identity
from tests.integration.cli.helpers import cli
from tests.unit.ledger.util import run

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


def test_check_calls_a_new_empty_database_ready_for_the_first_batch(postgres_url: str,
                                                                    rabbitmq_url: str) -> None:
    env = {"STREAMLEDGER_BROKER_URL": rabbitmq_url, "STREAMLEDGER_LEDGER_URL": postgres_url}
    r = cli("check", env=env)
    ledger_line = next(line for line in r.out.splitlines() if line.startswith("ledger"))
    assert ledger_line.split()[:2] == ["ledger", "ok"], r.out
    assert "batch run" in ledger_line and "Ledger(" not in ledger_line, ledger_line
    assert r.rc == 0, r.out + r.err


def test_audit_checks_the_broker_named_by_the_environment(postgres_url: str, rabbitmq_url: str,
                                                          stream_name: Any) -> None:
    stream = stream_name("audit-env")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        assert client.publish(stream, [f"m{i}".encode() for i in range(5)]).confirmed == 5
        client.store_offset_verified(stream, "pipe", 4)
        identity = source_identity(rabbitmq_url, client.cluster_name)
    ledger = Ledger(postgres_url, create=True)
    try:
        r0 = ledger.claim("pipe", SourceRef(identity, stream), 5, run(1), initial_start=0)
        ledger.commit(r0.id, records=5, first_seen=0, last_seen=4, output=None)
        ledger.mark_offset_stored(r0.id, True)
    finally:
        ledger.close()
    env = {"STREAMLEDGER_BROKER_URL": rabbitmq_url, "STREAMLEDGER_LEDGER_URL": postgres_url}

    r = cli("ledger", "audit", "--pipeline", "pipe", "--no-outputs", env=env)
    assert r.rc == 0, r.out + r.err
    assert "broker offsets: checked" in r.out, r.out

    with StreamClient.connect(rabbitmq_url) as client:
        client.store_offset_verified(stream, "pipe", 2)  # someone rewound the consumer
    r = cli("ledger", "audit", "--pipeline", "pipe", "--no-outputs", "--json", env=env)
    assert r.rc == 1, r.out + r.err
    assert [v["kind"] for v in json.loads(r.out)["violations"]] == ["broker_drift"]
