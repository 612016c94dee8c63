"""The migration tests of tests/unit/ledger/test_migrations.py, on a real PostgreSQL."""

from __future__ import annotations

import pytest

from tests.unit.ledger.test_migrations import *  # noqa: F403  (re-collect the same tests)

pytestmark = pytest.mark.postgres


@pytest.fixture
def db_url(postgres_url: str) -> str:
    return postgres_url
