"""The issue 10 ledger rules of tests/unit/ledger/test_claim_rule.py, re-run against a real PostgreSQL."""

from __future__ import annotations

import pytest

from tests.unit.ledger.test_claim_rule import *  # noqa: F403  (re-collect the same tests)

pytestmark = pytest.mark.postgres
