"""Broker URLs: ``rabbitmq-stream://user:pass@host:port/vhost`` and ``rabbitmq-stream+tls://…``.

The parsed :class:`ConnectionParams` is what every connection is built from. Its ``repr`` and
:meth:`ConnectionParams.redacted` never show the password, so it is safe in logs and errors.
TLS options travel as query parameters (``ca_file``, ``cert_file``, ``key_file``, ``verify``,
``server_hostname``) and ``auth=external`` selects SASL EXTERNAL (client-certificate login).
``nodes=host:port,host:port`` names a cluster's other nodes, tried in order when the URL's own does
not accept a connection: the node a URL names may be the one stopped for maintenance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from streamledger.protocol.rabbitmq.constants import DEFAULT_PORT, DEFAULT_TLS_PORT
from streamledger.protocol.rabbitmq.errors import InvalidRequest

SCHEME = "rabbitmq-stream"
TLS_SCHEME = "rabbitmq-stream+tls"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_KNOWN_QUERY = {"ca_file", "cert_file", "key_file", "verify", "server_hostname", "auth", "heartbeat",
                "connection_name", "frame_max", "nodes"}


@dataclass(frozen=True, slots=True)
class ConnectionParams:
    """Everything needed to open one connection; immutable so it can be shared by readers."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    vhost: str = "/"
    username: str = "guest"
    password: str = field(default="guest", repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    server_hostname: str | None = None
    auth: Literal["plain", "external"] = "plain"
    heartbeat: int = 60
    frame_max: int = 0  # 0 = accept the server's value (spec advice, section 2)
    connection_name: str | None = None
    fallbacks: tuple[tuple[str, int], ...] = ()
    """More nodes of the same cluster (``nodes=``), tried in order when ``host:port`` refuses."""

    def __repr__(self) -> str:
        return f"ConnectionParams({self.redacted()!r})"

    def redacted(self) -> str:
        """The URL with the password replaced, fit for logs and error messages."""
        scheme = TLS_SCHEME if self.tls else SCHEME
        user = quote(self.username, safe="")
        vhost = "" if self.vhost == "/" else quote(self.vhost, safe="")
        return f"{scheme}://{user}:***@{host_port(self.host, self.port)}/{vhost}"

    @property
    def address(self) -> str:
        """``host:port`` for messages about connectivity."""
        return f"{self.host}:{self.port}"

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Where a connection is tried, in order: ``host:port``, then the fallbacks."""
        return [(self.host, self.port), *self.fallbacks]

    def replace(self, **changes: object) -> ConnectionParams:
        """A copy with some fields changed (used to follow advertised host/port). A copy naming
        another host or port has no fallbacks unless given: a connection to a stream's member
        must reach that member, never another node."""
        if ("host" in changes or "port" in changes) and "fallbacks" not in changes:
            changes["fallbacks"] = ()
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _flag(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidRequest(f"URL query parameter {name}={value!r} is not a boolean (use true/false)")


def _int(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidRequest(f"URL query parameter {name}={value!r} is not an integer") from None
    if number < 0:
        raise InvalidRequest(f"URL query parameter {name} must not be negative")
    return number


def _nodes(value: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` (an IPv6 host in brackets) of ``nodes=``."""
    out = []
    for item in value.split(","):
        host, sep, port = item.strip().rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidRequest(f"URL query parameter nodes: {item.strip()!r} is not host:port "
                                 "(nodes=host:port,host:port)")
        out.append((host, int(port)))
    return tuple(out)


def parse_url(url: str) -> ConnectionParams:
    """Parse a broker URL (percent-decoding user, password and vhost; default vhost ``/``)."""
    try:
        parts = urlsplit(url)
        port_value = parts.port
    except ValueError as exc:
        # urlsplit messages can echo the netloc, which holds the password: keep them out.
        raise InvalidRequest("invalid broker URL: its port is not a number in 0..65535 or its host is "
                             "malformed") from exc
    if parts.scheme not in (SCHEME, TLS_SCHEME):
        raise InvalidRequest(
            f"unsupported URL scheme {parts.scheme!r}: use {SCHEME}://user:pass@host:port/vhost "
            f"or {TLS_SCHEME}://…"
        )
    tls = parts.scheme == TLS_SCHEME
    if not parts.hostname:
        raise InvalidRequest("broker URL has no host")
    path = parts.path
    vhost = "/" if path in ("", "/") else unquote(path[1:])
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - _KNOWN_QUERY)
    if unknown:
        raise InvalidRequest(f"unknown broker URL query parameter(s): {', '.join(unknown)}")
    auth = query.get("auth", "plain").lower()
    if auth not in ("plain", "external"):
        raise InvalidRequest(f"URL query parameter auth={auth!r}: use plain or external")
    if auth == "external" and not tls:
        raise InvalidRequest(
            "auth=external needs a TLS URL (rabbitmq-stream+tls://) and a client certificate"
        )
    if "key_file" in query and "cert_file" not in query:
        raise InvalidRequest("URL query parameter key_file needs cert_file")
    for name in ("ca_file", "cert_file", "key_file", "verify", "server_hostname"):
        if name in query and not tls:
            raise InvalidRequest(f"URL query parameter {name} only applies to {TLS_SCHEME}:// URLs")
    username = unquote(parts.username) if parts.username is not None else "guest"
    password = unquote(parts.password) if parts.password is not None else ("" if parts.username else "guest")
    return ConnectionParams(
        host=parts.hostname,
        port=port_value if port_value is not None else (DEFAULT_TLS_PORT if tls else DEFAULT_PORT),
        vhost=vhost,
        username=username,
        password=password,
        tls=tls,
        ca_file=query.get("ca_file") or None,
        cert_file=query.get("cert_file") or None,
        key_file=query.get("key_file") or None,
        verify=_flag("verify", query["verify"]) if "verify" in query else True,
        server_hostname=query.get("server_hostname") or None,
        auth="external" if auth == "external" else "plain",
        heartbeat=_int("heartbeat", query["heartbeat"]) if "heartbeat" in query else 60,
        frame_max=_int("frame_max", query["frame_max"]) if "frame_max" in query else 0,
        connection_name=query.get("connection_name") or None,
        fallbacks=_nodes(query["nodes"]) if "nodes" in query else (),
    )


def to_params(url: str | ConnectionParams) -> ConnectionParams:
    """Accept either form wherever a broker is named."""
    return url if isinstance(url, ConnectionParams) else parse_url(url)
