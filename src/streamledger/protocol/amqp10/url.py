"""Broker URLs of the AMQP 1.0 client: ``amqp://user:pass@host:5672/vhost`` and ``amqps://…``.

The vhost is the path, percent-decoded (``/`` when empty; ``%2F`` for ``/`` itself). Query parameters:
``auth`` (``plain``, ``anonymous`` or ``external``; default ``plain`` with credentials, ``anonymous``
without), and for ``amqps`` ``ca_file``, ``cert_file``, ``key_file``, ``verify``, ``server_hostname``.
:meth:`Amqp10Params.redacted` and ``repr`` never show the password.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from streamledger.protocol.amqp10.errors import InvalidUrl

DEFAULT_PORT = 5672
DEFAULT_TLS_PORT = 5671
_KNOWN_QUERY = {"auth", "ca_file", "cert_file", "key_file", "verify", "server_hostname"}
_TLS_ONLY = ("ca_file", "cert_file", "key_file", "verify", "server_hostname")

Auth = Literal["plain", "anonymous", "external"]


@dataclass(frozen=True, slots=True)
class Amqp10Params:
    """Where and how to connect; immutable, safe to log (``repr`` hides the password)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    vhost: str = "/"
    username: str | None = "guest"
    password: str | None = field(default="guest", repr=False)
    tls: bool = False
    auth: Auth = "plain"
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    server_hostname: str | None = None

    def __repr__(self) -> str:
        return f"Amqp10Params({self.redacted()!r})"

    def redacted(self) -> str:
        """The URL with the password replaced by ``***``, fit for logs and error messages."""
        scheme = "amqps" if self.tls else "amqp"
        user = f"{quote(self.username, safe='')}:***@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        vhost = "" if self.vhost == "/" else quote(self.vhost, safe="")
        return f"{scheme}://{user}{host}:{self.port}/{vhost}"

    @property
    def address(self) -> str:
        """``host:port`` for messages about connectivity."""
        return f"{self.host}:{self.port}"


def parse_amqp_url(url: str) -> Amqp10Params:
    """Parse ``amqp[s]://[user[:pass]@]host[:port][/vhost][?query]``; :class:`InvalidUrl` if malformed."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:  # its text can echo the netloc, password included: keep it out
        raise InvalidUrl(f"invalid AMQP URL (bad host or port): {type(exc).__name__}") from None
    if parts.scheme not in ("amqp", "amqps"):
        raise InvalidUrl(
            f"unsupported URL scheme {parts.scheme!r}: use amqp://user:pass@host:5672/vhost or amqps://…"
        )
    if not parts.hostname:
        raise InvalidUrl("AMQP URL has no host")
    tls = parts.scheme == "amqps"
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - _KNOWN_QUERY)
    if unknown:
        raise InvalidUrl(f"unknown AMQP URL query parameter(s): {', '.join(unknown)}")
    for name in _TLS_ONLY:
        if name in query and not tls:
            raise InvalidUrl(f"AMQP URL query parameter {name} only applies to amqps:// URLs")
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    auth = query.get("auth", "plain" if username else "anonymous").lower()
    if auth not in ("plain", "anonymous", "external"):
        raise InvalidUrl(f"AMQP URL query parameter auth={auth!r}: use plain, anonymous or external")
    if auth == "plain" and not username:
        raise InvalidUrl("auth=plain needs a user name in the AMQP URL")
    if auth == "external" and not (tls and query.get("cert_file")):
        raise InvalidUrl("auth=external needs amqps:// and a client certificate (cert_file=…)")
    if "key_file" in query and "cert_file" not in query:
        raise InvalidUrl("AMQP URL query parameter key_file needs cert_file")
    verify_text = query.get("verify", "true").strip().lower()
    if verify_text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise InvalidUrl(f"AMQP URL query parameter verify={verify_text!r} is not a boolean")
    path = parts.path
    vhost = "/" if path in ("", "/") else unquote(path[1:])
    return Amqp10Params(
        host=parts.hostname,
        port=port if port is not None else (DEFAULT_TLS_PORT if tls else DEFAULT_PORT),
        vhost=vhost,
        username=username,
        password=password if password is not None else "",
        tls=tls,
        auth=auth,  # type: ignore[arg-type]
        ca_file=query.get("ca_file") or None,
        cert_file=query.get("cert_file") or None,
        key_file=query.get("key_file") or None,
        verify=verify_text in ("1", "true", "yes", "on"),
        server_hostname=query.get("server_hostname") or None,
    )


def to_params(url: str | Amqp10Params) -> Amqp10Params:
    """Accept either form wherever a broker is named."""
    return url if isinstance(url, Amqp10Params) else parse_amqp_url(url)
