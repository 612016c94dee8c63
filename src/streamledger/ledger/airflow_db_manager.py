"""Airflow db-manager for the offset ledger, for users who keep the ledger in Airflow's database.

Registered through the provider's ``db-managers`` entry, it makes ``airflow db migrate`` also bring
the ledger's tables to the head of streamledger's own Alembic history (shipped in
``streamledger/migrations``, version table ``streamledger_ledger_version``, never Airflow's
``alembic_version``). On a fresh database Airflow creates the tables from the ORM metadata and stamps
the head; later runs apply new revisions. The ledger's own ``upgrade()`` stays the way to migrate a
separate ledger database.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.utils.db_manager import BaseDBManager

import streamledger

_MIGRATIONS = os.path.join(os.path.dirname(os.path.abspath(streamledger.__file__)), "migrations")
VERSION_TABLE = "streamledger_ledger_version"


class _LedgerMetadata:
    """Class-level attribute that imports the ledger's ORM metadata on first access.

    Airflow reads ``metadata`` from the manager *class* while validating, so a plain property would
    not do; deferring the import keeps provider discovery cheap.
    """

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        from streamledger.ledger.models import LedgerBase

        return LedgerBase.metadata


class LedgerDBManager(BaseDBManager):
    """Migrates the ledger tables inside Airflow's metadata database."""

    migration_dir = _MIGRATIONS
    alembic_file = os.path.join(_MIGRATIONS, "alembic.ini")
    version_table_name = VERSION_TABLE
    supports_table_dropping = True
    metadata = _LedgerMetadata()
