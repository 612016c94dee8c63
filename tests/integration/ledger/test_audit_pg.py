"""The audit tests of tests/unit/ledger/test_audit.py, re-run against a real PostgreSQL."""

from __future__ import annotations

import pytest

from tests.unit.ledger.test_audit import *  # noqa: F403  (re-collect the same tests)

pytestmark = pytest.mark.postgres
