"""Ledger fixtures shared by the batch and Spark integration tests: a SQLite ledger per test, and one
parametrised over SQLite and the session's PostgreSQL server.

A test's ledger starts as a copy of one ledger migrated once per session (SQLite: a file copy;
PostgreSQL: ``CREATE DATABASE ... TEMPLATE``): a fresh migration costs ~0.3 s on SQLite and more on
PostgreSQL (Alembic loads and runs every script; even at head ``create=True`` costs ~0.1 s), a copy
a few milliseconds. The copy is opened without ``create``, which checks that it is at head. The
migrations themselves stay covered where they are the subject (tests/unit/ledger/test_migrations.py,
test_migrations_pg.py) and wherever a test or the product opens a database with ``create=True``.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamledger.ledger import Ledger
from tests.support.postgres import create_database, drop_database


@pytest.fixture(scope="session")
def sqlite_ledger_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite ledger file at the newest revision, to copy (never to open)."""
    path = tmp_path_factory.mktemp("ledger-template") / "ledger.sqlite"
    Ledger(f"sqlite:///{path}", create=True).close()
    return path


def sqlite_ledger_url(template: Path, path: Path) -> str:
    """Copy the template to ``path`` (its directory must exist) and return its URL."""
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def postgres_ledger_template(postgres_server: str) -> Iterator[str]:
    """A database at the newest revision on the session's server, to copy (never to open again):
    PostgreSQL copies a template only while nobody is connected to it."""
    name = f"sl_template_{uuid.uuid4().hex[:12]}"
    url = create_database(postgres_server, name)
    Ledger(url, create=True).close()
    try:
        yield name
    finally:
        drop_database(postgres_server, name)


@pytest.fixture
def postgres_ledger_url(postgres_server: str, postgres_ledger_template: str) -> Iterator[str]:
    """A fresh database per test, copied from the migrated template (dropped afterwards)."""
    name = f"sl_test_{uuid.uuid4().hex[:12]}"
    url = create_database(postgres_server, name, template=postgres_ledger_template)
    try:
        yield url
    finally:
        drop_database(postgres_server, name)


@pytest.fixture(params=["sqlite", "postgres"])
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "sqlite":
        url = sqlite_ledger_url(request.getfixturevalue("sqlite_ledger_template"), tmp_path / "ledger.sqlite")
    else:
        url = request.getfixturevalue("postgres_ledger_url")
    with Ledger(url) as led:
        yield led


@pytest.fixture
def ledger(tmp_path: Path, sqlite_ledger_template: Path) -> Iterator[Ledger]:
    with Ledger(sqlite_ledger_url(sqlite_ledger_template, tmp_path / "ledger.sqlite")) as led:
        yield led
