"""Airflow hook for a mewbase server: turns a ``mewbase`` connection into a URL and a log client.

Connection fields: host, port (required: the protocol names no default), login and password
(optional; mewbase has no virtual hosts, so schema is unused). Extra: ``timeout`` (seconds). A
connection URI ``mewbase://user:pass@host:port`` works as well. The client is a
:class:`~streamledger.protocol.mewbase.MewbaseLog`, the offset-addressed log the batch, the sensor
and the triggers read (:mod:`streamledger.sources`). The password and the URL holding it are
registered with Airflow's secret masker and never logged by this module.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseHook

from streamledger.hooks.masking import mask_password, mask_url
from streamledger.provider import MEWBASE_UI, field_behaviour
from streamledger.sources import UnsupportedSource

if TYPE_CHECKING:
    from streamledger.protocol.mewbase import MewbaseLog
    from streamledger.sources import OffsetLog


def connection_url(*, conn_id: str, host: str | None, port: int | None, login: str | None,
                   password: str | None) -> str:
    """``mewbase://[user[:pass]@]host:port`` from connection parts (pure, so it is unit-testable)."""
    if not port:
        raise UnsupportedSource(f"connection {conn_id!r}: a mewbase connection needs a port "
                                "(the protocol has no default)")
    server = host or "127.0.0.1"
    if ":" in server:
        server = f"[{server}]"
    auth = ""
    if login:
        auth = quote(login, safe="") + (f":{quote(password, safe='')}" if password else "") + "@"
    return f"mewbase://{auth}{server}:{int(port)}"


class MewbaseHook(BaseHook):
    """Builds a :class:`~streamledger.protocol.mewbase.MewbaseLog` from an Airflow connection.

    :param mewbase_conn_id: connection id (default ``mewbase_default``).
    """

    conn_name_attr = "mewbase_conn_id"
    default_conn_name = "mewbase_default"
    conn_type = "mewbase"
    hook_name = "mewbase"

    def __init__(self, mewbase_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mewbase_conn_id = mewbase_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Same data as the provider's declarative ``ui-field-behaviour`` (one source of truth)."""
        return field_behaviour(MEWBASE_UI)

    @cached_property
    def _connection(self) -> Any:
        return self.get_connection(self.mewbase_conn_id)

    @property
    def timeout(self) -> float:
        return float(self._connection.extra_dejson.get("timeout") or 10.0)

    def get_url(self) -> str:
        """The server URL including the password: pass it on, never log it."""
        conn = self._connection
        mask_password(conn.password)
        url = connection_url(conn_id=self.mewbase_conn_id, host=conn.host, port=conn.port,
                             login=conn.login, password=conn.password)
        mask_url(url)
        return url

    def broker_identity(self, client: OffsetLog | None = None) -> str:
        """The credential-free server name the ledger records (``mewbase://host:port``)."""
        from streamledger.sources import server_name, source_identity

        if client is not None:
            return source_identity(self.get_url(), server_name(client))
        with self.get_conn() as own:
            return source_identity(self.get_url(), server_name(own))

    def get_conn(self) -> MewbaseLog:
        """A connected log client; the caller closes it (it is a context manager)."""
        from streamledger.protocol.mewbase import MewbaseLog

        return MewbaseLog.connect(self.get_url(), timeout=self.timeout)

    def test_connection(self) -> tuple[bool, str]:
        """Open a connection (CONNECT and its answer) and name the server (the UI's Test button)."""
        try:
            with self.get_conn() as log:
                return True, f"Connected to mewbase at {self.broker_identity(log)}"
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
