"""The audit's one-broker finding (migration 0016) with a read-only ledger
user on PostgreSQL: two names of one broker (the 4.3 server) each read [0, 3) of one stream, with the
chunk prints a batch records; the audit given the broker finds the overlap and tries to record it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, RunIdentity, SourceRef
from streamledger.offsets import ChunkPrint
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.spark.helpers import create_stream

pytestmark = pytest.mark.timeout(120)

EAST, WEST = "rabbitmq://east/%2F", "rabbitmq://west/%2F"


@pytest.fixture
def reader_url(postgres_url: str) -> Iterator[str]:
    """A URL of the ledger's database for a role that may only read it."""
    import psycopg
    from psycopg import sql

    Ledger(postgres_url, create=True).engine.dispose()
    role = f"sl_reader_{uuid.uuid4().hex[:8]}"
    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'reader'").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(
            sql.Identifier(role)))
    parts = urlsplit(postgres_url)
    try:
        yield f"postgresql+psycopg://{role}:reader@{parts.hostname}:{parts.port}{parts.path}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_read_only_audit_reports_two_names_of_one_broker_and_records_nothing(
    postgres_url: str, reader_url: str, rabbitmq_url: str, stream_name: object,
) -> None:
    """Promise kept: the finding is reported, the record it cannot write is only warned about, and a
    later audit with a writing user records it."""
    s = stream_name("s12-ro")  # type: ignore[operator]
    create_stream(rabbitmq_url, s, 3)
    writer = Ledger(postgres_url)
    with StreamClient.connect(rabbitmq_url) as client:
        chunk = ChunkPrint.of(client.chunk_at(s, 0))
        for name in (EAST, WEST):
            rng = writer.claim("p-ro", SourceRef(name, s), 3, RunIdentity("d", name[11:15], "t"),
                               initial_start=0)
            writer.commit(rng.id, records=3, first_seen=0, last_seen=2, output=None, chunk=chunk)
        reader = Ledger(reader_url)
        report = audit(reader, "p-ro", broker=client)  # the broker stores no offset here: drift too
        assert "overlap" in [v.kind.value for v in report.violations], report.to_text()
        assert writer.same_broker("p-ro") == []
        again = audit(writer, "p-ro", broker=client)
        assert "overlap" in [v.kind.value for v in again.violations], again.to_text()
        assert {(r.source.broker, r.other) for r in writer.same_broker("p-ro")} == {(EAST, WEST),
                                                                                  (WEST, EAST)}
