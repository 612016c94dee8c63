"""The redo step of the claim rule (tests/unit/ledger/test_redo_rule.py), re-run against a real
PostgreSQL (the server-side ``streamledger_claim``)."""

from __future__ import annotations

import pytest

from tests.unit.ledger.test_redo_rule import *  # noqa: F403  (re-collect the same tests)

pytestmark = pytest.mark.postgres
