"""Fixtures of the ledger integration tests: a fresh PostgreSQL database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamledger.ledger import Ledger


@pytest.fixture
def ledger(postgres_url: str) -> Iterator[Ledger]:
    led = Ledger(postgres_url, create=True)
    yield led
    led.close()
