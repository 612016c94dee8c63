"""Ledger construction, URLs and schema checks (SQLite; no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from streamledger.ledger import Ledger, LedgerError
from streamledger.ledger.engine import make_engine, parse_url, safe_url


def test_sqlite_connections_are_wal_with_busy_timeout(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30000
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
    engine.dispose()


def test_missing_schema_is_a_clear_error(sqlite_url: str) -> None:
    with pytest.raises(LedgerError, match=r"no ledger schema .* `streamledger ledger upgrade"):
        Ledger(sqlite_url)
    Ledger(sqlite_url, create=True).close()
    Ledger(sqlite_url).close()  # now at head


def test_urls() -> None:
    with pytest.raises(LedgerError, match="in-memory"):
        Ledger("sqlite://")
    with pytest.raises(LedgerError, match="unsupported ledger database"):
        Ledger("mysql://u:secret@h/db")
    with pytest.raises(LedgerError) as err:
        Ledger("mysql://u:secret@h/db")
    assert "secret" not in str(err.value)
    assert parse_url("postgresql://u:p@h/db").drivername == "postgresql+psycopg"
    assert "secret" not in safe_url("postgresql+psycopg://u:secret@h/db")


def test_unreachable_postgres_is_a_clear_error() -> None:
    with pytest.raises(LedgerError) as err:
        Ledger("postgresql+psycopg://u:hunter2@127.0.0.1:1/nothing")
    assert "hunter2" not in str(err.value) and "127.0.0.1" in str(err.value)


def test_creates_the_directory_of_a_new_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a' / 'b' / 'l.sqlite'}"
    Ledger(url, create=True).close()
    assert (tmp_path / "a" / "b" / "l.sqlite").exists()


def test_opening_a_missing_sqlite_ledger_creates_nothing(tmp_path: Path) -> None:
    """Only a writing open (``create=True``) makes the file and its directory (issue 30 defect 10)."""
    from streamledger.ledger.errors import LedgerNotFound

    missing = tmp_path / "nowhere" / "x.db"
    with pytest.raises(LedgerNotFound, match=r"no ledger schema .* does not exist"):
        Ledger(f"sqlite:///{missing}")
    assert list(tmp_path.iterdir()) == []
    Ledger(f"sqlite:///{missing}", create=True).close()
    assert missing.is_file()
