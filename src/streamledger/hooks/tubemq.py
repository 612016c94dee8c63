"""Airflow hook for TubeMQ: the connection's master list and auth, handed to the TubeMQ client.

Connection fields: host = comma-separated master list (``m1:8715,m2:8715``; a master without a
port gets 8715), login/password = optional user and secret for authenticated masters, extra
``timeout`` (seconds). The client module is imported lazily so the provider loads without it.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from streamledger.hooks.masking import mask_password
from streamledger.provider import TUBEMQ_UI, field_behaviour

if TYPE_CHECKING:
    from streamledger.protocol.tubemq import MasterClient

DEFAULT_MASTER_PORT = 8715


def parse_masters(text: str | None, default_port: int | None = None) -> list[tuple[str, int]]:
    """``"h1:p1, h2"`` -> ``[("h1", p1), ("h2", 8715)]``; a clear error for a bad entry."""
    port0 = default_port or DEFAULT_MASTER_PORT
    masters: list[tuple[str, int]] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, str(port0)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"TubeMQ master {item!r} is not host:port")
        masters.append((host, int(port)))
    if not masters:
        raise ValueError("TubeMQ connection has no masters (put host:port,host:port in the host field)")
    return masters


class TubeMQHook(BaseHook):
    """Gives operators the master list and credentials of a ``tubemq`` connection.

    :param tubemq_conn_id: connection id (default ``tubemq_default``).
    """

    conn_name_attr = "tubemq_conn_id"
    default_conn_name = "tubemq_default"
    conn_type = "tubemq"
    hook_name = "TubeMQ"

    def __init__(self, tubemq_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tubemq_conn_id = tubemq_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return field_behaviour(TUBEMQ_UI)

    def get_conn(self) -> dict[str, Any]:
        """``{"masters": [(host, port)...], "user": ..., "secret": ..., "timeout": s}`` for the client."""
        conn = self.get_connection(self.tubemq_conn_id)
        mask_password(conn.password)
        return {
            "masters": parse_masters(conn.host, conn.port),
            "user": conn.login or None,
            "secret": conn.password or None,
            "timeout": float(conn.extra_dejson.get("timeout") or 10.0),
        }

    def get_client(self, **options: Any) -> MasterClient:
        """A :class:`~streamledger.protocol.tubemq.MasterClient` for the connection's masters.

        ``options`` go to the client (heartbeat periods, retries); use it as a context manager so
        its registrations are closed.
        """
        from streamledger.protocol.tubemq import Credentials, MasterClient

        info = self.get_conn()
        credentials = Credentials(info["user"], info["secret"] or "") if info["user"] else None
        options.setdefault("rpc_timeout", info["timeout"])
        return MasterClient(info["masters"], credentials=credentials, **options)

    def test_connection(self) -> tuple[bool, str]:
        """Reachability of the masters: at least one accepts a TCP connection (no registration)."""
        try:
            info = self.get_conn()
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        errors = []
        for host, port in info["masters"]:
            try:
                with socket.create_connection((host, port), timeout=info["timeout"]):
                    return True, f"TubeMQ master {host}:{port} accepts connections"
            except OSError as exc:
                errors.append(f"{host}:{port}: {exc.strerror or exc}")
        return False, "no TubeMQ master reachable: " + "; ".join(errors)
