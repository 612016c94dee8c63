"""Airflow db-manager for the offset ledger, for users who keep the ledger in Airflow's database.

Registered through the provider's ``db-managers`` entry, it makes ``airflow db migrate`` also bring
the ledger's tables to the head of streamledger's own Alembic history (shipped in
``streamledger/migrations``, version table ``streamledger_ledger_version``, never Airflow's
``alembic_version``).

Unlike Airflow's default for external managers, a fresh database is *not* created from the ORM
metadata and stamped: the ledger's migrations also install triggers (and, on PostgreSQL, an
exclusion constraint) that the metadata cannot express, so both a fresh install and an upgrade run
the real migrations, through the ledger's own engine settings and migration lock.
"""

from __future__ import annotations

from typing import Any

from airflow.utils.db_manager import BaseDBManager

from streamledger.ledger.migrate import MIGRATIONS_DIR, VERSION_TABLE, alembic_config


class _LedgerMetadata:
    """Class-level attribute that imports the ledger's ORM metadata on first access.

    Airflow reads ``metadata`` from the manager *class* while validating, so a plain property would
    not do; deferring the import keeps provider discovery cheap.
    """

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        from streamledger.ledger.models import LedgerBase

        return LedgerBase.metadata


def _airflow_url() -> str:
    from airflow import settings

    url = settings.SQL_ALCHEMY_CONN
    if not url:
        raise RuntimeError("Airflow's [database] sql_alchemy_conn is not configured")
    return str(url)


class LedgerDBManager(BaseDBManager):
    """Migrates the ledger tables inside Airflow's metadata database."""

    migration_dir = str(MIGRATIONS_DIR)
    alembic_file = str(MIGRATIONS_DIR / "alembic.ini")  # not shipped; get_alembic_config builds it
    version_table_name = VERSION_TABLE
    supports_table_dropping = True
    metadata = _LedgerMetadata()

    def get_alembic_config(self) -> Any:
        """The ledger's own Alembic configuration, aimed at Airflow's database."""
        return alembic_config(_airflow_url())

    def _upgrade(self, revision: str = "head") -> None:
        from streamledger.ledger.engine import make_engine
        from streamledger.ledger.migrate import upgrade

        self._release_metadata_locks_if_needed()
        # Airflow's session may hold a SQLite write transaction; end it before migrating.
        self.session.commit()
        engine = make_engine(_airflow_url())
        try:
            upgrade(engine, revision)
        finally:
            engine.dispose()

    def create_db_from_orm(self) -> None:
        """Fresh database: run the migrations (they create what the ORM metadata cannot)."""
        self.log.info("Creating the streamledger ledger tables by migration")
        self._upgrade()

    def upgradedb(
        self,
        to_revision: str | None = None,
        from_revision: str | None = None,
        show_sql_only: bool = False,
        use_migration_files: bool = False,
    ) -> None:
        """Upgrade the ledger tables to ``to_revision`` (default: head)."""
        del from_revision, use_migration_files
        if show_sql_only:
            raise NotImplementedError("offline SQL for the ledger: use `alembic` with the shipped scripts")
        self.log.info("Upgrading the streamledger ledger tables")
        self._upgrade(to_revision or "head")
