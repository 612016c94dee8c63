"""The broker fixtures deliver what they promise: reachable brokers of the right versions, a TLS
listener with the test PKI, and working cleanup. Kept fast and free of the project's client (a few
raw frames built here), so a broken client can never make the brokers look broken."""

from __future__ import annotations

import socket
import ssl
import struct

import pytest

from tests.support.rabbitmq import Broker, StreamNames, TlsSetup, make_super_stream_310, port_open

pytestmark = pytest.mark.rabbitmq

OK = 0x01


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


class _RawConn:
    """Just enough of the stream protocol to ask a broker who it is and log in."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._corr = 0

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            part = self._sock.recv(n - len(buf))
            if not part:
                raise ConnectionError(f"broker closed the connection after {len(buf)} of {n} bytes")
            buf += part
        return buf

    def request(self, key: int, payload: bytes = b"") -> tuple[int, bytes]:
        """Send one request; return (response code, rest) of its response, skipping other frames."""
        self._corr += 1
        body = struct.pack(">HHI", key, 1, self._corr) + payload
        self._sock.sendall(struct.pack(">I", len(body)) + body)
        while True:
            (size,) = struct.unpack(">I", self._recv_exact(4))
            frame = self._recv_exact(size)
            rkey, _ver = struct.unpack_from(">HH", frame)
            if rkey & 0x7FFF == key:
                corr, code = struct.unpack_from(">IH", frame, 4)
                assert corr == self._corr
                return code, frame[10:]

    def peer_properties(self) -> dict[str, str]:
        code, rest = self.request(0x0011, struct.pack(">i", 1) + _string("product") + _string("sl-tests"))
        assert code == OK
        return _read_map(rest)

    def sasl_mechanisms(self) -> list[str]:
        code, rest = self.request(0x0012)
        assert code == OK
        (count,) = struct.unpack_from(">i", rest)
        out, pos = [], 4
        for _ in range(count):
            s, pos = _read_string(rest, pos)
            out.append(s)
        return out

    def authenticate(self, mechanism: str, data: bytes) -> int:
        code, _ = self.request(0x0013, _string(mechanism) + struct.pack(">i", len(data)) + data)
        return code

    def open_guest(self) -> None:
        """Log in as guest, answer the broker's Tune and open the default vhost."""
        self.peer_properties()
        assert "PLAIN" in self.sasl_mechanisms()
        assert self.authenticate("PLAIN", b"\x00guest\x00guest") == OK
        (size,) = struct.unpack(">I", self._recv_exact(4))
        tune = self._recv_exact(size)
        assert struct.unpack_from(">H", tune)[0] == 0x0014, tune
        self._sock.sendall(struct.pack(">I", size) + tune)
        code, _ = self.request(0x0015, _string("/"))
        assert code == OK

    def create_stream(self, name: str) -> int:
        code, _ = self.request(0x000D, _string(name) + struct.pack(">i", 0))
        return code


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">h", buf, pos)
    return buf[pos + 2 : pos + 2 + n].decode(), pos + 2 + n


def _read_map(buf: bytes) -> dict[str, str]:
    (count,) = struct.unpack_from(">i", buf)
    out, pos = {}, 4
    for _ in range(count):
        k, pos = _read_string(buf, pos)
        v, pos = _read_string(buf, pos)
        out[k] = v
    return out


