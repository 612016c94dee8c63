"""The ledger rules of tests/unit/ledger/test_semantics.py, re-run against a real PostgreSQL."""

from __future__ import annotations

import pytest

from tests.unit.ledger.test_semantics import *  # noqa: F403  (re-collect the same tests)

pytestmark = pytest.mark.postgres
