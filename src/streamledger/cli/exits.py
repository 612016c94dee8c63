"""The CLI's exit status and its one error line (docs/cli.md, "Exit status"): the one place that
decides which failure is bad input (2), an unreachable server or store (3) or a failure (1)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from streamledger.errors import StreamledgerError, missing_extra

OK = 0
FAILED = 1  # findings, a failed batch, a refusal by the server
USAGE = 2  # bad usage or input: refused before anything was claimed or written
UNREACHABLE = 3  # a server or store could not be reached
INTERRUPTED = 130
CLOSED_PIPE = 141  # 128 + SIGPIPE, what a Unix tool stopped by `| head` exits with


class BadInput(StreamledgerError, ValueError):
    """The command's input cannot work (exit 2); raised before anything is contacted or written."""


#: Connection-level errors of the clients, looked up only when their module is already imported (an
#: exception of a module never imported cannot occur, and importing them all would slow every command).
_UNREACHABLE_TYPES = (
    ("streamledger.ledger.errors", "LedgerNotFound"),
    ("streamledger.protocol.rabbitmq.errors", "ConnectionFailed"),
    ("streamledger.protocol.mewbase.errors", "MewbaseConnectionError"),
    ("streamledger.protocol.amqp10.errors", "Amqp10ConnectionError"),
    ("streamledger.protocol.tubemq.errors", "TubeMQConnectionError"),
    ("streamledger.protocol.tubemq.errors", "NoMasterAvailable"),
    ("psycopg", "OperationalError"),
)

def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _unreachable(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    if isinstance(exc, OSError) and type(exc).__name__ == "gaierror":  # name resolution failed
        return True
    for module, name in _UNREACHABLE_TYPES:
        loaded = sys.modules.get(module)
        kind = getattr(loaded, name, None) if loaded is not None else None
        if isinstance(kind, type) and isinstance(exc, kind):
            return True
    return _sqlite_cannot_open(exc)


def _sqlite_cannot_open(exc: BaseException) -> bool:
    sqlite3 = sys.modules.get("sqlite3")
    return (sqlite3 is not None and isinstance(exc, sqlite3.OperationalError)
            and "unable to open database file" in str(exc))


def one_line(text: str) -> str:
    """``text`` on one line, without SQLAlchemy's "Background on this error" link."""
    kept = [line for line in text.splitlines() if not line.strip().startswith("(Background on this error")]
    return " ".join(" ".join(kept).split())


def status_of(exc: BaseException) -> int:
    """The exit status for an exception that ended a command."""
    if any(_unreachable(e) for e in _chain(exc)):
        return UNREACHABLE
    if isinstance(exc, StreamledgerError) and isinstance(exc, ValueError):  # *InvalidRequest, BadInput
        return USAGE
    if isinstance(exc, ModuleNotFoundError) and missing_extra(exc):
        return USAGE
    return FAILED


def message_of(exc: BaseException) -> str:
    """The one line shown for ``exc`` (without the ``streamledger: error:`` prefix)."""
    if isinstance(exc, ModuleNotFoundError) and (advice := missing_extra(exc)):
        return advice
    if isinstance(exc, StreamledgerError):
        return one_line(str(exc)) or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    return f"unexpected {type(exc).__name__}: {one_line(str(exc))} (-v shows the traceback)"
