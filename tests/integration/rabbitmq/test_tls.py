"""TLS for real against the 4.3 broker's TLS stream listener and the test PKI: PLAIN over TLS,
SASL EXTERNAL with a client certificate, and clear failures for a wrong CA or a missing file."""

from __future__ import annotations

import pytest

from streamledger.protocol.rabbitmq import InvalidRequest, StreamClient, TlsError
from tests.support.rabbitmq import StreamNames, TlsSetup

pytestmark = pytest.mark.rabbitmq


def _url(tls: TlsSetup, query: str, creds: str = "guest:guest") -> str:
    return f"rabbitmq-stream+tls://{creds}@{tls.host}:{tls.port}/?{query}"


def test_plain_over_tls(rabbitmq_tls: TlsSetup, stream_name: StreamNames) -> None:
    name = stream_name("tls-plain")
    with StreamClient.connect(_url(rabbitmq_tls, f"ca_file={rabbitmq_tls.ca_file}")) as client:
        assert client.connection.advertised_address == ("127.0.0.1", rabbitmq_tls.port)
        client.create_stream(name)
        client.publish(name, [b"over-tls-%d" % i for i in range(500)])
        batches = list(client.read_range(name, 0, client.committed_tail(name)))  # reads over TLS too
        assert [body for b in batches for body in b.bodies] == [b"over-tls-%d" % i for i in range(500)]


def test_external_with_client_certificate(rabbitmq_tls: TlsSetup, stream_name: StreamNames) -> None:
    name = stream_name("tls-ext")
    query = (f"ca_file={rabbitmq_tls.ca_file}&cert_file={rabbitmq_tls.client_cert}"
             f"&key_file={rabbitmq_tls.client_key}&auth=external")
    # The user name in the URL is irrelevant: EXTERNAL logs in as the certificate's CN.
    with StreamClient.connect(_url(rabbitmq_tls, query, creds="ignored:ignored")) as client:
        client.create_stream(name)
        client.store_offset_verified(name, "cert-user", 0)
        assert client.query_offset(name, "cert-user") == 0


def test_wrong_ca_is_a_clear_error(rabbitmq_tls: TlsSetup) -> None:
    url = _url(rabbitmq_tls, f"ca_file={rabbitmq_tls.wrong_ca_file}", creds="guest:T0pS3cret")
    with pytest.raises(TlsError, match=r"TLS handshake with localhost:5551 failed: .*certificate") as info:
        StreamClient.connect(url, timeout=5)
    assert "T0pS3cret" not in str(info.value)


def test_missing_certificate_file(rabbitmq_tls: TlsSetup) -> None:
    with pytest.raises(InvalidRequest, match=r"TLS file not found: ca_file=/nonexistent/ca\.pem"):
        StreamClient.connect(_url(rabbitmq_tls, "ca_file=/nonexistent/ca.pem"), timeout=5)
