"""Ledger fixtures shared by the batch and Spark integration tests: a SQLite ledger per test, and one
parametrised over SQLite and the session's PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streamledger.ledger import Ledger


@pytest.fixture(params=["sqlite", "postgres"])
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with Ledger(url, create=True) as led:
        yield led


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", create=True) as led:
        yield led
