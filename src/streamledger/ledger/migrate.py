"""Run the ledger's Alembic migrations from code (no alembic.ini at run time).

Several task processes may open a ledger with ``create=True`` at the same moment, so an upgrade
holds a lock for its whole run: a PostgreSQL advisory lock on a side connection, or an ``fcntl``
lock on a file next to the SQLite database. The migration scripts themselves live in the package
directory ``streamledger/migrations`` (see its NOTES.md).
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from streamledger.ledger.engine import IMMEDIATE, safe_url
from streamledger.ledger.errors import LedgerError

VERSION_TABLE = "streamledger_ledger_version"
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
FILE_TEMPLATE = "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s"
_PG_LOCK_KEY = 0x5354524C4544  # "STRLED": one advisory lock for all ledger migrations


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for the shipped scripts; ``url`` is only needed for offline (SQL) mode."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("file_template", FILE_TEMPLATE)
    cfg.set_main_option("version_table", VERSION_TABLE)
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head() -> str:
    """The newest revision shipped with this version of streamledger."""
    script = ScriptDirectory.from_config(alembic_config())
    rev = script.get_current_head()
    if rev is None:  # pragma: no cover - the package always ships revisions
        raise LedgerError(f"no ledger migrations found in {MIGRATIONS_DIR}")
    return rev


def current(engine: Engine) -> str | None:
    """The revision the database at ``engine`` is at, or None when the ledger was never installed."""
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE}
            ).get_current_revision()
    except SQLAlchemyError as exc:
        raise LedgerError(
            f"cannot read the ledger schema version from {safe_url(engine.url)}: {exc}"
        ) from exc


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    if engine.dialect.name == "postgresql":
        with engine.connect() as side:
            side.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            side.commit()
            try:
                yield
            finally:
                side.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                side.commit()
        return
    lock_path = Path(f"{engine.url.database}.migrate.lock")
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _run(engine: Engine, action: str, revision: str) -> None:
    cfg = alembic_config()
    try:
        with _migration_lock(engine), engine.connect() as conn:
            conn.execution_options(**{IMMEDIATE: True})
            cfg.attributes["connection"] = conn
            if action == "upgrade":
                command.upgrade(cfg, revision)
            else:
                command.downgrade(cfg, revision)
            if conn.in_transaction():
                conn.commit()
    except SQLAlchemyError as exc:
        raise LedgerError(f"ledger {action} to {revision} failed on {safe_url(engine.url)}: {exc}") from exc


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the ledger schema up to ``revision`` (default: the newest)."""
    _run(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Take the ledger schema back to ``revision`` (``base`` removes the ledger's tables)."""
    _run(engine, "downgrade", revision)
