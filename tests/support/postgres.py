"""PostgreSQL fixtures: a real server (Debian's package, started by ``scripts/postgres.sh``).

* ``postgres_server`` (session): starts the private cluster on 127.0.0.1:55432 once, under an
  ``fcntl`` lock so parallel pytest processes do not race, and leaves it running for the next run.
  Returns the admin URL (database ``postgres``).
* ``postgres_url``: a fresh, empty database per test (dropped afterwards, even if connections stay).
* ``sqlite_url``: a SQLite ledger file in the test's ``tmp_path``.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SL_HOME = Path(os.environ.get("STREAMLEDGER_HOME", "/var/tmp/streamledger"))


def _admin_dsn(url: str) -> str:
    """psycopg's own DSN form of a SQLAlchemy ``postgresql+psycopg://`` URL."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def start_server() -> str:
    """Start the private cluster unless it runs (under a lock); return its admin URL. Outside pytest
    too (the model checker's soak)."""
    SL_HOME.mkdir(parents=True, exist_ok=True)
    with open(SL_HOME / ".pg-fixture.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            proc = subprocess.run(
                [str(REPO / "scripts" / "postgres.sh"), "start"],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/postgres.sh start failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def postgres_server() -> str:
    return start_server()


def create_database(server_url: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` on the server (a copy of database ``template`` if given) and return
    its SQLAlchemy URL."""
    import psycopg

    with psycopg.connect(_admin_dsn(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def drop_database(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(_admin_dsn(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    name = f"sl_test_{uuid.uuid4().hex[:12]}"
    url = create_database(postgres_server, name)
    try:
        yield url
    finally:
        drop_database(postgres_server, name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
