"""Issue 25's pinned claims of tests/unit/ledger/test_pinned_claims.py, re-run against a real
PostgreSQL (the server-side ``streamledger_claim`` of migration 0008)."""

from __future__ import annotations

import pytest

from tests.unit.ledger.test_pinned_claims import *  # noqa: F403  (re-collect the same tests)

pytestmark = pytest.mark.postgres
