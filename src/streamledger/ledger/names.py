"""Two names of one broker, remembered (``streamledger_one_broker``, migration 0016).

A batch's claim-time refusal and the audit find that two broker identities of a pipeline's stream are
one broker by a chunk the broker holds; retention rolls that chunk out, so the finding is written
here the first time it is made, for both names, and read back as :class:`SameBroker`. A chunk print
cannot tell two mirrors fed the same records apart from one broker, so the operator's verdict that
two names are two brokers (``distinct-brokers``) is a row here too (``verdict`` 'distinct'), read back
with the records (``SameBroker.distinct``) and never replaced by a later finding. What counts as one
broker is decided elsewhere (``streamledger.batch.identity``): the ledger stores and reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from itertools import permutations
from typing import Any, cast

from sqlalchemy import DateTime, Table, Text, and_, delete, literal, null, or_, select, union_all
from sqlalchemy import cast as cast_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from streamledger.ledger.errors import LedgerError
from streamledger.ledger.models import OneBroker, Pipeline, Source
from streamledger.ledger.rows import check_pipeline, clip, utc
from streamledger.ledger.session import LedgerSession
from streamledger.ledger.statements import TAIL
from streamledger.ledger.types import SameBroker, SourceRef, is_retired

DISTINCT = "distinct"
"""``streamledger_one_broker.verdict`` of the operator's verdict: two brokers (else 'same')."""


