"""Bad command-line input is refused in one line naming the argument, with exit status 2, before
anything is opened or written (issue 19, item 10)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from streamledger.cli import main
from streamledger.ledger import Ledger, LedgerError
from tests.unit.ledger.util import SRC, run


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A migrated SQLite ledger: the bad argument, not a missing schema, must be what stops the command."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    Ledger(url, create=True).close()
    return url


def files(where: Path) -> dict[str, int]:
    return {str(p.relative_to(where)): p.stat().st_mtime_ns for p in sorted(where.rglob("*"))}


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI, expect exit status 2, and return its one stderr line."""
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    assert exc.value.code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["audit", "--stale-after", "nan"], "--stale-after"),
        (["audit", "--stale-after", "inf"], "--stale-after"),
        (["audit", "--stale-after", "-5"], "--stale-after"),
        (["audit", "--stale-after", "soon"], "--stale-after"),
        (["release-stale", "--older-than", "1e20"], "--older-than"),
        (["release-stale", "--older-than", "nan"], "--older-than"),
    ],
)
def test_bad_durations(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, db: str, argv: list[str], named: str
) -> None:
    before = files(tmp_path)
    err = refused(capsys, "ledger", *argv, "--db", db)
    assert f"argument {named}" in err and "seconds" in err
    assert files(tmp_path) == before  # the ledger was not even opened


def test_html_into_a_missing_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path, db: str) -> None:
    html = tmp_path / "missing" / "audit.html"
    before = files(tmp_path)
    err = refused(capsys, "ledger", "audit", "--db", db, "--html", str(html))
    assert "argument --html" in err and "does not exist" in err
    assert files(tmp_path) == before


def test_html_onto_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path, db: str) -> None:
    before = files(tmp_path)
    err = refused(capsys, "ledger", "audit", "--db", db, "--html", str(tmp_path))
    assert "argument --html" in err and "is a directory" in err
    assert files(tmp_path) == before


@pytest.mark.parametrize("command", ["audit", "ranges", "upgrade"])
def test_non_numeric_port_in_db(capsys: pytest.CaptureFixture[str], command: str) -> None:
    err = refused(capsys, "ledger", command, "--db", "postgresql+psycopg://alice:s3cret@db.example:abc/ledger")
    assert "argument --db" in err and "port" in err
    assert "s3cret" not in err


def test_unsupported_db_is_refused_as_an_argument(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, "ledger", "audit", "--db", "mysql://u@h/x")
    assert "argument --db" in err and "unsupported" in err


def test_the_installed_entry_point_prints_one_line(tmp_path: Path, db: str) -> None:
    exe = Path(sys.executable).with_name("streamledger")
    before = files(tmp_path)
    proc = subprocess.run(
        [str(exe), "ledger", "audit", "--db", db, "--stale-after", "nan"],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "argument --stale-after" in proc.stderr, proc.stderr
    assert files(tmp_path) == before


def test_offsets_beyond_64_bit_signed_are_refused_on_sqlite(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match=r"end_limit .*0\.\.2\*\*63-1"):
        ledger.claim("p", SRC, 2**63, run(1), initial_start=0)
    with pytest.raises(LedgerError, match=r"initial_start .*0\.\.2\*\*63-1"):
        ledger.claim("p", SRC, 10, run(1), initial_start=2**63)
    assert ledger.ranges() == []
    r = ledger.claim("p", SRC, 2**63 - 1, run(1), initial_start=2**63 - 10)  # the largest is fine
    assert (r.start, r.end) == (2**63 - 10, 2**63 - 1)
