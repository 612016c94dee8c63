"""Fixtures of the ledger unit tests: a fresh SQLite ledger per test (a copy of the session's
migrated template, tests/support/ledgers.py), at ``sqlite_url``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streamledger.ledger import Ledger
from tests.support.ledgers import sqlite_ledger_url


@pytest.fixture
def ledger(sqlite_url: str, sqlite_ledger_template: Path) -> Iterator[Ledger]:
    url = sqlite_ledger_url(sqlite_ledger_template, Path(sqlite_url.removeprefix("sqlite:///")))
    led = Ledger(url)
    yield led
    led.close()


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """The database the migration tests run on (PostgreSQL in tests/integration/ledger)."""
    return sqlite_url
