"""Airflow hook for the offset ledger: a :class:`~streamledger.ledger.Ledger` on its own engine.

Tasks must never write the ledger through Airflow's ORM session (Airflow 3 forbids direct metadata
DB access from tasks, and sharing Airflow's SQLite file locks under a real executor), so the ledger
always gets its own SQLAlchemy engine. Where the URL comes from, first match wins:

1. ``ledger_url`` given to the hook (templated in operators);
2. the connection ``ledger_conn_id``: extra ``url``, else ``{dialect}://login:password@host:port/schema``
   (dialect from extra, default ``postgresql+psycopg``), else ``sqlite:///<schema>`` when host is empty;
3. ``STREAMLEDGER_LEDGER_URL``;
4. the SQLite file ``$STREAMLEDGER_HOME/ledger.sqlite`` (default ``/var/tmp/streamledger``), the
   same default as the library and the CLI (``streamledger.ledger.engine.default_url``).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseHook

from streamledger.hooks.masking import mask_password, mask_url
from streamledger.provider import LEDGER_UI, field_behaviour

if TYPE_CHECKING:
    from streamledger.ledger import Ledger


def default_ledger_url() -> str:
    """``STREAMLEDGER_LEDGER_URL`` or the SQLite file under ``$STREAMLEDGER_HOME``: the library's one
    default, so the CLI's ``ledger audit`` without ``--ledger`` audits what the DAGs wrote."""
    from streamledger.ledger.engine import default_url

    return default_url()


def ledger_url_from_connection(
    *, host: str | None, port: int | None, login: str | None, password: str | None, schema: str | None,
    extra: dict[str, Any],
) -> str:
    """SQLAlchemy URL from connection parts (pure, unit-testable)."""
    if extra.get("url"):
        return str(extra["url"])
    if not host:
        if not schema:
            raise ValueError("ledger connection needs extra.url, a host, or a SQLite file path in schema")
        return f"sqlite:///{schema}"
    dialect = str(extra.get("dialect") or "postgresql+psycopg")
    auth = ""
    if login:
        auth = quote(login, safe="") + (":" + quote(password, safe="") if password else "") + "@"
    where = host + (f":{int(port)}" if port else "")
    return f"{dialect}://{auth}{where}/{schema or ''}"


_POLLING: dict[str, Ledger] = {}
_POLLING_LOCK = threading.Lock()


def polling_ledger(url: str) -> Ledger | None:
    """The ledger at ``url`` for read-only polling: one engine per URL and process, never migrated.

    Sensors and triggers ask every few seconds; building an engine and running the migrations on
    each check cost a connection pool and a schema lock per poll (and in the triggerer every
    watcher would do it). A SQLite file that does not exist yet means "no history" (``None``,
    nothing is created): the first batch creates it. Any other failure (schema missing or behind)
    raises the ledger's own one-line error and is not cached, so a later upgrade is picked up.
    """
    with _POLLING_LOCK:
        ledger = _POLLING.get(url)
        if ledger is not None:
            return ledger
        if url.startswith("sqlite:///"):
            path = url[len("sqlite:///"):].split("?", 1)[0]
            if path and path != ":memory:" and not os.path.exists(path):
                return None
        from streamledger.ledger import Ledger

        ledger = Ledger(url, create=False)
        _POLLING[url] = ledger
        return ledger


class OffsetLedgerHook(BaseHook):
    """Opens the offset ledger.

    :param ledger_conn_id: optional connection id (type ``streamledger_ledger`` or any with extra ``url``).
    :param ledger_url: SQLAlchemy URL; wins over the connection.
    :param upgrade: run the ledger's migrations on open (idempotent; on by default so a fresh SQLite
        file works out of the box).
    """

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "streamledger_ledger_default"
    conn_type = "streamledger_ledger"
    hook_name = "streamledger offset ledger"

    def __init__(
        self, ledger_conn_id: str | None = None, *, ledger_url: str | None = None, upgrade: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.upgrade = upgrade
        self._ledger: Ledger | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return field_behaviour(LEDGER_UI)

    def get_url(self) -> str:
        """The ledger URL; its password (every form) is registered with the secret masker first."""
        if self.ledger_url:
            url = self.ledger_url
        elif self.ledger_conn_id:
            conn = self.get_connection(self.ledger_conn_id)
            mask_password(conn.password)
            url = ledger_url_from_connection(
                host=conn.host, port=conn.port, login=conn.login, password=conn.password,
                schema=conn.schema, extra=conn.extra_dejson,
            )
        else:
            url = default_ledger_url()
        mask_url(url)
        return url

    def get_conn(self) -> Ledger:
        """The ledger (created once per hook; SQLite parent directories are created)."""
        if self._ledger is None:
            from streamledger.ledger import Ledger

            url = self.get_url()
            if url.startswith("sqlite:///"):
                path = url[len("sqlite:///"):].split("?", 1)[0]
                if path and path != ":memory:":
                    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._ledger = Ledger(url, create=self.upgrade)
        return self._ledger

    def get_polling_ledger(self) -> Ledger | None:
        """The process-wide read-only ledger for this hook's URL (see :func:`polling_ledger`)."""
        return polling_ledger(self.get_url())

    def test_connection(self) -> tuple[bool, str]:
        """Open the ledger without migrating it (a Test button must not change a database) and audit it."""
        try:
            from streamledger.ledger import Ledger

            with Ledger(self.get_url(), create=False) as ledger:
                report = ledger.audit()
            verdict = "clean" if report.clean else f"{len(report.violations)} violation(s)"
            return True, f"ledger reachable at {ledger!r}; audit {verdict}"
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
