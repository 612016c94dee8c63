"""Issue 30's coverage rules of tests/unit/ledger/test_coverage_rules.py, re-run against a real
PostgreSQL (the server-side ``streamledger_claim``)."""

from __future__ import annotations

import pytest

from tests.unit.ledger.test_coverage_rules import *  # noqa: F403  (re-collect the same tests)

pytestmark = pytest.mark.postgres
