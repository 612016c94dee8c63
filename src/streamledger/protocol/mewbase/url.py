"""Server URLs: ``mewbase://[user:pass@]host:port``.

:class:`MewbaseParams` is what a connection is built from. Its ``repr`` and :meth:`MewbaseParams.redacted`
never show the password, and parse errors never echo the URL, so both are safe in logs and errors.
The draft protocol names no default port, so the port is required (conventions, choice 12).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

from streamledger.protocol.mewbase import conventions as cv
from streamledger.protocol.mewbase.errors import InvalidRequest

__all__ = ["MewbaseParams", "parse_url"]


@dataclass(frozen=True, slots=True)
class MewbaseParams:
    """Host, port and optional credentials of one mewbase server."""

    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"MewbaseParams({self.redacted()!r})"

    @property
    def address(self) -> str:
        """``host:port`` for messages about connectivity."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def redacted(self) -> str:
        """The URL with the password replaced, fit for logs and error messages."""
        user = ""
        if self.username is not None:
            user = quote(self.username, safe="") + (":***" if self.password is not None else "") + "@"
        return f"{cv.URL_SCHEME}://{user}{self.address}"


def parse_url(url: str | MewbaseParams) -> MewbaseParams:
    """Parse ``mewbase://[user:pass@]host:port`` (user and password percent-encoded)."""
    if isinstance(url, MewbaseParams):
        return url
    text = url.strip()
    # Never echo the URL itself: it may hold a password.
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise InvalidRequest("mewbase URL is malformed (expected mewbase://[user:pass@]host:port)") from None
    if parts.scheme != cv.URL_SCHEME:
        raise InvalidRequest(f"mewbase URL must start with {cv.URL_SCHEME}://, got scheme {parts.scheme!r}")
    if not parts.hostname:
        raise InvalidRequest("mewbase URL has no host (expected mewbase://[user:pass@]host:port)")
    if port is None:
        raise InvalidRequest(
            f"mewbase URL for host {parts.hostname} has no port (the protocol has no default)"
        )
    if port == 0:
        raise InvalidRequest(f"mewbase URL for host {parts.hostname} has port 0")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidRequest(
            f"mewbase URL for {parts.hostname}:{port} must not have a path, query or fragment"
        )
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    if password is not None and not username:
        raise InvalidRequest(f"mewbase URL for {parts.hostname}:{port} has a password but no user name")
    return MewbaseParams(parts.hostname, port, username or None, password)
