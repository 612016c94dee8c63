"""The ledger's own database engine, tuned per dialect.

The ledger never borrows Airflow's ORM session (Airflow 3 forbids it in tasks, and a shared
session would couple the ledger's transactions to the scheduler's). SQLite is the embedded default
and must stay correct when several task processes write at once, so every connection gets WAL
journaling and a busy timeout, and write transactions start with ``BEGIN IMMEDIATE`` (the write
lock is taken up front, so two claims can never both read the same tail before either writes).
PostgreSQL is reached through psycopg 3 and relies on row locks and constraints instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError

from streamledger.home import state_dir
from streamledger.ledger.errors import LedgerError, LedgerNotFound

IMMEDIATE = "streamledger_immediate"
"""Execution option: a connection carrying it opens its SQLite transactions with BEGIN IMMEDIATE."""

SQLITE_BUSY_TIMEOUT_MS = 30_000


def default_url() -> str:
    """``$STREAMLEDGER_LEDGER_URL``, else a SQLite file in the state directory (checked, see
    :mod:`streamledger.home`)."""
    env = os.environ.get("STREAMLEDGER_LEDGER_URL")
    if env:
        return env
    return f"sqlite:///{state_dir() / 'ledger.sqlite'}"


def _extra_at(url: str) -> tuple[str, str] | None:
    """``(user, host_and_rest)`` when the URL's user info holds more than one ``@`` (an unescaped ``@``
    in the password), which parsers split at the wrong one and so would show part of the password."""
    scheme, sep, rest = url.partition("://")
    if not sep or rest.startswith("/"):
        return None
    authority_end = rest.find("/", rest.rfind("@") + 1)
    authority = rest if authority_end < 0 else rest[:authority_end]
    if authority.count("@") < 2:
        return None
    user = authority.partition(":")[0]
    return f"{scheme}://{user}", rest[rest.rfind("@", 0, len(authority)) + 1:]


def safe_url(url: str | URL) -> str:
    """The URL with any password masked (all of it, even with an ``@`` in it), fit for messages and logs."""
    if isinstance(url, str) and (split := _extra_at(url)) is not None:
        return f"{split[0]}:***@{split[1]}"
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        return "<unparseable database URL>"


def parse_url(url: str) -> URL:
    """Validate a ledger URL and normalise PostgreSQL URLs to the psycopg 3 driver."""
    if _extra_at(url) is not None:
        raise LedgerError(f"ledger database URL {safe_url(url)}: an '@' in the password must be written %40")
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise LedgerError(f"ledger database URL is not valid: {safe_url(url)}") from exc
    except ValueError as exc:  # SQLAlchemy's int(port); its message could show the URL, so not used
        raise LedgerError("ledger database URL is not valid: its port is not a number") from exc
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        return parsed
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise LedgerError(
                "the ledger needs a SQLite file (sqlite:///path/ledger.sqlite), not an in-memory database: "
                "claims from several processes must see the same data"
            )
        return parsed
    raise LedgerError(
        f"unsupported ledger database {safe_url(parsed)}: use sqlite:///FILE or postgresql+psycopg://..."
    )


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" hook, not pysqlite, decide when and how a transaction starts.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA recursive_triggers = OFF")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Any) -> None:
    mode = "IMMEDIATE" if conn.get_execution_options().get(IMMEDIATE) else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str | URL, *, create: bool = True) -> Engine:
    """An engine for the ledger at ``url`` with the dialect hooks described above. With ``create``
    False a SQLite file that does not exist is :class:`LedgerNotFound`: SQLite would create it (and
    this function its directory) on the first connection, and a reading open must create nothing."""
    parsed = parse_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() == "sqlite":
        database = Path(parsed.database or "")
        if not create and not database.is_file():
            raise LedgerNotFound(f"no ledger schema in {safe_url(parsed)}: the file does not exist; "
                                 "`streamledger ledger upgrade --ledger URL` creates it")
        if not database.parent.exists():
            try:
                database.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LedgerError(
                    f"cannot create the directory of the ledger file {database}: {exc}"
                ) from exc
        engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    # Pre-ping: one round trip per transaction (a checkout), so that a pooled connection the server
    # dropped (a restart, a failover) is replaced before use instead of failing the call that gets
    # it: without it a batch that claimed before a PostgreSQL restart failed its commit after it.
    try:
        return create_engine(parsed, pool_recycle=1800, pool_pre_ping=True,
                             connect_args={"connect_timeout": 10})
    except ModuleNotFoundError as exc:  # the driver is an extra (docs/install.md)
        raise LedgerError(
            f"a PostgreSQL ledger needs {exc.name}: pip install \"streamledger[postgres]\"") from exc