class BrokerNames(LedgerSession):
    """The records of broker identities found to be one broker, per pipeline and stream."""

    def record_same_broker(self, pipeline: str, stream: str, names: Sequence[str], why: str) -> int:
        """Remember that ``names`` (two or more broker identities) reach one broker for ``pipeline``'s
        ``stream``: a row for every ordered pair, so each name's source holds it (a name with no
        history yet included). A pair already recorded keeps its first finding, and a pair the
        operator judged two brokers (:meth:`record_distinct_brokers`) stays judged. Returns the rows
        added."""
        check_pipeline(pipeline)
        named = sorted({n for n in names if n})
        if len(named) < 2 or any(is_retired(n) for n in named):
            raise LedgerError(f"stream {stream!r} of pipeline {pipeline!r}: one broker needs two live "
                              f"identities, got {named}")
        with self._tx(f"stream {stream!r} of pipeline {pipeline!r}: one broker under {named}") as session:
            insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
            now = self._clock(session)
            session.execute(insert(Pipeline).values(name=pipeline, created_at=now)
                            .on_conflict_do_nothing(index_elements=["name"]))
            pid = session.scalars(select(Pipeline.id).where(Pipeline.name == pipeline)).one()
            rows = [{"pipeline_id": pid, "stream": stream, "broker": a, "other": b, "found_at": now,
                     "why": clip(why)} for a, b in permutations(named, 2)]
            added = session.connection().execute(insert(OneBroker).values(rows).on_conflict_do_nothing(
                index_elements=["pipeline_id", "stream", "broker", "other"]).returning(OneBroker.id))
            return len(added.all())

    def as_recorded(self, identity: str) -> str:
        """``identity`` as the ledger spells it: the one recorded name (a history's or a record's) of
        its canonical spelling (:func:`streamledger.sources.canonical_identity`), else the canonical
        spelling, which every writer records. What a command naming a broker by hand acts on."""
        from streamledger.sources import canonical_identity

        canon = canonical_identity(identity)
        with self._tx("broker names", write=False) as session:
            names = {*session.scalars(select(Source.broker).distinct()),
                     *session.scalars(select(OneBroker.broker).distinct())}
        spelled = sorted(str(n) for n in names if canonical_identity(str(n)) == canon)
        return canon if canon in spelled or len(spelled) != 1 else spelled[0]

    def record_distinct_brokers(self, first: str, second: str, *, pipeline: str | None = None,
                                stream: str | None = None, why: str = "") -> list[tuple[str, str]]:
        """The operator's verdict that broker identities ``first`` and ``second`` are two brokers (a
        mirror fed the same records holds chunks of one print, which no chunk tells apart): written
        for both names of ``pipeline``'s ``stream``, replacing a one-broker record, and kept against
        every later finding. Without ``stream`` (or ``pipeline``): every stream (pipeline) either
        name has a history or a record of. Returns the (pipeline, stream) pairs judged, sorted, for
        the operator to see what the audit now accepts read under both names."""
        if pipeline is not None:
            check_pipeline(pipeline)
        named = sorted({first, second})
        if len(named) < 2 or any(not n or is_retired(n) for n in named):
            raise LedgerError(f"two brokers need two live identities, got {named}")
        what = f"{named[0]} and {named[1]} judged two brokers"
        with self._tx(what) as session:
            insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
            now = self._clock(session)
            if pipeline is not None and stream is not None:
                session.execute(insert(Pipeline).values(name=pipeline, created_at=now)
                                .on_conflict_do_nothing(index_elements=["name"]))
                pid = session.scalars(select(Pipeline.id).where(Pipeline.name == pipeline)).one()
                judged = {(int(pid), stream)}
            else:
                judged = self._judged(session, named, pipeline, stream)
            if not judged:
                raise LedgerError(f"{what}: nothing to judge (no history or record under either name"
                                  f"{'' if pipeline is None else f' for pipeline {pipeline!r}'}"
                                  f"{'' if stream is None else f', stream {stream!r}'}; name --pipeline "
                                  "and --stream to judge ahead)")
            rows = [{"pipeline_id": pid, "stream": s, "broker": a, "other": b, "found_at": now,
                     "why": clip(why), "verdict": "distinct"}
                    for pid, s in sorted(judged) for a, b in permutations(named, 2)]
            stmt = insert(OneBroker).values(rows)
            session.execute(stmt.on_conflict_do_update(
                index_elements=["pipeline_id", "stream", "broker", "other"],
                set_={"verdict": stmt.excluded.verdict, "why": stmt.excluded.why,
                      "found_at": stmt.excluded.found_at}))
            ids = sorted({p for p, _s in judged})
            names = dict(session.execute(select(Pipeline.id, Pipeline.name).where(Pipeline.id.in_(ids)))
                         .tuples().all())
            return sorted((str(names[p]), st) for p, st in judged)

    @staticmethod
    def _judged(session: Session, named: Sequence[str], pipeline: str | None, stream: str | None
                ) -> set[tuple[int, str]]:
        """(pipeline id, stream) of every history or record under either of ``named`` (within
        ``pipeline`` and ``stream`` when given): what a verdict without both applies to."""
        scope_p = [] if pipeline is None else [Pipeline.name == pipeline]
        found: set[tuple[int, str]] = set()
        q_sources = (select(Source.pipeline_id, Source.stream)
                     .join(Pipeline, Pipeline.id == Source.pipeline_id)
                     .where(Source.broker.in_(named), *scope_p))
        q_records = (select(OneBroker.pipeline_id, OneBroker.stream)
                     .join(Pipeline, Pipeline.id == OneBroker.pipeline_id)
                     .where(or_(OneBroker.broker.in_(named), OneBroker.other.in_(named)), *scope_p))
        if stream is not None:
            q_sources = q_sources.where(Source.stream == stream)
            q_records = q_records.where(OneBroker.stream == stream)
        for query in (q_sources, q_records):
            found |= {(int(pid), str(s)) for pid, s in session.execute(query)}
        return found

    def same_broker(self, pipeline: str | None = None) -> list[SameBroker]:
        """Every record (of ``pipeline``, or of all pipelines), each with where its other name's
        live history of the stream ends now; records naming a retired epoch are left out."""
        if pipeline is not None:
            check_pipeline(pipeline)
        with self._tx("one-broker records", write=False) as session:
            query = (select(Pipeline.name, OneBroker).join(Pipeline, Pipeline.id == OneBroker.pipeline_id)
                     .order_by(Pipeline.name, OneBroker.stream, OneBroker.broker, OneBroker.other))
            if pipeline is not None:
                query = query.where(Pipeline.name == pipeline)
            return self._as_records(session, [(str(n), row) for n, row in session.execute(query)])

    @staticmethod
    def _names_query(pipeline: str, broker: str, streams: Sequence[str]) -> Any:
        """One statement for a position's other names of ``streams`` (``record`` 0: the pipeline's
        sources of them under another identity, ``sid`` and ``name``) and the records of ``broker``'s
        (``record`` 1: ``name`` the other identity, its finding): both are asked before every claim,
        and both find nothing in the usual case."""
        when, why = cast_(null(), DateTime()).label("found_at"), cast_(null(), Text()).label("why")
        verdict = cast_(null(), Text()).label("verdict")
        sources = (select(literal(0).label("record"), Source.id.label("sid"), Source.broker.label("name"),
                          Source.stream.label("stream"), when, why, verdict)
                   .join(Pipeline, Pipeline.id == Source.pipeline_id)
                   .where(Pipeline.name == pipeline, Source.stream.in_(streams), Source.broker != broker))
        records = (select(literal(1), OneBroker.pipeline_id, OneBroker.other, OneBroker.stream,
                          OneBroker.found_at, OneBroker.why, cast_(OneBroker.verdict, Text()))
                   .join(Pipeline, Pipeline.id == OneBroker.pipeline_id)
                   .where(Pipeline.name == pipeline, OneBroker.stream.in_(streams),
                          OneBroker.broker == broker))
        return union_all(sources, records)

    @staticmethod
    def _records_of(session: Session, pipeline: str, marks: dict[tuple[str, str], list[Any]],
                    theirs: dict[tuple[str, str], list[tuple[int, str]]]
                    ) -> dict[tuple[str, str], tuple[SameBroker, ...]]:
        """The rows :meth:`_names_query` found as records, each with where its other name's history
        ends (``theirs``: the other names' source ids; a tail read per record, only when there are
        records). A name with records gets the stream's records of the other names too (one query
        more, only then): the batch joins them into groups (``streamledger.batch.identity``), so a
        name recorded with a second that is recorded with a third is refused on the third's history."""
        out: dict[tuple[str, str], tuple[SameBroker, ...]] = {}
        for (broker, stream), rows in marks.items():
            sids = {name: sid for sid, name in theirs.get((broker, stream), [])}
            others = session.execute(
                select(OneBroker.broker.label("owner"), OneBroker.other.label("name"), OneBroker.found_at,
                       OneBroker.why, OneBroker.verdict)
                .join(Pipeline, Pipeline.id == OneBroker.pipeline_id)
                .where(Pipeline.name == pipeline, OneBroker.stream == stream, OneBroker.broker != broker))
            found: list[SameBroker] = []
            mine = [(broker, row) for row in rows]
            for owner, row in sorted([*mine, *((str(r.owner), r) for r in others)],
                                     key=lambda x: (x[0] != broker, x[0], str(x[1].name))):
                if is_retired(row.name) or is_retired(owner):
                    continue
                sid = sids.get(row.name)
                end = None if sid is None else session.scalars(TAIL, {"source_id": sid}).first()
                found.append(SameBroker(pipeline, SourceRef(owner, stream), str(row.name), str(row.why),
                                        utc(_when(row.found_at)), None if end is None else int(end),
                                        distinct=row.verdict == DISTINCT))
            if found:
                out[(broker, stream)] = tuple(found)
        return out

    @staticmethod
    def _as_records(session: Session, rows: Iterable[tuple[str, OneBroker]]) -> list[SameBroker]:
        out: list[SameBroker] = []
        for pipeline, row in rows:
            if is_retired(row.other) or is_retired(row.broker):
                continue
            sid = session.scalars(select(Source.id).where(
                Source.pipeline_id == row.pipeline_id, Source.broker == row.other,
                Source.stream == row.stream)).first()
            end = None if sid is None else session.scalars(TAIL, {"source_id": sid}).first()
            out.append(SameBroker(pipeline, SourceRef(row.broker, row.stream), row.other, row.why,
                                  utc(row.found_at), None if end is None else int(end),
                                  distinct=row.verdict == DISTINCT))
        return out


