"""The property-based claim/commit/fail/crash/re-claim machine against a real PostgreSQL."""

from __future__ import annotations

import pytest

from streamledger.ledger import Ledger
from tests.unit.ledger.test_properties import run_machine

pytestmark = pytest.mark.postgres


def test_random_sequences_keep_invariants_postgres(ledger: Ledger) -> None:
    run_machine(ledger, max_examples=25)
