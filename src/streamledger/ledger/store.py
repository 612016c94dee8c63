"""The :class:`Ledger`: claims, commits, failures, lost spans and stale-claim release.

Every mutation runs in one short transaction that first locks the source row (``SELECT ... FOR
UPDATE`` on PostgreSQL; the whole database via ``BEGIN IMMEDIATE`` on SQLite), so the decisions
"where does the next range start" and "insert it" can never interleave between two claimers. The
database re-checks the same rules with constraints and triggers (migration ``0002``), so a bug here
or a hand-written SQL statement cannot silently break them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Engine,
    Float,
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql.elements import ColumnElement

from streamledger.ledger import migrate
from streamledger.ledger.audit import AuditReport, Brokers, run_audit
from streamledger.ledger.engine import IMMEDIATE, default_url, make_engine, safe_url
from streamledger.ledger.errors import LedgerError
from streamledger.ledger.models import Pipeline, Range, Source
from streamledger.ledger.types import (
    ClaimRequest,
    CommitRequest,
    OffsetRange,
    RangeStatus,
    RunIdentity,
    SourcePosition,
    SourceRef,
    Watermark,
    pipeline_name_problem,
    retired_broker,
)
from streamledger.sources import MAX_OFFSET

_LIVE = Range.status != RangeStatus.FAILED.value
# PostgreSQL's clock as stored (naive UTC ``timestamp``): the ledger's one clock there (Ledger._clock).
_PG_NOW = "(now() AT TIME ZONE 'UTC')"
_DB_NOW = literal_column(_PG_NOW, DateTime())

# The hot statements are built once: constructing SQLAlchemy statements costs more Python time than
# running them, and a reused statement also reuses its compiled form (cache key memoised).
_SOURCE_BY_NAME = (
    select(Source)
    .join(Pipeline, Pipeline.id == Source.pipeline_id)
    .where(
        Pipeline.name == bindparam("pipeline"),
        Source.broker == bindparam("broker"),
        Source.stream == bindparam("stream"),
    )
)
_LOCK_SOURCE_BY_NAME = _SOURCE_BY_NAME.with_for_update(of=Source)


def _tail_of(sid: Any) -> Any:
    """The tail's statement for source ``sid``: a bind parameter (one source) or ``Source.id``
    (correlated, one row per source: :meth:`Ledger._facts`). The same SQL either way."""
    return (
        select(Range.end_offset)
        .where(Range.source_id == sid, _LIVE)
        .order_by(Range.start_offset.desc(), Range.end_offset.desc())
        .limit(1)
    )


_TAIL = _tail_of(bindparam("source_id"))
_LIVE_ALIAS = aliased(Range)
_COVERING_END = (
    select(_LIVE_ALIAS.end_offset)
    .where(
        _LIVE_ALIAS.source_id == Range.source_id,
        _LIVE_ALIAS.status != RangeStatus.FAILED.value,
        _LIVE_ALIAS.start_offset < Range.end_offset,
    )
    .order_by(_LIVE_ALIAS.start_offset.desc(), _LIVE_ALIAS.end_offset.desc())
    .limit(1)
    .scalar_subquery()
)
_IS_HOLE = and_(
    Range.status == RangeStatus.FAILED.value,
    Range.end_offset > Range.start_offset,
    func.coalesce(_COVERING_END, -1) <= Range.start_offset,
)
"""A failed range no live range overlaps: the next claim redoes it as-is."""


def _first_hole_of(sid: Any) -> Any:
    return select(Range).where(Range.source_id == sid, _IS_HOLE).order_by(Range.start_offset).limit(1)


def _any_pinned_of(sid: Any) -> Any:
    return select(Range.id).where(Range.source_id == sid, Range.pinned).limit(1)


_FIRST_HOLE = _first_hole_of(bindparam("source_id"))
_ANY_PINNED = _any_pinned_of(bindparam("source_id"))
_ORIGIN_START = select(func.min(Range.start_offset)).where(Range.source_id == bindparam("source_id"), _LIVE)
_NEXT = aliased(Range)
_STARTS_AT = select(_NEXT.id).where(
    _NEXT.source_id == bindparam("source_id"),
    _NEXT.status != RangeStatus.FAILED.value,
    _NEXT.start_offset == bindparam("at", type_=BigInteger()),
    _NEXT.end_offset > _NEXT.start_offset,
).limit(1)
# Walks the live ranges by end (the partial unique index on (source_id, end_offset)) to the first one
# that no non-empty live range continues: for a contiguous history that is the tail, O(ranges).
_FIRST_UNCONTINUED = (
    select(Range.end_offset)
    .where(
        Range.source_id == bindparam("source_id"),
        _LIVE,
        Range.end_offset > Range.start_offset,
        ~select(_NEXT.id).where(
            _NEXT.source_id == Range.source_id,
            _NEXT.status != RangeStatus.FAILED.value,
            _NEXT.start_offset == Range.end_offset,
            _NEXT.end_offset > _NEXT.start_offset,
        ).exists(),
    )
    .order_by(Range.end_offset)
    .limit(1)
)
_HELD_BY_RUN = select(Range).where(
    Range.source_id == bindparam("source_id"),
    Range.dag_id == bindparam("dag_id"),
    Range.run_id == bindparam("run_id"),
    Range.task_id == bindparam("task_id"),
    Range.map_index == bindparam("map_index"),
    Range.status.in_((RangeStatus.CLAIMED.value, RangeStatus.COMMITTED.value)),
)
_RANGES = Range.__table__
assert isinstance(_RANGES, Table)
_INSERT_RANGE = insert(_RANGES).returning(_RANGES.c.id)
# The common commit in one statement: a claimed range whose span holds the seen offsets.
_COMMIT_CLAIMED = (
    update(_RANGES)
    .where(
        _RANGES.c.id == bindparam("range_id"),
        _RANGES.c.status == RangeStatus.CLAIMED.value,
        or_(
            bindparam("empty_commit", type_=Boolean()),
            and_(
                _RANGES.c.start_offset <= bindparam("v_first", type_=BigInteger()),
                _RANGES.c.end_offset > bindparam("v_last", type_=BigInteger()),
            ),
        ),
    )
    .values(
        status=RangeStatus.COMMITTED.value,
        records=bindparam("v_records"),
        first_seen=bindparam("v_first", type_=BigInteger()),
        last_seen=bindparam("v_last", type_=BigInteger()),
        output=bindparam("v_output", type_=Text()),
        staging=bindparam("v_staging", type_=Text()),
        publisher=bindparam("v_publisher", type_=String()),
        published_at=bindparam("v_published", type_=DateTime()),
        publish_beat=bindparam("v_publish_beat", type_=DateTime()),
        committed_at=bindparam("v_now", type_=DateTime()),
        updated_at=bindparam("v_now", type_=DateTime()),
    )
    .returning(*_RANGES.c)
)
_IS_UNPUBLISHED = and_(
    Range.status == RangeStatus.COMMITTED.value,
    Range.records > 0,
    Range.published_at.is_(None),
)
_UNPUBLISHED = (
    select(Range)
    .where(Range.source_id == bindparam("source_id"), _IS_UNPUBLISHED)
    .order_by(Range.start_offset)
)
# PostgreSQL stamps the commit by its own clock (Ledger._clock): the flags say which stamps to set.
_COMMIT_CLAIMED_PG = _COMMIT_CLAIMED.values(
    published_at=case((bindparam("v_publish_now", type_=Boolean()), _DB_NOW), else_=null()),
    publish_beat=case((bindparam("v_publisher", type_=String()).is_not(None), _DB_NOW), else_=null()),
    committed_at=_DB_NOW,
    updated_at=_DB_NOW,
)
_PG_CLAIM = (
    text(
        "SELECT * FROM streamledger_claim(:pipeline, :broker, :stream, :super_stream, :end_limit, "
        f":dag_id, :run_id, :task_id, :map_index, :try_number, :initial, {_PG_NOW}, :max_span, "
        f"{_PG_NOW} - make_interval(secs => :abandon_secs), :span_start, :span_end, :interval_start, "
        ":interval_end)"
    )
    .bindparams(
        bindparam("super_stream", type_=String()),
        bindparam("end_limit", type_=BigInteger()),
        bindparam("map_index", type_=Integer()),
        bindparam("try_number", type_=Integer()),
        bindparam("initial", type_=BigInteger()),
        bindparam("max_span", type_=BigInteger()),
        bindparam("abandon_secs", type_=Float()),
        bindparam("span_start", type_=BigInteger()),
        bindparam("span_end", type_=BigInteger()),
        bindparam("interval_start", type_=DateTime()),
        bindparam("interval_end", type_=DateTime()),
    )
    .columns(*_RANGES.c)
)
_LOAD = (
    select(Range, Source, Pipeline.name)
    .join(Source, Source.id == Range.source_id)
    .join(Pipeline, Pipeline.id == Source.pipeline_id)
    .where(Range.id == bindparam("range_id"))
)
_LOAD_LOCKED = _LOAD.with_for_update(of=Range)
_MAX_TEXT = 4000


def _now() -> datetime:
    """This process's clock, naive UTC (both dialects store ``timestamp without time zone``).

    Only :meth:`Ledger._clock` asks it, and only for SQLite."""
    return datetime.now(UTC).replace(tzinfo=None)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def _db_message(exc: SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_pipeline(pipeline: str) -> None:
    problem = pipeline_name_problem(pipeline)
    if problem is not None:
        raise LedgerError(problem)


def _check_offset(name: str, value: object, stream: str | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_OFFSET:
        where = f" for stream {stream!r}" if stream else ""
        raise LedgerError(f"{name}{where} must be an integer offset in 0..2**63-1, got {value!r}")
    return value


def _snapshot(row: Any, pipeline: str, source: Source | SourceRef) -> OffsetRange:
    """``row``: a ``Range`` or a Core row / namespace with the same attribute names."""
    ref = (
        source
        if isinstance(source, SourceRef)
        else SourceRef(broker=source.broker, stream=source.stream, super_stream=source.super_stream)
    )
    return OffsetRange(
        id=row.id,
        pipeline=pipeline,
        source=ref,
        start=row.start_offset,
        end=row.end_offset,
        status=RangeStatus(row.status),
        run=RunIdentity(
            dag_id=row.dag_id,
            run_id=row.run_id,
            task_id=row.task_id,
            map_index=row.map_index,
            try_number=row.try_number,
        ),
        records=row.records,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        output=row.output,
        offset_stored=row.offset_stored,
        offset_verified=row.offset_verified,
        error=row.error,
        claimed_at=_utc(row.claimed_at),
        committed_at=_utc(row.committed_at) if row.committed_at is not None else None,
        heartbeat_at=_utc(row.heartbeat_at) if getattr(row, "heartbeat_at", None) is not None else None,
        staging=getattr(row, "staging", None),
        published_at=_utc(row.published_at) if getattr(row, "published_at", None) is not None else None,
        publisher=getattr(row, "publisher", None),
        publish_beat=_utc(row.publish_beat) if getattr(row, "publish_beat", None) is not None else None,
        sink_table=getattr(row, "sink_table", None),
        sink_commit=getattr(row, "sink_commit", None),
        interval=(_utc(row.interval_start), _utc(row.interval_end))
        if getattr(row, "interval_start", None) is not None and getattr(row, "interval_end", None) is not None
        else None,
    )


_Pinned = tuple[tuple[int, int], tuple[datetime | None, datetime | None]]
"""A pinned claim's span and its interval (naive UTC, as stored; None when not given)."""


