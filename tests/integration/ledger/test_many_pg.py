"""tests/unit/ledger/test_many.py (claims and commits of many sources in one transaction) against
a real PostgreSQL (the claim is the server-side function there)."""

from __future__ import annotations

import pytest

from tests.unit.ledger.test_many import *  # noqa: F403  (re-collect the same tests)

pytestmark = pytest.mark.postgres
