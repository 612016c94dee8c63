"""Airflow hook for RabbitMQ Streams: turns an Airflow connection into a broker URL and a client.

Connection fields: host, port (5552; 5551 for TLS), login, password, schema = virtual host (default
``/``). Extra: ``tls`` (bool), ``ca_file``, ``cert_file``, ``key_file``, ``verify`` (bool),
``sasl_mechanism`` (``PLAIN`` | ``EXTERNAL``), ``timeout`` (seconds), ``topology`` (``stream``, the
default, or ``amqp10``: the create/delete operators then manage topology over AMQP 1.0 through
RabbitMQ 4's ``/management`` node), ``amqp_port`` (5672; 5671 for TLS) and ``nodes`` (a cluster's
other nodes, ``host:port,host:port``, tried in order when the host does not answer). A connection URI such as
``rabbitmq-stream://user:pass@host:5552/vhost?tls=true`` works as well (Airflow turns the query into
extra). The password, its encoded forms and the URLs holding it are registered with Airflow's secret
masker (:mod:`streamledger.hooks.masking`) and never logged by this module.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from airflow.sdk import BaseHook

from streamledger.hooks.masking import mask_password, mask_url
from streamledger.provider import RABBITMQ_STREAM_UI, field_behaviour
from streamledger.sources import UnsupportedSource, conn_kind

if TYPE_CHECKING:
    from streamledger.protocol.amqp10 import Management
    from streamledger.protocol.rabbitmq import StreamClient
    from streamledger.topology import Topology

_TRUE = {"1", "true", "yes", "on"}


def _flag(value: Any, default: bool) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in _TRUE


def connection_url(
    *,
    host: str | None,
    port: int | None,
    login: str | None,
    password: str | None,
    vhost: str | None,
    extra: dict[str, Any],
) -> str:
    """Build the client URL from connection parts (pure, so it is unit-testable)."""
    tls = _flag(extra.get("tls"), False)
    scheme = "rabbitmq-stream+tls" if tls else "rabbitmq-stream"
    user = quote(login or "guest", safe="")
    secret = quote(password if password is not None else ("" if login else "guest"), safe="")
    vh = quote(vhost or "/", safe="")
    server = host or "127.0.0.1"
    if ":" in server:
        server = f"[{server}]"
    url = f"{scheme}://{user}:{secret}@{server}:{int(port or (5551 if tls else 5552))}/{vh}"
    query: dict[str, str] = {}
    if extra.get("nodes"):
        query["nodes"] = str(extra["nodes"])
    if tls:
        for name in ("ca_file", "cert_file", "key_file", "server_hostname"):
            if extra.get(name):
                query[name] = str(extra[name])
        if not _flag(extra.get("verify"), True):
            query["verify"] = "false"
        if str(extra.get("sasl_mechanism") or "PLAIN").upper() == "EXTERNAL":
            query["auth"] = "external"
    elif str(extra.get("sasl_mechanism") or "PLAIN").upper() == "EXTERNAL":
        raise ValueError("sasl_mechanism EXTERNAL needs tls=true and a client certificate")
    return url + ("?" + urlencode(query) if query else "")


def amqp10_url(
    *,
    host: str | None,
    login: str | None,
    password: str | None,
    vhost: str | None,
    extra: dict[str, Any],
) -> str:
    """The AMQP 1.0 URL of the same broker (``amqp_port`` from extra; TLS options carried over)."""
    tls = _flag(extra.get("tls"), False)
    user = quote(login or "guest", safe="")
    secret = quote(password if password is not None else ("" if login else "guest"), safe="")
    server = host or "127.0.0.1"
    if ":" in server:
        server = f"[{server}]"
    port = int(extra.get("amqp_port") or (5671 if tls else 5672))
    url = f"{'amqps' if tls else 'amqp'}://{user}:{secret}@{server}:{port}/{quote(vhost or '/', safe='')}"
    query: dict[str, str] = {}
    if tls:
        for name in ("ca_file", "cert_file", "key_file", "server_hostname"):
            if extra.get(name):
                query[name] = str(extra[name])
        if not _flag(extra.get("verify"), True):
            query["verify"] = "false"
        if str(extra.get("sasl_mechanism") or "PLAIN").upper() == "EXTERNAL":
            query["auth"] = "external"
    return url + ("?" + urlencode(query) if query else "")


class RabbitMQStreamHook(BaseHook):
    """Builds a :class:`~streamledger.protocol.rabbitmq.StreamClient` from an Airflow connection.

    :param rabbitmq_stream_conn_id: connection id (default ``rabbitmq_stream_default``).
    """

    conn_name_attr = "rabbitmq_stream_conn_id"
    default_conn_name = "rabbitmq_stream_default"
    conn_type = "rabbitmq_stream"
    hook_name = "RabbitMQ Stream"

    def __init__(self, rabbitmq_stream_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Same data as the provider's declarative ``ui-field-behaviour`` (one source of truth)."""
        return field_behaviour(RABBITMQ_STREAM_UI)

    @cached_property
    def _connection(self) -> Any:
        conn = self.get_connection(self.rabbitmq_stream_conn_id)
        kind = conn_kind(conn.conn_type)
        if kind is not None and kind.name != "rabbitmq":  # e.g. topology asked of a mewbase connection
            raise UnsupportedSource(
                f"connection {self.rabbitmq_stream_conn_id!r} names a {kind.name} {kind.unit}; "
                "this needs a rabbitmq_stream connection"
            )
        return conn

    @property
    def timeout(self) -> float:
        return float(self._connection.extra_dejson.get("timeout") or 10.0)

    def get_url(self) -> str:
        """The broker URL including the password: pass it on, never log it."""
        conn = self._connection
        mask_password(conn.password)
        url = connection_url(
            host=conn.host, port=conn.port, login=conn.login, password=conn.password,
            vhost=conn.schema, extra=conn.extra_dejson,
        )
        mask_url(url)
        return url

    def broker_identity(self, client: StreamClient | None = None) -> str:
        """A credential-free broker name, as the ledger records it: the cluster name the broker
        reports (asked over ``client``, or a short connection of its own)."""
        from streamledger.batch import broker_identity

        if client is not None:
            return broker_identity(self.get_url(), client.cluster_name)
        with self.get_conn() as own:
            return broker_identity(self.get_url(), own.cluster_name)

    def get_conn(self) -> StreamClient:
        """A connected client; the caller closes it (it is a context manager)."""
        from streamledger.protocol.rabbitmq import StreamClient

        return StreamClient.connect(self.get_url(), timeout=self.timeout)

    @property
    def topology_over_amqp10(self) -> bool:
        """Whether extra ``topology`` is ``amqp10`` (create/delete go through RabbitMQ 4's /management)."""
        value = str(self._connection.extra_dejson.get("topology") or "stream").strip().lower()
        if value not in ("stream", "amqp10"):
            raise ValueError(f"connection extra topology={value!r}: use stream or amqp10")
        return value == "amqp10"

    def get_management(self) -> Management:
        """An AMQP 1.0 topology client for the same broker; the caller closes it (context manager)."""
        from streamledger.protocol.amqp10 import Management

        conn = self._connection
        mask_password(conn.password)
        url = amqp10_url(host=conn.host, login=conn.login, password=conn.password, vhost=conn.schema,
                         extra=conn.extra_dejson)
        mask_url(url)
        return Management.connect(url, timeout=self.timeout)

    def get_topology(self) -> Topology:
        """The connection's topology transport (extra ``topology``), as one interface: the stream
        protocol, or AMQP 1.0 with this connection's stream endpoint to list super stream
        partitions. The caller closes it (context manager)."""
        from streamledger.topology import Amqp10Topology, StreamTopology

        if self.topology_over_amqp10:
            return Amqp10Topology(self.get_management(), stream_url=self.get_url(), timeout=self.timeout)
        return StreamTopology(self.get_conn())

    def test_connection(self) -> tuple[bool, str]:
        """Open a connection and report the broker version (used by the UI's Test button)."""
        try:
            with self.get_conn() as client:
                version = client.server_version or "unknown version"
            message = f"Connected to RabbitMQ {version} at {self.broker_identity(client)}"
            if self.topology_over_amqp10:  # the operators will need the AMQP 1.0 port as well
                with self.get_management() as m:
                    message += f"; AMQP 1.0 topology via {m.connection.params.redacted()}"
            return True, message
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