@dataclass(frozen=True, slots=True)
class _Ask:
    """One source's checked claim inside :meth:`Ledger._claim_sqlite`."""

    what: str
    source: SourceRef
    end_limit: int
    initial_start: int | None
    pinned: _Pinned | None
_ORIGIN = RunIdentity("streamledger", "origin", "ledger")
"""Who holds the empty range that marks where a pinned history begins (``Ledger.claim``)."""


def _check_span(span: object, interval: object, stream: str) -> _Pinned | None:
    """A pinned claim's span and interval, checked before anything is claimed."""
    if span is None:
        if interval is not None:
            raise LedgerError(f"an interval for stream {stream!r} needs the span it pins (span=(start, end))")
        return None
    if not isinstance(span, tuple) or len(span) != 2:
        raise LedgerError(f"span for stream {stream!r} must be (start, end), got {span!r}")
    start = _check_offset("span start", span[0], stream)
    end = _check_offset("span end", span[1], stream)
    if end < start:
        raise LedgerError(f"span [{start}, {end}) of stream {stream!r} is reversed")
    if interval is None:
        return (start, end), (None, None)
    if (not isinstance(interval, tuple) or len(interval) != 2
            or not all(isinstance(t, datetime) for t in interval) or interval[1] < interval[0]):
        raise LedgerError(
            f"interval for stream {stream!r} must be (start, end) datetimes in order, got {interval!r}")
    begin, until = (_utc(t).replace(tzinfo=None) for t in interval)
    return (start, end), (begin, until)


def _pinned_answer(what: str, got: OffsetRange, run: RunIdentity, pinned: _Pinned | None) -> OffsetRange:
    """A pinned span another run holds claimed is not processed twice: refused until it is done or
    its holder is gone (abandoned, or failed by the batch's ``holder_alive`` check)."""
    key = (run.dag_id, run.run_id, run.task_id, run.map_index)
    held = got.run
    if pinned is not None and got.status == RangeStatus.CLAIMED and (
            held.dag_id, held.run_id, held.task_id, held.map_index) != key:
        beat = got.heartbeat_at or got.claimed_at
        raise LedgerError(
            f"{what}: [{got.start}, {got.end}) is claimed by {got.run} (heard from at {beat.isoformat()}); "
            "a pinned span is processed by one run at a time"
        )
    return got