def _tls_context(ca_file: object, cert: object = None, key: object = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def test_broker_is_reachable_and_of_the_right_version(any_broker: Broker) -> None:
    assert any_broker.url == f"rabbitmq-stream://guest:guest@127.0.0.1:{any_broker.stream_port}/"
    for port in (any_broker.stream_port, any_broker.amqp_port, any_broker.mgmt_port):
        assert port_open(any_broker.host, port), f"{any_broker.version}: port {port} closed"
    assert any_broker.cli("rabbitmqctl", "-q", "version").strip().startswith(any_broker.version + ".")
    with socket.create_connection((any_broker.host, any_broker.stream_port), timeout=10) as sock:
        props = _RawConn(sock).peer_properties()
    assert props["version"].startswith(any_broker.version + "."), props


def test_plain_login_on_the_stream_port(any_broker: Broker) -> None:
    with socket.create_connection((any_broker.host, any_broker.stream_port), timeout=10) as sock:
        conn = _RawConn(sock)
        conn.peer_properties()
        assert "PLAIN" in conn.sasl_mechanisms()
        assert conn.authenticate("PLAIN", b"\x00guest\x00guest") == OK


def test_rabbitmq_url_is_reachable(rabbitmq_url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(rabbitmq_url)
    assert parts.hostname and parts.port
    assert port_open(parts.hostname, parts.port)


def test_tls_listener_presents_the_server_cert_signed_by_the_ca(rabbitmq_tls: TlsSetup) -> None:
    ctx = _tls_context(rabbitmq_tls.ca_file)  # verifies the chain and that the name is "localhost"
    with (
        socket.create_connection((rabbitmq_tls.host, rabbitmq_tls.port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=rabbitmq_tls.host) as tls,
    ):
        cert = tls.getpeercert()
        props = _RawConn(tls).peer_properties()
    assert cert is not None
    assert (("commonName", "localhost"),) in cert["subject"]
    assert ("IP Address", "127.0.0.1") in cert["subjectAltName"]
    assert props["version"].startswith("4.3.")
    # The IP SAN lets clients that follow advertised_host (127.0.0.1) verify the name too.
    with (
        socket.create_connection(("127.0.0.1", rabbitmq_tls.port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1"),
    ):
        pass


def test_tls_with_the_wrong_ca_is_rejected(rabbitmq_tls: TlsSetup) -> None:
    ctx = _tls_context(rabbitmq_tls.wrong_ca_file)
    with (
        socket.create_connection((rabbitmq_tls.host, rabbitmq_tls.port), timeout=10) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        ctx.wrap_socket(raw, server_hostname=rabbitmq_tls.host)


def test_tls_plain_and_external_logins(rabbitmq_tls: TlsSetup) -> None:
    plain_ctx = _tls_context(rabbitmq_tls.ca_file)
    with (
        socket.create_connection((rabbitmq_tls.host, rabbitmq_tls.port), timeout=10) as raw,
        plain_ctx.wrap_socket(raw, server_hostname=rabbitmq_tls.host) as tls,
    ):
        conn = _RawConn(tls)
        conn.peer_properties()
        assert "PLAIN" in conn.sasl_mechanisms()
        assert conn.authenticate("PLAIN", b"\x00guest\x00guest") == OK

    cert_ctx = _tls_context(rabbitmq_tls.ca_file, rabbitmq_tls.client_cert, rabbitmq_tls.client_key)
    with (
        socket.create_connection((rabbitmq_tls.host, rabbitmq_tls.port), timeout=10) as raw,
        cert_ctx.wrap_socket(raw, server_hostname=rabbitmq_tls.host) as tls,
    ):
        conn = _RawConn(tls)
        conn.peer_properties()
        assert "EXTERNAL" in conn.sasl_mechanisms()
        assert conn.authenticate("EXTERNAL", b"") == OK


def test_external_user_exists_with_permissions(broker_43: Broker, rabbitmq_tls: TlsSetup) -> None:
    perms = broker_43.cli("rabbitmqctl", "-q", "list_user_permissions", rabbitmq_tls.external_user)
    assert ".*\t.*\t.*" in perms


def test_stream_names_are_unique_and_cleaned_up(broker_310: Broker, stream_name: StreamNames) -> None:
    a, b = stream_name(), stream_name("orders")
    assert a != b and a.startswith("t-stream-names-are-unique") and "-orders-" in b
    # A super stream made through the CLI (3.10 has no CreateSuperStream frame).
    sup = stream_name.super_stream()
    partitions = make_super_stream_310(broker_310, sup, 2)
    queues = broker_310.cli("rabbitmqctl", "-q", "list_queues", "name", "type", "--no-table-headers")
    for p in partitions:
        assert f"{p}\tstream" in queues
    stream_name.cleanup()
    queues = broker_310.cli("rabbitmqctl", "-q", "list_queues", "name", "--no-table-headers")
    assert not any(p in queues for p in partitions)


def test_cleanup_deletes_streams_and_super_streams_on_a_broker_with_the_wire_commands(
    broker_43: Broker, stream_name: StreamNames
) -> None:
    """4.3 has Delete and DeleteSuperStream on the wire: cleanup uses them, not a CLI call per name."""
    plain = stream_name("plain")
    sup = stream_name.super_stream()
    partitions = make_super_stream_310(broker_43, sup, 2)
    with socket.create_connection((broker_43.host, broker_43.stream_port), timeout=10) as sock:
        conn = _RawConn(sock)
        conn.open_guest()
        assert conn.create_stream(plain) == OK
    queues = broker_43.cli("rabbitmqctl", "-q", "list_queues", "name", "--no-table-headers").split()
    assert {plain, *partitions} <= set(queues)
    stream_name.cleanup()
    queues = broker_43.cli("rabbitmqctl", "-q", "list_queues", "name", "--no-table-headers").split()
    assert not {plain, *partitions} & set(queues)
