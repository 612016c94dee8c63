"""The state directory, ``$STREAMLEDGER_HOME`` (default ``/var/tmp/streamledger``): the default SQLite
ledger, the default output root and the Spark Connect server's record live in it.

``/var/tmp`` is shared by every local user, so whoever creates the directory first owns it and could
read or swap the ledger that decides what the pipelines skip. :func:`state_dir` therefore creates it
with mode 0700, and accepts an existing one only if the current user owns it (a symbolic link too)
and neither group nor others may write it. Others may *read* it: ``scripts/postgres.sh`` makes the
test home 0755 so that PostgreSQL, running as its own user, reaches its data directory below it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from streamledger.errors import StreamledgerError

ENV = "STREAMLEDGER_HOME"
DEFAULT = "/var/tmp/streamledger"


class UnsafeStateDir(StreamledgerError):
    """The state directory cannot be created, or another user could tamper with it."""


def state_dir() -> Path:
    """``$STREAMLEDGER_HOME`` (default ``/var/tmp/streamledger``), created 0700 when missing, else checked."""
    home = Path(os.environ.get(ENV) or DEFAULT)
    if not os.path.lexists(home):
        try:
            home.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(home, 0o700)
        except FileExistsError:
            pass  # created meanwhile by another process: checked below like any existing directory
        except OSError as exc:
            why = f"cannot create the state directory {home} (${ENV}): {exc.strerror}"
            raise UnsafeStateDir(why) from None
    _check(home)
    return home


def _check(home: Path) -> None:
    me = os.geteuid()
    hint = f"remove it or set ${ENV} to a directory of your own"
    try:
        st = os.lstat(home)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != me:
                raise UnsafeStateDir(
                    f"state directory {home} is a symbolic link owned by uid {st.st_uid}, not by this user "
                    f"(uid {me}): {hint}"
                )
            st = os.stat(home)
    except OSError as exc:
        raise UnsafeStateDir(f"cannot inspect the state directory {home} (${ENV}): {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateDir(f"state directory {home} (${ENV}) is not a directory")
    if st.st_uid != me:
        raise UnsafeStateDir(
            f"state directory {home} is owned by uid {st.st_uid}, not by this user (uid {me}): {hint}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStateDir(
            f"state directory {home} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"run chmod go-w {home}"
        )
