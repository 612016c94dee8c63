"""`streamledger ledger ...` commands (placeholder: filled in by the ledger work)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add this group's sub-commands to the top-level parser."""
    del sub
