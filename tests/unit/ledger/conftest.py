"""Fixtures of the ledger unit tests: a fresh SQLite ledger per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamledger.ledger import Ledger


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    led = Ledger(sqlite_url, create=True)
    yield led
    led.close()


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """The database the migration tests run on (PostgreSQL in tests/integration/ledger)."""
    return sqlite_url
