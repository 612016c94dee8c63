"""Fixtures of the ledger integration tests: a fresh PostgreSQL database per test (a copy of the
session's migrated template, tests/support/ledgers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamledger.ledger import Ledger


@pytest.fixture
def ledger(postgres_ledger_url: str) -> Iterator[Ledger]:
    led = Ledger(postgres_ledger_url)
    yield led
    led.close()