def _when(value: Any) -> datetime:
    """A timestamp a union handed back (SQLite gives its text)."""
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def rename_in_records(session: Session, old: str, new: str, pipeline_ids: Sequence[int] | None) -> None:
    """The records follow a broker's rename (``Ledger.rename_broker``): a pair naming ``old`` names
    ``new``, one the rename made a single name is dropped (nothing is left to refuse), and one
    already recorded under ``new`` is kept once (its first finding; a ``distinct`` verdict of either
    wins, as it wins over a later finding)."""
    t = cast(Table, OneBroker.__table__)
    scope = [] if pipeline_ids is None else [t.c.pipeline_id.in_(list(pipeline_ids))]
    conn = session.connection()
    moving = conn.execute(select(t).where(or_(t.c.broker == old, t.c.other == old), *scope)).all()
    if not moving:
        return
    conn.execute(delete(t).where(t.c.id.in_([r.id for r in moving])))
    for r in sorted(moving, key=lambda r: r.found_at):
        broker, other = (new if r.broker == old else r.broker), (new if r.other == old else r.other)
        if broker == other:
            continue
        there = conn.execute(select(t.c.id, t.c.verdict).where(and_(
            t.c.pipeline_id == r.pipeline_id, t.c.stream == r.stream, t.c.broker == broker,
            t.c.other == other))).first()
        if there is None:
            conn.execute(t.insert().values(pipeline_id=r.pipeline_id, stream=r.stream, broker=broker,
                                           other=other, found_at=r.found_at, why=r.why, verdict=r.verdict))
        elif r.verdict == DISTINCT and there.verdict != DISTINCT:
            conn.execute(t.update().where(t.c.id == there.id).values(found_at=r.found_at, why=r.why,
                                                                     verdict=r.verdict))
