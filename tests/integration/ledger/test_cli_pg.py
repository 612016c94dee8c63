"""`streamledger ledger` on PostgreSQL, with the broker drift check against a real RabbitMQ broker."""

from __future__ import annotations

import json

import pytest

from streamledger.cli import main
from streamledger.ledger import Ledger, SourceRef
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.sources import source_identity
from tests.unit.ledger.util import run

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


def test_audit_against_the_broker_stored_offset(
    capsys: pytest.CaptureFixture[str], postgres_url: str, rabbitmq_url: str, stream_name: object
) -> None:
    stream = stream_name()  # type: ignore[operator]
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        published = client.publish(stream, [f"m{i}".encode() for i in range(5)])
        assert published.confirmed == 5
        client.store_offset_verified(stream, "pipe", 4)
        identity = source_identity(rabbitmq_url, client.cluster_name)  # as the batch records it

    assert main(["ledger", "upgrade", "--db", postgres_url]) == 0
    ledger = Ledger(postgres_url)
    src = SourceRef(identity, stream)
    r = ledger.claim("pipe", src, 5, run(1), initial_start=0)
    ledger.commit(r.id, records=5, first_seen=0, last_seen=4, output=None)
    ledger.mark_offset_stored(r.id, True)
    capsys.readouterr()

    rc = main(["ledger", "audit", "--db", postgres_url, "--pipeline", "pipe", "--broker-url", rabbitmq_url,
               "--no-outputs"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "broker offsets: checked" in out and "CLEAN" in out

    with StreamClient.connect(rabbitmq_url) as client:
        client.store_offset_verified(stream, "pipe", 2)  # someone rewound the consumer
    rc = main(["ledger", "audit", "--db", postgres_url, "--broker-url", rabbitmq_url, "--json",
               "--no-outputs"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [(v["kind"], v["stream"]) for v in report["violations"]] == [("broker_drift", stream)]
    assert "stores offset 2" in report["violations"][0]["detail"]
    assert rabbitmq_url.split("@")[0] not in json.dumps(report)  # no credentials in the report
    ledger.close()