def _chunks(items: list[Any], size: int = 500) -> Iterator[list[Any]]:
    """``items`` in slices small enough for one statement's bound parameters on every dialect."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


@functools.cache
def _head() -> str:
    return migrate.head()


class Ledger:
    """The offset ledger at one database URL (SQLite file or PostgreSQL), with its own engine.

    ``create=True`` runs the migrations to head first (safe to do from many processes at once);
    otherwise the schema must already be at head (``streamledger ledger upgrade --db URL``).
    """

    def __init__(self, url: str | None = None, *, create: bool = False) -> None:
        self.url = url or default_url()
        self._engine: Engine = make_engine(self.url)
        self._sources: dict[int, tuple[str, SourceRef]] = {}
        self._local = threading.local()  # the session of a transaction many calls join (_joined)
        if create:
            self.upgrade()
        else:
            self._check_schema()

    # -- lifecycle -------------------------------------------------------------------------------

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

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({safe_url(self.url)!r})"

    def _check_schema(self) -> None:
        rev = migrate.current(self._engine)
        if rev is None:
            raise LedgerError(
                f"no ledger schema in {safe_url(self.url)}: run `streamledger ledger upgrade --db URL` "
                "or open it with Ledger(url, create=True)"
            )
        if rev != _head():
            raise LedgerError(
                f"the ledger schema in {safe_url(self.url)} is at revision {rev}, this streamledger expects "
                f"{_head()}: run `streamledger ledger upgrade --db URL`"
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
    def _errors(self, what: str) -> Iterator[None]:
        """Turn database errors into one-line LedgerErrors (never with the URL's password)."""
        try:
            yield
        except LedgerError:
            raise
        except IntegrityError as exc:
            raise LedgerError(f"{what}: the ledger database refused it: {_db_message(exc)}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated or isinstance(exc.orig, ConnectionError):
                raise LedgerError(f"{what}: lost the ledger database {safe_url(self.url)}") from exc
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
            return session.execute(select(_DB_NOW)).scalar_one()
        return _now()

    def clock(self) -> datetime:
        """Now by the ledger's clock (aware UTC): compare the ledger's timestamps with this, never
        with the host's (see :meth:`_clock`)."""
        with self._tx("read the ledger clock", write=False) as session:
            return _utc(self._clock(session))

    def _clock_sql(self) -> ColumnElement[datetime]:
        """:meth:`_clock` inside a statement: no round trip of its own on PostgreSQL."""
        return _DB_NOW if self.dialect == "postgresql" else literal(_now(), DateTime())

    # -- sources ---------------------------------------------------------------------------------

    def _insert(self) -> Callable[[Any], Any]:
        return postgresql.insert if self.dialect == "postgresql" else sqlite.insert

    def _lock_source(self, session: Session, pipeline: str, src: SourceRef) -> Source:
        """The source row, created on first use and locked for the rest of the transaction."""
        names = {"pipeline": pipeline, "broker": src.broker, "stream": src.stream}
        found = session.scalars(_LOCK_SOURCE_BY_NAME, names).one_or_none()
        if found is not None:
            return found
        now = self._clock(session)
        insert = self._insert()
        session.execute(
            insert(Pipeline)
            .values(name=pipeline, created_at=now)
            .on_conflict_do_nothing(index_elements=["name"])
        )
        pipeline_id = session.scalars(select(Pipeline.id).where(Pipeline.name == pipeline)).one()
        session.execute(
            insert(Source)
            .values(
                pipeline_id=pipeline_id,
                broker=src.broker,
                stream=src.stream,
                super_stream=src.super_stream,
                created_at=now,
            )
            .on_conflict_do_nothing(index_elements=["pipeline_id", "broker", "stream"])
        )
        return session.scalars(_LOCK_SOURCE_BY_NAME, names).one()

    def _lock_sources(self, session: Session, source_ids: list[int]) -> None:
        """Take the claim lock of these sources (in id order, so two lockers never deadlock)."""
        if self.dialect != "postgresql" or not source_ids:
            return  # SQLite: BEGIN IMMEDIATE already holds the database's single write lock
        session.execute(
            select(Source.id).where(Source.id.in_(source_ids)).order_by(Source.id).with_for_update()
        ).all()

    def _find_source(self, session: Session, pipeline: str, src: SourceRef) -> Source | None:
        names = {"pipeline": pipeline, "broker": src.broker, "stream": src.stream}
        return session.scalars(_SOURCE_BY_NAME, names).one_or_none()

    @staticmethod
    def _tail(session: Session, source_id: int) -> int | None:
        """Exclusive end of the source's live ranges (contiguous, so: the one with the greatest start)."""
        return session.scalars(_TAIL, {"source_id": source_id}).first()

    @staticmethod
    def _first_hole(session: Session, source_id: int) -> Range | None:
        """The earliest failed range no live range overlaps: the next claim must redo it as-is."""
        return session.scalars(_FIRST_HOLE, {"source_id": source_id}).first()

    @staticmethod
    def _first_gap(session: Session, source_id: int, *, pinned: bool | None = None) -> int | None:
        """The first offset from the history's origin (its lowest live range) that no live range
        covers: the origin itself when no non-empty range starts there, else the earliest end of a
        non-empty live range that no non-empty live range continues (the tail, when none is
        missing). Only pinned claims leave such gaps (offsets of intervals not claimed yet); for a
        source with pinned ranges this walks its ranges (O(ranges), an index-only walk)."""
        if pinned is None:
            pinned = session.scalars(_ANY_PINNED, {"source_id": source_id}).first() is not None
        if not pinned:
            return None  # contiguous by the database's guard: the tail is the only end
        origin = session.scalars(_ORIGIN_START, {"source_id": source_id}).first()
        if origin is None:
            return None
        if session.scalars(_STARTS_AT, {"source_id": source_id, "at": origin}).first() is None:
            return int(origin)
        found = session.scalars(_FIRST_UNCONTINUED, {"source_id": source_id}).first()
        return None if found is None else int(found)

    @staticmethod
    def _hole_at(session: Session, source_id: int, start: int) -> Range | None:
        """The failed range starting at ``start`` that no live range overlaps, if any."""
        for failed in session.scalars(
            select(Range)
            .where(
                Range.source_id == source_id,
                Range.status == RangeStatus.FAILED.value,
                Range.start_offset == start,
                Range.end_offset > Range.start_offset,
            )
            .order_by(Range.end_offset.desc())
        ):
            overlapping = session.scalars(
                select(Range.id)
                .where(
                    Range.source_id == source_id,
                    _LIVE,
                    Range.start_offset < failed.end_offset,
                    Range.end_offset > failed.start_offset,
                    Range.end_offset > Range.start_offset,
                )
                .limit(1)
            ).first()
            if overlapping is None:
                return failed
        return None

    # -- the API ---------------------------------------------------------------------------------

    def claim(
        self,
        pipeline: str,
        source: SourceRef,
        end_limit: int,
        run: RunIdentity,
        *,
        initial_start: int | None = None,
        max_span: int | None = None,
        abandon_after: timedelta | None = None,
        span: tuple[int, int] | None = None,
        interval: tuple[datetime, datetime] | None = None,
    ) -> OffsetRange:
        """The range ``run`` processes next for ``pipeline`` and ``source``: the one claim rule.

        In one transaction, under the source's lock:

        1. the range ``run``'s key already holds (claimed or committed), whatever ``end_limit``
           says; a claimed one gets its ``try_number`` and heartbeat refreshed;
        2. else, after failing every other claim not heard from for ``abandon_after`` (its holder
           is gone), the oldest failed hole, redone with exactly its span;
        3. else ``[tail, min(max(tail, end_limit), tail + max_span))``; ``initial_start`` is the
           tail of a source without ranges (required then, ignored afterwards).

        A *pinned* claim (``span=(start, end)``, a data interval's offsets; ``interval`` is recorded
        with it) replaces 2 and 3: the live range with exactly this span if one exists (committed or
        lost by any run: an idempotent rerun; claimed by another run: refused, it is processed once),
        else exactly ``span``, wherever no live range covers it (overlaps are refused by the
        database). Holes are never taken (a failed interval waits for its own retry) and
        ``end_limit``/``max_span`` do not apply. On a source's first claim an ``initial_start``
        before the span is recorded as the history's origin (an empty committed range), so offsets
        from there to the first pinned range are a gap the watermark stops at, whichever interval
        runs first.

        An empty result is stored already committed with 0 records. Callers never re-derive this
        rule: they ask here and process what they get.
        """
        _check_pipeline(pipeline)
        what, pinned = self._claim_checked(pipeline, source, end_limit, run, initial_start, max_span,
                                           abandon_after, span, interval)
        if self.dialect == "postgresql":
            got = self._claim_pg(what, pipeline, source, end_limit, run, initial_start, max_span,
                                 abandon_after, pinned)
            return _pinned_answer(what, got, run, pinned)
        with self._tx(what) as session:
            ask = _Ask(what, source, end_limit, initial_start, pinned)
            return self._claim_sqlite(session, pipeline, [ask], run, max_span, abandon_after)[0]

    @staticmethod
    def _claim_checked(pipeline: str, source: SourceRef, end_limit: int, run: RunIdentity,
                       initial_start: int | None, max_span: int | None, abandon_after: timedelta | None,
                       span: tuple[int, int] | None, interval: tuple[datetime, datetime] | None,
                       ) -> tuple[str, _Pinned | None]:
        """A claim's arguments checked (before anything is written): its label and pinned span."""
        _check_offset("end_limit", end_limit, source.stream)
        if initial_start is not None:
            _check_offset("initial_start", initial_start, source.stream)
        if max_span is not None and (not isinstance(max_span, int) or max_span < 1):
            raise LedgerError(
                f"max_span for stream {source.stream!r} must be a positive integer, got {max_span!r}"
            )
        if abandon_after is not None and abandon_after < timedelta(0):
            raise LedgerError(f"abandon_after must not be negative, got {abandon_after}")
        pinned = _check_span(span, interval, source.stream)
        return f"claim for pipeline {pipeline!r} stream {source.stream!r} by {run}", pinned

    def _claim_sqlite(self, session: Session, pipeline: str, asks: Sequence[_Ask], run: RunIdentity,
                      max_span: int | None, abandon_after: timedelta | None) -> list[OffsetRange]:
        """The claim rule (see :meth:`claim`) on SQLite for one or many sources, in the caller's
        transaction (``BEGIN IMMEDIATE`` holds the database's write lock): what it reads is read
        for all sources at once (one statement per kind), then each source is decided by the same
        code and its range inserted."""
        found = self._find_sources(session, pipeline, [a.source for a in asks])
        srcs = [src if src is not None else self._lock_source(session, pipeline, a.source)
                for a, src in zip(asks, found, strict=True)]
        ids = [s.id for s in srcs]
        now = self._clock(session)
        held: dict[int, Range] = {}
        for chunk in _chunks(ids):
            for row in session.scalars(select(Range).where(
                    Range.source_id.in_(chunk), Range.dag_id == run.dag_id, Range.run_id == run.run_id,
                    Range.task_id == run.task_id, Range.map_index == run.map_index,
                    Range.status.in_((RangeStatus.CLAIMED.value, RangeStatus.COMMITTED.value)),
            ).order_by(Range.id)):
                held.setdefault(row.source_id, row)
        fresh = [i for i in ids if i not in held]
        if abandon_after is not None and fresh:
            self._abandon(session, fresh, now - abandon_after, now)
        free = [s.id for s, a in zip(srcs, asks, strict=True) if s.id not in held and a.pinned is None]
        facts: dict[int, Any] = {}
        for chunk in _chunks(free):
            facts.update((int(r.sid), r) for r in session.execute(select(
                Source.id.label("sid"),
                _first_hole_of(Source.id).with_only_columns(Range.id).scalar_subquery().label("hole"),
                _tail_of(Source.id).scalar_subquery().label("tail"),
            ).where(Source.id.in_(chunk))))
        holes = {int(r.id): r for chunk in _chunks([f.hole for f in facts.values() if f.hole is not None])
                 for r in session.scalars(select(Range).where(Range.id.in_(chunk)))}
        out: list[OffsetRange] = []
        for ask, src in zip(asks, srcs, strict=True):
            what, source, pinned = ask.what, ask.source, ask.pinned
            mine = held.get(src.id)
            if mine is not None:
                if mine.status == RangeStatus.CLAIMED.value:
                    mine.try_number = run.try_number
                    mine.heartbeat_at = now
                    mine.updated_at = now
                    session.flush()
                out.append(_pinned_answer(what, _snapshot(mine, pipeline, src), run, pinned))
                continue
            if pinned is not None:
                (start, end), _when = pinned
                done = session.scalars(select(Range).where(
                    Range.source_id == src.id, _LIVE, Range.start_offset == start, Range.end_offset == end,
                    Range.end_offset > Range.start_offset)).first()
                if done is not None:
                    out.append(_pinned_answer(what, _snapshot(done, pipeline, src), run, pinned))
                    continue
                if ask.initial_start is not None and ask.initial_start < start and session.scalars(
                        select(Range.id).where(Range.source_id == src.id).limit(1)).first() is None:
                    first = ask.initial_start
                    origin = self._new_row(src.id, first, first, RangeStatus.COMMITTED, _ORIGIN, now,
                                           error="origin of pinned ranges")
                    origin.records, origin.committed_at = 0, now
                    session.add(origin)
                    session.flush()
            else:
                f = facts[src.id]
                hole = holes[f.hole] if f.hole is not None else None
                if hole is not None:
                    start, end = hole.start_offset, hole.end_offset
                else:
                    start_or_none = f.tail if f.tail is not None else ask.initial_start
                    if start_or_none is None:
                        raise LedgerError(
                            f"{what}: the ledger has no range for this stream yet, so the first claim must "
                            "give initial_start (the first offset to read)"
                        )
                    start = int(start_or_none)
                    end = max(start, ask.end_limit)
                    if max_span is not None:
                        end = min(end, start + max_span)
            empty = start == end
            values: dict[str, Any] = {
                "source_id": src.id,
                "start_offset": start,
                "end_offset": end,
                # An empty range is nothing to process: stored already committed (0 records) so
                # the run stays auditable and idempotent without a claim left open.
                "status": RangeStatus.COMMITTED.value if empty else RangeStatus.CLAIMED.value,
                "dag_id": run.dag_id,
                "run_id": run.run_id,
                "task_id": run.task_id,
                "map_index": run.map_index,
                "try_number": run.try_number,
                "records": 0 if empty else None,
                "first_seen": None,
                "last_seen": None,
                "output": None,
                "offset_stored": False,
                "offset_verified": False,
                "error": None,
                "claimed_at": now,
                "committed_at": now if empty else None,
                "updated_at": now,
                "heartbeat_at": now,
                "staging": None,
                "pinned": pinned is not None,
                "interval_start": None if pinned is None else pinned[1][0],
                "interval_end": None if pinned is None else pinned[1][1],
            }
            values["id"] = session.execute(_INSERT_RANGE, values).scalar_one()
            made = SimpleNamespace(**values)
            self._sources[src.id] = (pipeline, source)
            out.append(_pinned_answer(what, _snapshot(made, pipeline, src), run, pinned))
        return out

    @staticmethod
    def _abandon(session: Session, source_ids: Sequence[int], before: datetime, now: datetime) -> None:
        """Fail the sources' claims whose holder has not beaten since ``before`` (SQLite path)."""
        seen = func.coalesce(Range.heartbeat_at, Range.claimed_at)
        for chunk in _chunks(list(source_ids)):
            for row in session.scalars(
                select(Range).where(
                    Range.source_id.in_(chunk), Range.status == RangeStatus.CLAIMED.value, seen < before
                )
            ):
                last = row.heartbeat_at or row.claimed_at
                row.status = RangeStatus.FAILED.value
                row.error = f"abandoned: no heartbeat since {last}"
                row.updated_at = now
        session.flush()

    def _claim_pg(
        self,
        what: str,
        pipeline: str,
        source: SourceRef,
        end_limit: int,
        run: RunIdentity,
        initial_start: int | None,
        max_span: int | None,
        abandon_after: timedelta | None,
        pinned: _Pinned | None = None,
    ) -> OffsetRange:
        """PostgreSQL: the same rule in one server-side call (migration 0008), one round trip; its
        ``now`` and abandonment cutoff are the server's clock (:meth:`_clock`)."""
        span, when = pinned if pinned is not None else ((None, None), (None, None))
        params = {
            "pipeline": pipeline,
            "broker": source.broker,
            "stream": source.stream,
            "super_stream": source.super_stream,
            "end_limit": end_limit,
            "dag_id": run.dag_id,
            "run_id": run.run_id,
            "task_id": run.task_id,
            "map_index": run.map_index,
            "try_number": run.try_number,
            "initial": initial_start,
            "max_span": max_span,
            "abandon_secs": None if abandon_after is None else abandon_after.total_seconds(),
            "span_start": span[0],
            "span_end": span[1],
            "interval_start": when[0],
            "interval_end": when[1],
        }
        outer = self._outer()
        if outer is not None:
            with self._errors(what):
                row = outer.execute(_PG_CLAIM, params).first()
        else:
            with self._errors(what), self._engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT")  # the call is its own transaction
                row = conn.execute(_PG_CLAIM, params).first()
        if row is None:
            raise LedgerError(
                f"{what}: the ledger has no range for this stream yet, so the first claim must give "
                "initial_start (the first offset to read)"
            )
        self._sources[row.source_id] = (pipeline, source)
        return _snapshot(row, pipeline, source)

    def claim_many(
        self,
        pipeline: str,
        requests: Sequence[ClaimRequest],
        run: RunIdentity,
        *,
        max_span: int | None = None,
        abandon_after: timedelta | None = None,
    ) -> list[OffsetRange]:
        """:meth:`claim` for every source of a batch in one transaction (answers in request order).

        Each source gets exactly what :meth:`claim` would give it (the same code decides); the
        claims take effect together, or, when one is refused, none does. Sources that exist already
        are locked first in id order (as every other multi-source locker does), so two batches over
        the same sources never deadlock.
        """
        _check_pipeline(pipeline)
        if len({(r.source.broker, r.source.stream) for r in requests}) != len(requests):
            raise LedgerError(f"claim_many for pipeline {pipeline!r}: a source is named twice")
        if not requests:
            return []
        out: dict[int, OffsetRange] = {}
        if self.dialect != "postgresql":
            asks = []
            for r in requests:
                what, pinned = self._claim_checked(pipeline, r.source, r.end_limit, run, r.initial_start,
                                                   max_span, abandon_after, r.span, r.interval)
                asks.append(_Ask(what, r.source, r.end_limit, r.initial_start, pinned))
            with self._tx(f"claims of pipeline {pipeline!r} by {run}") as session:
                return self._claim_sqlite(session, pipeline, asks, run, max_span, abandon_after)
        with self._joined(f"claims of pipeline {pipeline!r} by {run}") as session:
            order = self._lock_named(session, pipeline, [r.source for r in requests])
            for i in order:
                req = requests[i]
                out[i] = self.claim(pipeline, req.source, req.end_limit, run, initial_start=req.initial_start,
                                    max_span=max_span, abandon_after=abandon_after, span=req.span,
                                    interval=req.interval)
        return [out[i] for i in range(len(requests))]

    def _lock_named(self, session: Session, pipeline: str, sources: Sequence[SourceRef]) -> list[int]:
        """Lock the sources that exist (id order) and return the indexes of ``sources`` in the order
        to work on them: existing ones by id, then new ones by name."""
        brokers = sorted({s.broker for s in sources})
        found: dict[tuple[str, str], int] = {}
        for broker in brokers:
            names = [s.stream for s in sources if s.broker == broker]
            for chunk in range(0, len(names), 500):
                rows = session.execute(
                    select(Source.id, Source.stream)
                    .join(Pipeline, Pipeline.id == Source.pipeline_id)
                    .where(Pipeline.name == pipeline, Source.broker == broker,
                           Source.stream.in_(names[chunk:chunk + 500]))
                ).all()
                found.update({(broker, str(stream)): int(sid) for sid, stream in rows})
        self._lock_sources(session, sorted(found.values()))

        def order(i: int) -> tuple[int, int, str, str]:
            name = (sources[i].broker, sources[i].stream)
            return (0, found[name], "", "") if name in found else (1, 0, *name)

        return sorted(range(len(sources)), key=order)

    def commit_many(self, commits: Sequence[CommitRequest]) -> list[OffsetRange]:
        """:meth:`commit` for every range of a batch in one transaction: all take effect, or, when
        one is refused, none does (each is checked exactly as :meth:`commit` checks it)."""
        if not commits:
            return []
        with self._joined(f"commit of ranges {[c.range_id for c in commits]}"[:200]):
            return [self.commit(c.range_id, records=c.records, first_seen=c.first_seen, last_seen=c.last_seen,
                                output=c.output, staging=c.staging, publisher=c.publisher) for c in commits]

    def positions(self, pipeline: str, sources: Sequence[SourceRef], *,
                  stale_after: timedelta | None = None) -> list[SourcePosition]:
        """:meth:`position` of every source, read in one transaction (one consistent view) with
        one statement per kind for all of them."""
        _check_pipeline(pipeline)
        with self._tx(f"positions of {pipeline!r}", write=False) as session:
            return self._positions(session, pipeline, sources, stale_after)

    def watermarks(self, pipeline: str, sources: Sequence[SourceRef]) -> list[Watermark]:
        """:meth:`watermark` of every source, read in one transaction (a few statements for all)."""
        _check_pipeline(pipeline)
        with self._tx(f"watermarks of {pipeline!r}", write=False) as session:
            srcs = self._find_sources(session, pipeline, sources)
            marks = self._watermarks(session, pipeline, [s for s in srcs if s is not None])
            return [Watermark(None, None) if s is None else marks[s.id] for s in srcs]

    def mark_offsets_stored(self, range_ids: Sequence[int], verified: bool) -> None:
        """:meth:`mark_offset_stored` for several ranges in one transaction."""
        if range_ids:
            with self._joined(f"mark offsets stored for ranges {list(range_ids)}"[:200]):
                for range_id in range_ids:
                    self.mark_offset_stored(range_id, verified)

    def heartbeat(self, range_ids: list[int], run: RunIdentity) -> list[int]:
        """Refresh the heartbeat of ``run``'s claims; returns the ids it still holds.

        A range missing from the answer was taken from ``run`` (abandoned and re-claimed, or
        failed by an operator): the caller has lost it and its commit will be refused.
        """
        if not range_ids:
            return []
        now = self._clock_sql()
        with self._tx(f"heartbeat of {run}") as session:
            held = session.scalars(
                update(Range)
                .where(
                    Range.id.in_(list(range_ids)),
                    Range.status == RangeStatus.CLAIMED.value,
                    Range.dag_id == run.dag_id,
                    Range.run_id == run.run_id,
                    Range.task_id == run.task_id,
                    Range.map_index == run.map_index,
                )
                .values(heartbeat_at=now, updated_at=now)
                .returning(Range.id)
                .execution_options(synchronize_session=False)
            ).all()
            return sorted(int(i) for i in held)

    def open_claims(self, pipeline: str, source: SourceRef) -> list[OffsetRange]:
        """The source's claims that are not committed or failed yet (few: one per running batch)."""
        _check_pipeline(pipeline)
        with self._tx(f"open claims of {pipeline!r} {source.stream!r}", write=False) as session:
            src = self._find_source(session, pipeline, source)
            if src is None:
                return []
            rows = session.scalars(
                select(Range)
                .where(Range.source_id == src.id, Range.status == RangeStatus.CLAIMED.value)
                .order_by(Range.start_offset)
            ).all()
            return [_snapshot(r, pipeline, src) for r in rows]

    def watermark(self, pipeline: str, source: SourceRef) -> Watermark:
        """The end of the source's contiguous done prefix and the last record in it (see Watermark).

        This is the one rule for the broker's stored offset: the batch stores
        ``last_record`` when the broker is behind it, and the audit checks the broker against it.
        """
        return self.watermarks(pipeline, [source])[0]

    def _watermark(self, session: Session, pipeline: str, src: Source) -> Watermark:
        return self._watermarks(session, pipeline, [src])[src.id]

    def _facts(self, session: Session, ids: Sequence[int], *, position: bool = False) -> dict[int, Any]:
        """One row per source id with what the watermark (and, with ``position``, the position)
        starts from, each a correlated subquery: the same statements as for one source, so many
        sources cost one query, not one per kind and source."""
        sid = Source.id
        cols: list[Any] = [
            sid.label("sid"),
            select(Range.id).where(Range.source_id == sid, Range.status == RangeStatus.CLAIMED.value,
                                   Range.end_offset > Range.start_offset)
            .order_by(Range.start_offset).limit(1).scalar_subquery().label("claim"),
            _first_hole_of(sid).with_only_columns(Range.id).scalar_subquery().label("hole"),
            _tail_of(sid).scalar_subquery().label("tail"),
            select(Range.id).where(Range.source_id == sid, _IS_UNPUBLISHED).order_by(Range.start_offset)
            .limit(1).scalar_subquery().label("unpublished"),
            _any_pinned_of(sid).scalar_subquery().label("pinned"),
        ]
        if position:
            cols += [
                select(func.max(Range.last_seen)).where(
                    Range.source_id == sid, Range.status == RangeStatus.COMMITTED.value,
                    Range.offset_stored.is_(True)).scalar_subquery().label("stored"),
                select(Range.status).where(Range.source_id == sid, _LIVE)
                .order_by(Range.start_offset, Range.end_offset).limit(1)
                .scalar_subquery().label("first_live"),
            ]
        out: dict[int, Any] = {}
        for chunk in _chunks(list(ids)):
            out.update((int(r.sid), r) for r in session.execute(select(*cols).where(sid.in_(chunk))))
        return out

    def _watermarks(self, session: Session, pipeline: str, srcs: Sequence[Source],
                    facts: dict[int, Any] | None = None) -> dict[int, Watermark]:
        """The watermark rule (see :class:`Watermark`) for many sources at once: a few statements
        for all of them (:meth:`_facts`, the rows they name, the last record per source)."""
        facts = facts if facts is not None else self._facts(session, [s.id for s in srcs])
        wanted = {i for f in facts.values() for i in (f.claim, f.hole, f.unpublished) if i is not None}
        rows = {int(r.id): r for chunk in _chunks(sorted(wanted))
                for r in session.scalars(select(Range).where(Range.id.in_(chunk)))}
        ends: dict[int, int] = {}
        for src in srcs:
            f = facts[src.id]
            gap = (self._first_gap(session, src.id, pinned=f.pinned is not None)
                   if f.tail is not None else None)
            candidates = [x for x in (
                rows[f.claim].start_offset if f.claim is not None else None,
                rows[f.hole].start_offset if f.hole is not None else None,
                rows[f.unpublished].start_offset if f.unpublished is not None else None,
                gap,
                f.tail,
            ) if x is not None]
            if candidates:
                ends[src.id] = int(min(candidates))
        holders: dict[int, Any] = {}
        for chunk in _chunks(sorted(ends)):
            bound = case({i: literal(ends[i], BigInteger()) for i in chunk}, value=Source.id)
            last = (select(Range.id).where(
                Range.source_id == Source.id, Range.status == RangeStatus.COMMITTED.value,
                Range.end_offset <= bound, Range.last_seen.is_not(None),
            ).order_by(Range.last_seen.desc()).limit(1))
            holders.update((int(r.sid), r) for r in session.execute(select(
                Source.id.label("sid"), last.scalar_subquery().label("id"),
                last.with_only_columns(Range.last_seen).scalar_subquery().label("last_seen"),
            ).where(Source.id.in_(chunk))))
        out: dict[int, Watermark] = {}
        for src in srcs:
            if src.id not in ends:
                out[src.id] = Watermark(None, None)
                continue
            f, end = facts[src.id], ends[src.id]
            holder = holders[src.id]
            claim = rows[f.claim] if f.claim is not None else None
            unpublished = rows[f.unpublished] if f.unpublished is not None else None
            out[src.id] = Watermark(
                end=end,
                last_record=None if holder.last_seen is None else int(holder.last_seen),
                blocked_by=_snapshot(claim, pipeline, src) if claim is not None and claim.start_offset == end
                else None,
                last_record_range=None if holder.id is None else int(holder.id),
                unpublished=(_snapshot(unpublished, pipeline, src)
                             if unpublished is not None and unpublished.start_offset == end else None),
            )
        return out

    def _find_sources(self, session: Session, pipeline: str,
                      sources: Sequence[SourceRef]) -> list[Source | None]:
        """The source rows of ``sources`` (None where there is none yet), one query per broker."""
        found: dict[tuple[str, str], Source] = {}
        for broker in sorted({s.broker for s in sources}):
            names = [s.stream for s in sources if s.broker == broker]
            for chunk in _chunks(names):
                for src in session.scalars(
                    select(Source).join(Pipeline, Pipeline.id == Source.pipeline_id)
                    .where(Pipeline.name == pipeline, Source.broker == broker, Source.stream.in_(chunk))
                ):
                    found[(broker, src.stream)] = src
        return [found.get((s.broker, s.stream)) for s in sources]

    def rename_broker(self, old: str, new: str, *, pipeline: str | None = None) -> int:
        """Move sources from broker identity ``old`` to ``new`` (one history per broker).

        Used when a broker's identity changes form (0.1 named it by the URL's host and port; now by
        the cluster name it reports): the first batch that reaches the broker adopts the old rows.
        Refuses when ``new`` already has a history for the same pipeline and stream (two histories
        cannot be merged blindly). Returns the number of sources moved.
        """
        if not old or not new:
            raise LedgerError("rename_broker needs both the old and the new broker identity")
        if old == new:
            return 0
        with self._tx(f"rename broker {old!r} to {new!r}") as session:
            query = select(Source).where(Source.broker == old)
            if pipeline is not None:
                query = query.where(
                    Source.pipeline_id.in_(select(Pipeline.id).where(Pipeline.name == pipeline))
                )
            moving = session.scalars(query.with_for_update()).all()
            for src in moving:
                clash = session.scalars(
                    select(Source.id).where(
                        Source.pipeline_id == src.pipeline_id,
                        Source.broker == new,
                        Source.stream == src.stream,
                    )
                ).first()
                if clash is not None:
                    raise LedgerError(
                        f"stream {src.stream!r} already has a history under broker {new!r} and another "
                        f"under {old!r}; merge them by hand"
                    )
                src.broker = new
            self._sources.clear()
            return len(moving)

    def last_end(self, pipeline: str, source: SourceRef) -> int | None:
        """Where the next new range would start (None before the first range of this source)."""
        _check_pipeline(pipeline)
        with self._tx(f"last_end of {pipeline!r} {source.stream!r}", write=False) as session:
            src = self._find_source(session, pipeline, source)
            return None if src is None else self._tail(session, src.id)

    def _load(self, session: Session, range_id: int, *, lock: bool) -> tuple[Range, str, Source]:
        if not isinstance(range_id, int) or isinstance(range_id, bool):
            raise LedgerError(f"range id must be an integer, got {range_id!r}")
        found = session.execute(_LOAD_LOCKED if lock else _LOAD, {"range_id": range_id}).one_or_none()
        if found is None:
            raise LedgerError(f"range {range_id} does not exist in the ledger")
        return found[0], found[2], found[1]

    def get(self, range_id: int) -> OffsetRange:
        """The current state of one range."""
        with self._tx(f"read range {range_id}", write=False) as session:
            row, pipeline, src = self._load(session, range_id, lock=False)
            return _snapshot(row, pipeline, src)

    def commit(
        self,
        range_id: int,
        *,
        records: int,
        first_seen: int | None,
        last_seen: int | None,
        output: str | None,
        staging: str | None = None,
        publisher: str | None = None,
    ) -> OffsetRange:
        """Mark a claimed range processed; repeating an identical commit returns it unchanged.

        ``staging`` is where the verified output waits until it is published at ``output`` (without
        it the output is taken as published with the commit); it is
        recorded so a retry after a crash between this commit and the publish can finish it (or any
        later run of the pipeline, see :meth:`take_publish`). ``publisher`` names the committing
        attempt: it receives the publish lease in the same statement, so no other run starts
        publishing between this commit and the committer's own publish. Only
        the holder of the claim can commit (a claim taken from it is failed), which fences a
        worker that lost its claim out of both the commit and the publish.
        """
        what = f"commit range {range_id}"
        try:
            self._check_counts(f"range {range_id}", None, records, first_seen, last_seen)
        except LedgerError:
            with self._tx(what, write=False) as session:  # name the stream and span in the error
                row, pipeline, src = self._load(session, range_id, lock=False)
                label = f"range {range_id} ({pipeline} {src.stream} [{row.start_offset}, {row.end_offset}))"
                self._check_counts(label, row, records, first_seen, last_seen)
            raise
        params = {
            "range_id": range_id,
            "empty_commit": records == 0,
            "v_records": records,
            "v_first": first_seen,
            "v_last": last_seen,
            "v_output": _clip(output) if output is not None else None,
            "v_staging": _clip(staging) if staging is not None else None,
            "v_publisher": publisher if records else None,
            # Without a staging copy the output is already where it belongs: nothing left to publish.
            "v_publish_now": bool(records and staging is None),
        }
        joined = self._outer() is not None
        if self.dialect == "postgresql" and not joined:
            # The common case is one atomic statement: run it without BEGIN/COMMIT round trips.
            with self._errors(what), self._engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT")
                fast = conn.execute(_COMMIT_CLAIMED_PG, params).first()
                if fast is not None:
                    with Session(conn) as session:
                        pipeline, ref = self._source_info(session, fast.source_id)
                    return _snapshot(fast, pipeline, ref)
        with self._tx(what) as session:
            fast = None
            if self.dialect == "postgresql":
                if joined:  # the same one statement, inside the batch's transaction
                    fast = session.execute(_COMMIT_CLAIMED_PG, params).first()
            else:
                now = self._clock(session)
                fast = session.execute(_COMMIT_CLAIMED, {
                    **params,
                    "v_now": now,
                    "v_published": now if params["v_publish_now"] else None,
                    "v_publish_beat": now if params["v_publisher"] is not None else None,
                }).first()
            if fast is not None:
                pipeline, ref = self._source_info(session, fast.source_id)
                return _snapshot(fast, pipeline, ref)
            # Not a plain claimed range whose span fits: find out why (or an identical repeat).
            row, pipeline, src = self._load(session, range_id, lock=True)
            label = f"range {range_id} ({pipeline} {src.stream} [{row.start_offset}, {row.end_offset}))"
            self._check_counts(label, row, records, first_seen, last_seen)
            if row.status == RangeStatus.COMMITTED.value:
                if (row.records, row.first_seen, row.last_seen) == (records, first_seen, last_seen):
                    return _snapshot(row, pipeline, src)
                raise LedgerError(
                    f"{label} is already committed with records={row.records} first_seen={row.first_seen} "
                    f"last_seen={row.last_seen}; refusing a different commit"
                )
            if row.status != RangeStatus.CLAIMED.value:
                raise LedgerError(f"{label} is {row.status}; only a claimed range can be committed")
            now = self._clock(session)
            row.status = RangeStatus.COMMITTED.value
            row.records = records
            row.first_seen = first_seen
            row.last_seen = last_seen
            row.output = _clip(output) if output is not None else None
            row.staging = _clip(staging) if staging is not None else None
            if records and publisher is not None:
                row.publisher, row.publish_beat = publisher, now
            if records and staging is None:
                row.published_at = now
            row.committed_at = now
            row.updated_at = now
            session.flush()
            return _snapshot(row, pipeline, src)

    def _source_info(self, session: Session, source_id: int) -> tuple[str, SourceRef]:
        """Pipeline name and source of a source id (sources never change, so cached per Ledger)."""
        known = self._sources.get(source_id)
        if known is None:
            name, broker, stream, super_stream = session.execute(
                select(Pipeline.name, Source.broker, Source.stream, Source.super_stream)
                .join(Pipeline, Pipeline.id == Source.pipeline_id)
                .where(Source.id == source_id)
            ).one()
            known = (name, SourceRef(broker, stream, super_stream))
            self._sources[source_id] = known
        return known

    @staticmethod
    def _check_counts(
        label: str, row: Range | None, records: int, first_seen: int | None, last_seen: int | None
    ) -> None:
        if not isinstance(records, int) or isinstance(records, bool) or records < 0:
            raise LedgerError(f"{label}: records must be a non-negative integer, got {records!r}")
        if records == 0:
            if first_seen is not None or last_seen is not None:
                raise LedgerError(
                    f"{label}: 0 records but first_seen/last_seen given ({first_seen}, {last_seen})"
                )
            return
        if first_seen is None or last_seen is None:
            raise LedgerError(f"{label}: {records} records need first_seen and last_seen")
        if first_seen > last_seen:
            raise LedgerError(f"{label}: first_seen {first_seen} is after last_seen {last_seen}")
        if row is not None and not row.start_offset <= first_seen <= last_seen < row.end_offset:
            raise LedgerError(
                f"{label}: seen offsets {first_seen}..{last_seen} are not inside [{row.start_offset}, "
                f"{row.end_offset})"
            )
        if records > last_seen - first_seen + 1:
            raise LedgerError(
                f"{label}: {records} records cannot fit between offsets {first_seen} and {last_seen}"
            )

    def mark_offset_stored(self, range_id: int, verified: bool) -> None:
        """Record that the broker offset was stored for this committed range (and read back: verified)."""
        with self._tx(f"mark offset stored for range {range_id}") as session:
            row, pipeline, src = self._load(session, range_id, lock=True)
            if row.status != RangeStatus.COMMITTED.value:
                raise LedgerError(
                    f"range {range_id} ({pipeline} {src.stream}) is {row.status}; the broker offset is only "
                    "stored after a commit"
                )
            row.offset_stored = True
            row.offset_verified = bool(verified)
            row.updated_at = self._clock_sql()  # stamped in the UPDATE

    # -- publishing ------------------------------------------------------------------------------

    def unpublished(self, pipeline: str, source: SourceRef) -> list[OffsetRange]:
        """The source's committed ranges with records whose output is not published yet, by start."""
        _check_pipeline(pipeline)
        with self._tx(f"unpublished ranges of {pipeline!r} {source.stream!r}", write=False) as session:
            src = self._find_source(session, pipeline, source)
            if src is None:
                return []
            return [_snapshot(r, pipeline, src) for r in session.scalars(_UNPUBLISHED, {"source_id": src.id})]

    def unpublished_many(self, pipeline: str, sources: Sequence[SourceRef]) -> list[OffsetRange]:
        """:meth:`unpublished` of every source in one query (by source, then start)."""
        _check_pipeline(pipeline)
        with self._tx(f"unpublished ranges of {pipeline!r}", write=False) as session:
            srcs = {s.id: s for s in self._find_sources(session, pipeline, sources) if s is not None}
            out: list[OffsetRange] = []
            for chunk in _chunks(sorted(srcs)):
                out += [_snapshot(r, pipeline, srcs[r.source_id]) for r in session.scalars(
                    select(Range).where(Range.source_id.in_(chunk), _IS_UNPUBLISHED)
                    .order_by(Range.source_id, Range.start_offset))]
            return out

    def take_publish_many(self, requests: Sequence[tuple[int, str | None]], publisher: str, *,
                          lease: timedelta) -> list[OffsetRange | None]:
        """:meth:`take_publish` of several ranges (``(range_id, replace)`` each) in one transaction;
        answers in request order, each decided exactly as :meth:`take_publish` decides it."""
        if not requests:
            return []
        with self._joined(f"take the publish leases of {publisher}"):
            return [self.take_publish(i, publisher, lease=lease, replace=r) for i, r in requests]

    def mark_published_many(self, range_ids: Sequence[int], publisher: str) -> list[OffsetRange]:
        """:meth:`mark_published` of several ranges in one transaction (all or none)."""
        if not range_ids:
            return []
        with self._joined(f"mark ranges published by {publisher}"):
            return [self.mark_published(i, publisher) for i in range_ids]

    def take_publish(self, range_id: int, publisher: str, *, lease: timedelta,
                     replace: str | None = None) -> OffsetRange | None:
        """Take (or keep) the publish lease of a committed, unpublished range; None if another
        attempt holds a lease renewed within ``lease``, or there is nothing to publish.

        Only the lease holder publishes: a zombie attempt and its retry, or two runs finding the
        same stranded range, never copy into one directory at once. The lease moves only when its
        holder stopped renewing it (:meth:`renew_publish`) for ``lease``, or when the caller
        names the holder in ``replace`` (it knows that holder is gone or superseded: a
        compare-and-swap, so a third attempt that took the lease meanwhile keeps it).
        """
        if lease < timedelta(0):
            raise LedgerError(f"lease must not be negative, got {lease}")
        with self._tx(f"take the publish lease of range {range_id}") as session:
            row, pipeline, src = self._load(session, range_id, lock=True)
            now = self._clock(session)
            if row.status != RangeStatus.COMMITTED.value or not row.records or row.published_at is not None:
                return None
            beat = row.publish_beat
            if row.publisher not in (None, publisher, replace) and beat is not None and beat >= now - lease:
                return None
            row.publisher, row.publish_beat, row.updated_at = publisher, now, now
            session.flush()
            return _snapshot(row, pipeline, src)

    def renew_publish(self, range_ids: list[int], publisher: str) -> list[int]:
        """Renew ``publisher``'s publish leases; returns the ids it still holds (unpublished)."""
        if not range_ids:
            return []
        now = self._clock_sql()
        with self._tx(f"renew publish leases of {publisher}") as session:
            held = session.scalars(
                update(Range)
                .where(
                    Range.id.in_(list(range_ids)),
                    Range.publisher == publisher,
                    Range.published_at.is_(None),
                )
                .values(publish_beat=now)
                .returning(Range.id)
                .execution_options(synchronize_session=False)
            ).all()
            return sorted(int(i) for i in held)

    def release_publish(self, range_id: int, publisher: str) -> bool:
        """Give up ``publisher``'s lease of an unpublished range (its publish failed), so the next
        run takes it at once; True when there was one to give up."""
        with self._tx(f"release the publish lease of range {range_id}") as session:
            done = session.execute(
                update(Range)
                .where(Range.id == range_id, Range.publisher == publisher, Range.published_at.is_(None))
                .values(publisher=None, publish_beat=None)
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(done, "rowcount", 0))

    def mark_published(self, range_id: int, publisher: str, *,
                       table: tuple[str, int] | None = None) -> OffsetRange:
        """Record that the range's output is in its final place (idempotent for its publisher).

        Refused when another attempt holds the lease: that attempt may be copying into the same
        directory, so this one's copy proves nothing. ``table`` is a table sink's receipt,
        ``(table, commit)`` (see ``OffsetRange.sink_table``), recorded in the same statement.
        """
        with self._tx(f"mark range {range_id} published") as session:
            row, pipeline, src = self._load(session, range_id, lock=True)
            now = self._clock(session)
            label = f"range {range_id} ({pipeline} {src.stream} [{row.start_offset}, {row.end_offset}))"
            if row.status != RangeStatus.COMMITTED.value:
                raise LedgerError(f"{label} is {row.status}; only a committed range is published")
            if row.published_at is not None:
                return _snapshot(row, pipeline, src)
            if row.publisher != publisher:
                raise LedgerError(
                    f"{label}: the publish lease is held by {row.publisher or 'nobody'}, not {publisher}; "
                    "its output was not recorded as published"
                )
            row.published_at, row.updated_at = now, now
            if table is not None:
                row.sink_table, row.sink_commit = _clip(table[0]), int(table[1])
            session.flush()
            return _snapshot(row, pipeline, src)

    def new_epoch(self, pipeline: str, source: SourceRef, *, reason: str = "") -> tuple[int, int]:
        """Start a new history for a stream that was deleted and re-created (offsets from 0 again).

        The old history is kept, under the broker identity ``<broker>#epoch<N>`` (so neither a
        claim nor a broker check ever mixes the two streams; the audit still covers it), and the
        new epoch begins with an empty committed range ``[0, 0)``: the next batch reads the new
        stream from its first offset. Returns ``(old_epoch, new_epoch)``.
        """
        _check_pipeline(pipeline)
        what = f"new epoch for pipeline {pipeline!r} stream {source.stream!r}"
        with self._tx(what) as session:
            src = self._find_source(session, pipeline, source)
            if src is None:
                raise LedgerError(f"{what}: the ledger has no history for this stream on {source.broker}")
            self._lock_sources(session, [src.id])
            old = int(src.epoch)
            retired = retired_broker(src.broker, old)
            if session.scalars(select(Source.id).where(
                    Source.pipeline_id == src.pipeline_id, Source.broker == retired,
                    Source.stream == src.stream)).first() is not None:
                raise LedgerError(f"{what}: a retired history {retired!r} already exists; refusing to merge")
            open_claims = session.scalars(select(Range.id).where(
                Range.source_id == src.id, Range.status == RangeStatus.CLAIMED.value)).all()
            if open_claims:
                raise LedgerError(
                    f"{what}: claims {sorted(open_claims)} are still open; let them finish or fail them "
                    "(`streamledger ledger release-stale`) first"
                )
            src.broker = retired
            session.flush()
            now = self._clock(session)
            fresh = Source(pipeline_id=src.pipeline_id, broker=source.broker, stream=source.stream,
                           super_stream=source.super_stream, created_at=now, epoch=old + 1)
            session.add(fresh)
            session.flush()
            marker = RunIdentity("streamledger", f"new-epoch-{old + 1}", "ledger")
            row = self._new_row(fresh.id, 0, 0, RangeStatus.COMMITTED, marker, now,
                                error=_clip(f"epoch {old + 1} begins: {reason}") if reason else None)
            row.records, row.committed_at = 0, now
            session.add(row)
            self._sources.clear()
            return old, old + 1

    def position(self, pipeline: str, source: SourceRef, *,
                 stale_after: timedelta | None = None) -> SourcePosition:
        """Where ``pipeline`` stands on ``source`` (see :class:`SourcePosition`), in one transaction.

        Every poller (the batch, the Airflow sensor and triggers, the Dagster sensor and assets)
        reads the pipeline's position here, through ``streamledger.batch.position.measure``.
        """
        return self.positions(pipeline, [source], stale_after=stale_after)[0]

    def _positions(self, session: Session, pipeline: str, sources: Sequence[SourceRef],
                   stale_after: timedelta | None) -> list[SourcePosition]:
        srcs = self._find_sources(session, pipeline, sources)
        known = [s for s in srcs if s is not None]
        facts = self._facts(session, [s.id for s in known], position=True)
        marks = self._watermarks(session, pipeline, known, facts)
        ids = [s.id for s in known]
        claims: dict[int, list[Range]] = {i: [] for i in ids}
        holes: dict[int, list[Range]] = {i: [] for i in ids}
        for chunk in _chunks(ids):
            for row in session.scalars(select(Range).where(
                    Range.source_id.in_(chunk), Range.status == RangeStatus.CLAIMED.value)
                    .order_by(Range.source_id, Range.start_offset)):
                claims[row.source_id].append(row)
            for row in session.scalars(select(Range).where(Range.source_id.in_(chunk), _IS_HOLE)
                                       .order_by(Range.source_id, Range.start_offset)):
                holes[row.source_id].append(row)
        cutoff = (self._clock(session) - stale_after if stale_after is not None and any(claims.values())
                  else None)
        out: list[SourcePosition] = []
        for src in srcs:
            if src is None:
                out.append(SourcePosition(None, 0, None, Watermark(None, None)))
                continue
            f, mark = facts[src.id], marks[src.id]
            mine = claims[src.id]
            stale: frozenset[int] = frozenset()
            if cutoff is not None and mine:
                stale = frozenset(int(r.id) for r in mine if (r.heartbeat_at or r.claimed_at) < cutoff)
            done = f.first_live in (RangeStatus.COMMITTED.value, RangeStatus.LOST.value)
            out.append(SourcePosition(
                end=None if f.tail is None else int(f.tail),
                epoch=int(src.epoch),
                stored=None if f.stored is None else int(f.stored),
                watermark=mark,
                frontier=mark.end if done else None,
                open_claims=tuple(_snapshot(r, pipeline, src) for r in mine),
                stale=stale,
                holes=tuple(_snapshot(r, pipeline, src) for r in holes[src.id]),
            ))
        return out

    def epoch(self, pipeline: str, source: SourceRef) -> int:
        """The source's current epoch (0 until ``new_epoch``; 0 for a source without history)."""
        with self._tx(f"epoch of {pipeline!r} {source.stream!r}", write=False) as session:
            src = self._find_source(session, pipeline, source)
            return 0 if src is None else int(src.epoch)

    def fail(self, range_id: int, reason: str) -> None:
        """Give up a claimed range; its span is re-claimed as-is by the next claim of the source."""
        with self._tx(f"fail range {range_id}") as session:
            row, pipeline, src = self._load(session, range_id, lock=False)
            # Failing shrinks the live set, which claims read: serialise with them on the source.
            self._lock_sources(session, [src.id])
            row, pipeline, src = self._load(session, range_id, lock=True)
            if row.status == RangeStatus.FAILED.value:
                return
            if row.status != RangeStatus.CLAIMED.value:
                raise LedgerError(
                    f"range {range_id} ({pipeline} {src.stream} [{row.start_offset}, {row.end_offset})) is "
                    f"{row.status}; only a claimed range can fail"
                )
            row.status = RangeStatus.FAILED.value
            row.error = _clip(str(reason) or "failed")
            row.updated_at = self._clock_sql()  # stamped in the UPDATE

    def record_lost(
        self, pipeline: str, source: SourceRef, start: int, end: int, run: RunIdentity, reason: str
    ) -> OffsetRange:
        """Record ``[start, end)`` as lost (retention removed it) instead of failing the pipeline.

        Allowed at the source's tail, at the start of a hole a failed range left, or at the start of
        the range ``run`` holds claimed (that claim fails; whatever it covered beyond ``end`` is left
        as a failed remainder, which the next claim redoes).
        """
        _check_pipeline(pipeline)
        _check_offset("start", start, source.stream)
        _check_offset("end", end, source.stream)
        if end <= start:
            raise LedgerError(f"lost span [{start}, {end}) of stream {source.stream!r} is empty or reversed")
        what = f"record lost [{start}, {end}) for pipeline {pipeline!r} stream {source.stream!r}"
        with self._tx(what) as session:
            src = self._lock_source(session, pipeline, source)
            now = self._clock(session)
            mine = session.scalars(
                select(Range).where(
                    Range.source_id == src.id,
                    Range.dag_id == run.dag_id,
                    Range.run_id == run.run_id,
                    Range.task_id == run.task_id,
                    Range.map_index == run.map_index,
                    Range.status == RangeStatus.CLAIMED.value,
                )
            ).one_or_none()
            split: Range | None = None
            if mine is not None and mine.start_offset == start and end <= mine.end_offset:
                mine.status = RangeStatus.FAILED.value
                mine.error = _clip(f"lost: {reason}")
                mine.updated_at = now
                session.flush()
                split = mine
            else:
                hole = self._hole_at(session, src.id, start)
                tail = self._tail(session, src.id)
                if hole is not None and end <= hole.end_offset:
                    split = hole
                elif tail is not None and tail != start:
                    raise LedgerError(
                        f"{what}: a lost span must start at the ledger's tail {tail}, at a failed hole, "
                        "or at the start of the claim this run holds"
                    )
            lost = self._new_row(src.id, start, end, RangeStatus.LOST, run, now, error=_clip(reason))
            session.add(lost)
            if split is not None and end < split.end_offset:
                remainder_run = RunIdentity(
                    split.dag_id, split.run_id, split.task_id, split.map_index, split.try_number
                )
                session.add(
                    self._new_row(
                        src.id,
                        end,
                        split.end_offset,
                        RangeStatus.FAILED,
                        remainder_run,
                        now,
                        error=f"remainder of range {split.id} after lost span [{start}, {end})",
                    )
                )
            session.flush()
            return _snapshot(lost, pipeline, src)

    @staticmethod
    def _new_row(
        source_id: int,
        start: int,
        end: int,
        status: RangeStatus,
        run: RunIdentity,
        now: datetime,
        *,
        error: str | None = None,
    ) -> Range:
        return Range(
            source_id=source_id,
            start_offset=start,
            end_offset=end,
            status=status.value,
            dag_id=run.dag_id,
            run_id=run.run_id,
            task_id=run.task_id,
            map_index=run.map_index,
            try_number=run.try_number,
            offset_stored=False,
            offset_verified=False,
            error=error,
            claimed_at=now,
            updated_at=now,
        )

    def release_stale(self, older_than: timedelta, *, pipeline: str | None = None) -> list[OffsetRange]:
        """Fail every claim not heard from for ``older_than`` (its holder is gone), so its span is redone.

        "Heard from" is the claim's heartbeat (a running batch refreshes it), so a long job is never
        released just for being long; a claim that never beat counts from when it was claimed.
        """
        if older_than < timedelta(0):
            raise LedgerError(f"older_than must not be negative, got {older_than}")
        with self._tx("release stale claims") as session:
            now = self._clock(session)
            cutoff = now - older_than
            query = (
                select(Range, Source, Pipeline.name)
                .join(Source, Source.id == Range.source_id)
                .join(Pipeline, Pipeline.id == Source.pipeline_id)
                .where(
                    Range.status == RangeStatus.CLAIMED.value,
                    func.coalesce(Range.heartbeat_at, Range.claimed_at) < cutoff,
                )
                .order_by(Range.id)
            )
            if pipeline is not None:
                query = query.where(Pipeline.name == pipeline)
            candidates = session.execute(query).all()
            if not candidates:
                return []
            self._lock_sources(session, sorted({src.id for _r, src, _n in candidates}))
            rows = session.execute(query.with_for_update(of=Range)).all()
            if not rows:
                return []
            ids = [r[0].id for r in rows]
            session.execute(
                update(Range)
                .where(and_(Range.id.in_(ids), Range.status == RangeStatus.CLAIMED.value))
                .values(
                    status=RangeStatus.FAILED.value,
                    error=f"released: no heartbeat for {older_than}",
                    updated_at=now,
                )
                .execution_options(synchronize_session=False)
            )
            out = []
            for row, src, name in rows:
                session.refresh(row)
                out.append(_snapshot(row, name, src))
            return out

    def ranges(self, pipeline: str | None = None, *, stream: str | None = None) -> list[OffsetRange]:
        """All ranges (optionally of one pipeline / stream) ordered by pipeline, stream, start, id."""
        with self._tx("list ranges", write=False) as session:
            query = (
                select(Range, Source, Pipeline.name)
                .join(Source, Source.id == Range.source_id)
                .join(Pipeline, Pipeline.id == Source.pipeline_id)
                .order_by(Pipeline.name, Source.stream, Source.broker, Range.start_offset, Range.id)
            )
            if pipeline is not None:
                query = query.where(Pipeline.name == pipeline)
            if stream is not None:
                query = query.where(Source.stream == stream)
            return [_snapshot(row, name, src) for row, src, name in session.execute(query)]

    def audit(
        self,
        pipeline: str | None = None,
        *,
        broker: Brokers | None = None,
        stale_after: timedelta = timedelta(hours=1),
    ) -> AuditReport:
        """Check the invariants in SQL (see :mod:`streamledger.ledger.audit`).

        ``broker`` is ``callable(stream, reference) -> int | None`` or an object with that
        ``query_offset`` method (a connected ``StreamClient``), asked once per audited source; or a
        mapping broker identity -> such a lookup, so each source is asked of its own broker (sources
        of brokers not in it are skipped with a note).
        """
        with self._tx("audit", write=False) as session:

            def mark(source_id: int) -> Watermark:
                name, _ref = self._source_info(session, source_id)
                return self._watermark(session, name, session.get_one(Source, source_id))

            return run_audit(
                session, pipeline=pipeline, broker=broker, stale_after=stale_after, now=self._clock(session),
                watermark=mark
            )
