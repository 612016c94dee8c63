"""The state directory ($STREAMLEDGER_HOME, default /var/tmp/streamledger) is created 0700 and one that
another user owns, or anyone else may write, is refused by every default that lives in it (issue 19,
item 11). The suite runs as root, so ``os.chown`` can hand a directory to another uid."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from streamledger.errors import StreamledgerError

OTHER_UID = 4242  # no such user needed: ownership is a number


def _ledger_default() -> object:
    from streamledger.ledger.engine import default_url

    return default_url()


def _output_default() -> object:
    from streamledger.operators.batch import default_output_root

    return default_output_root()


def _connect_default() -> object:
    from streamledger.spark.connect import state_dir

    return state_dir()


def _state_dir() -> object:
    from streamledger.home import state_dir

    return state_dir()


DEFAULTS: list[Callable[[], object]] = [_state_dir, _ledger_default, _output_default, _connect_default]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "state" / "streamledger"
    monkeypatch.setenv("STREAMLEDGER_HOME", str(where))
    monkeypatch.delenv("STREAMLEDGER_LEDGER_URL", raising=False)
    return where


@pytest.mark.parametrize("default", DEFAULTS, ids=lambda f: f.__name__)
def test_a_missing_home_is_created_private(home: Path, default: Callable[[], object]) -> None:
    old = os.umask(0)  # even with no umask at all, nobody else gets in
    try:
        value = default()
    finally:
        os.umask(old)
    assert str(home) in str(value)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and home.stat().st_uid == os.geteuid()


@pytest.mark.parametrize("default", DEFAULTS, ids=lambda f: f.__name__)
def test_a_home_owned_by_another_user_is_refused(home: Path, default: Callable[[], object]) -> None:
    home.mkdir(parents=True, mode=0o700)
    os.chown(home, OTHER_UID, OTHER_UID)
    with pytest.raises(StreamledgerError) as exc:
        default()
    message = str(exc.value)
    assert "\n" not in message and str(home) in message and f"uid {OTHER_UID}" in message
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_home_others_may_write_is_refused(home: Path, mode: int) -> None:
    home.mkdir(parents=True)
    home.chmod(mode)
    with pytest.raises(StreamledgerError, match="writable by group or others"):
        _state_dir()


def test_a_readable_home_of_ours_is_accepted(home: Path) -> None:
    # scripts/postgres.sh makes the real one 0755 (PostgreSQL, another user, reaches its data below).
    home.mkdir(parents=True)
    home.chmod(0o755)
    assert _state_dir() == home
    assert stat.S_IMODE(home.stat().st_mode) == 0o755  # an existing directory is not changed


def test_a_symlink_planted_by_another_user_is_refused(home: Path, tmp_path: Path) -> None:
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    home.parent.mkdir(parents=True)
    home.symlink_to(target)
    os.chown(target, OTHER_UID, OTHER_UID)
    os.lchown(home, OTHER_UID, OTHER_UID)
    with pytest.raises(StreamledgerError, match=f"uid {OTHER_UID}"):
        _state_dir()


def test_a_file_in_its_place_is_refused(home: Path) -> None:
    home.parent.mkdir(parents=True)
    home.write_text("")
    with pytest.raises(StreamledgerError, match="not a directory"):
        _state_dir()


def test_the_cli_refuses_in_one_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from streamledger.cli import main

    home.mkdir(parents=True, mode=0o700)
    os.chown(home, OTHER_UID, OTHER_UID)
    assert main(["ledger", "audit"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("streamledger: error: ") and err.count("\n") == 1 and f"uid {OTHER_UID}" in err
    assert list(home.iterdir()) == []  # no ledger file was created in it
