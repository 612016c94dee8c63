"""The ledger's session: its engine, transactions, the database's clock and the schema check."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

from sqlalchemy import Connection, DateTime, Engine, literal, select
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from streamledger.ledger import migrate
from streamledger.ledger.engine import IMMEDIATE, default_url, make_engine, safe_url
from streamledger.ledger.errors import LedgerError, LedgerSchemaMissing
from streamledger.ledger.rows import utc
from streamledger.ledger.statements import DB_NOW
from streamledger.ledger.types import SourceRef


def _now() -> datetime:
    """This process's clock, naive UTC (both dialects store ``timestamp without time zone``).

    Only :meth:`Ledger._clock` asks it, and only for SQLite."""
    return datetime.now(UTC).replace(tzinfo=None)


def _db_message(exc: SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@functools.cache
def _head() -> str:
    return migrate.head()


class LedgerSession:
    """The base every room of the :class:`~streamledger.ledger.Ledger` stands on: one engine per
    database URL, short transactions (:meth:`_tx`, or one shared by many calls, :meth:`_joined`),
    database errors as one-line LedgerErrors, and the ledger's one clock.
    """

    def __init__(self, url: str | None = None, *, create: bool = False) -> None:
        self.url = url or default_url()
        self._engine: Engine = make_engine(self.url, create=create)
        self._sources: dict[int, tuple[str, SourceRef]] = {}
        self._local = threading.local()  # the session of a transaction many calls join (_joined)
        if create:
            self.upgrade()
        else:
            self._check_schema()

    @property
    def engine(self) -> Engine:
        """The ledger's own engine (for tools and tests; callers should prefer the methods)."""
        return self._engine

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    def upgrade(self, revision: str = "head") -> None:
        """Apply the shipped Alembic migrations (own version table ``streamledger_ledger_version``)."""
        migrate.upgrade(self._engine, revision)

    def close(self) -> None:
        """Release pooled connections."""
        self._engine.dispose()

    def _check_schema(self) -> None:
        rev = migrate.current(self._engine)
        if rev is None:
            raise LedgerSchemaMissing(safe_url(self.url))
        if rev != _head():
            raise LedgerError(
                f"the ledger schema in {safe_url(self.url)} is at revision {rev}, this streamledger expects "
                f"{_head()}: run `streamledger ledger upgrade --ledger URL`"
            )

    @contextlib.contextmanager
    def _tx(self, what: str, *, write: bool = True) -> Iterator[Session]:
        outer = self._outer()
        if outer is not None:  # inside _joined: the caller's transaction commits (or rolls back) all
            with self._errors(what):
                yield outer
            return
        with self._errors(what), Session(self._engine, expire_on_commit=False) as session:
            session.connection(execution_options={IMMEDIATE: True} if write else {})
            yield session
            session.commit()

    @contextlib.contextmanager
    def read_connection(self, what: str) -> Iterator[Connection]:
        """A plain connection for a read of the ledger's own SQL (coverage, source summaries), with
        the database's errors as one-line LedgerErrors like every other call's."""
        with self._errors(what), self._engine.connect() as conn:
            yield conn

    def _outer(self) -> Session | None:
        return getattr(self._local, "session", None)

    @contextlib.contextmanager
    def _joined(self, what: str, *, write: bool = True) -> Iterator[Session]:
        """One transaction that every ledger call of this thread inside the block joins: a batch's
        claims (or commits, or reads) of all its sources cost one transaction, not one each, and
        take effect together or not at all. The calls keep their own rules; only the
        transaction is shared."""
        if self._outer() is not None:
            with self._tx(what, write=write) as session:
                yield session
            return
        with self._tx(what, write=write) as session:
            self._local.session = session
            try:
                yield session
            finally:
                self._local.session = None

    @contextlib.contextmanager
    def rehearsal(self, what: str) -> Iterator[None]:
        """Every ledger call of this thread inside the block runs its rules and writes in one
        transaction, rolled back at the end: a cure's ``--dry-run`` shows what it would change (its
        refusals too) and changes nothing."""
        with self._errors(what), Session(self._engine, expire_on_commit=False) as session:
            session.connection(execution_options={IMMEDIATE: True})
            self._local.session = session
            try:
                yield
            finally:
                self._local.session = None
                session.rollback()
                self._sources.clear()

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn database errors into one-line LedgerErrors (never with the URL's password). A lost
        or unreachable database is the line alone: the driver's own traceback under it (its class,
        the statement and its parameters) says nothing more to a task log's reader."""
        try:
            yield
        except LedgerError:
            raise
        except IntegrityError as exc:
            raise LedgerError(f"{what}: the ledger database refused it: {_db_message(exc)}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated or isinstance(exc.orig, ConnectionError):
                raise LedgerError(f"{what}: lost the ledger database {safe_url(self.url)} "
                                  f"({_db_message(exc)})") from None
            if isinstance(exc, OperationalError):
                raise LedgerError(f"{what}: ledger database error: {_db_message(exc)}") from None
            raise LedgerError(f"{what}: ledger database error: {_db_message(exc)}") from exc
        except SQLAlchemyError as exc:
            raise LedgerError(f"{what}: ledger database error: {_db_message(exc)}") from exc

    # -- the clock -------------------------------------------------------------------------------

    def _clock(self, session: Session) -> datetime:
        """Now by the ledger's one clock (naive UTC), for every time the ledger stores or compares.

        Hosts' clocks disagree, and abandonment compares the claimer's "now" with heartbeats other
        hosts stamped: by its own clock a host minutes fast would take a claim that beat seconds
        ago. So the time is the database's. PostgreSQL: its ``now()`` (the transaction's start),
        which the one-statement paths (claim, commit, heartbeat) embed via :meth:`_clock_sql`
        instead of reading it first. SQLite evaluates 'now' in the process that opens the file, so
        its clock is this process's (a SQLite ledger is one host's file).
        """
        if self.dialect == "postgresql":
            return session.execute(select(DB_NOW)).scalar_one()
        return _now()

    def clock(self) -> datetime:
        """Now by the ledger's clock (aware UTC): compare the ledger's timestamps with this, never
        with the host's (see :meth:`_clock`)."""
        with self._tx("read the ledger clock", write=False) as session:
            return utc(self._clock(session))

    def _clock_sql(self) -> ColumnElement[datetime]:
        """:meth:`_clock` inside a statement: no round trip of its own on PostgreSQL."""
        return DB_NOW if self.dialect == "postgresql" else literal(_now(), DateTime())
