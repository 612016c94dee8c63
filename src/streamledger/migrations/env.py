"""Alembic environment of the streamledger ledger.

Run programmatically by ``streamledger.ledger.migrate`` (``Ledger.upgrade()``, ``streamledger ledger
upgrade``), which hands over a connection in ``config.attributes["connection"]``; no alembic.ini is
needed. The ledger may share a database with Airflow, so it keeps its own version table and the
``include_object`` filter hides every table the ledger does not own from autogenerate.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

from streamledger.ledger.engine import default_url, make_engine
from streamledger.ledger.migrate import VERSION_TABLE
from streamledger.ledger.models import LEDGER_TABLES, LedgerBase

config = context.config
target_metadata = LedgerBase.metadata


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Only the ledger's own tables (and their indexes and constraints) are ever compared or touched."""
    del reflected, compare_to
    if type_ == "table":
        return name in LEDGER_TABLES
    table = getattr(obj, "table", None)
    if table is not None and getattr(table, "name", None) is not None:
        return table.name in LEDGER_TABLES
    return True


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        transaction_per_migration=True,
        compare_type=True,
        **kwargs,
    )


def run_offline() -> None:
    _configure(
        url=config.get_main_option("sqlalchemy.url") or default_url(),
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_with(connection: Connection) -> None:
    # SQLite can run DDL inside transactions once pysqlite stops managing them (see engine.py), so
    # each migration is atomic on both dialects; batch mode rebuilds tables for SQLite's ALTER gaps.
    _configure(
        connection=connection,
        render_as_batch=connection.dialect.name == "sqlite",
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_with(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or default_url())
    try:
        with engine.connect() as conn:
            _run_with(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
