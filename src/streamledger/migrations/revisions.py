"""The whole text of each database function and trigger a revision installs, one file per version:
``sql/<function>/<NNNN>.sql`` (PostgreSQL functions) and ``sql/sqlite/<trigger>/<NNNN>.sql``
(SQLite triggers), ``NNNN`` the revision that first installed that text. A revision names the
version its upgrade installs and the one its downgrade restores; none edits another's text, and a
version's file never changes once a revision installs it (a new rule is a new file). NOTES.md lists
the versions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SQL = Path(__file__).with_name("sql")


def function_text(name: str, version: str) -> str:
    """The text of PostgreSQL function ``name`` as revision ``version`` installs it
    (``CREATE OR REPLACE FUNCTION ...``)."""
    return (SQL / name / f"{version}.sql").read_text(encoding="utf-8")


def trigger_text(name: str, version: str) -> str:
    """The text of SQLite trigger ``name`` as revision ``version`` installs it (``CREATE TRIGGER ...``)."""
    return (SQL / "sqlite" / name / f"{version}.sql").read_text(encoding="utf-8")


def install_function(op: Any, name: str, version: str) -> None:
    """Install version ``version`` of PostgreSQL function ``name`` (its signature replaced in place;
    a revision that changes the signature drops the old one first)."""
    op.execute(function_text(name, version))


def install_trigger(op: Any, name: str, version: str) -> None:
    """Install version ``version`` of SQLite trigger ``name`` in place of any version there."""
    op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute(trigger_text(name, version))
