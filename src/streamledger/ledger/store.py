"""The :class:`Ledger`: a small face over the ledger's rooms, each a mixin over one session.

Every mutation runs in one short transaction that first locks the source row (``SELECT ... FOR
UPDATE`` on PostgreSQL; the whole database via ``BEGIN IMMEDIATE`` on SQLite), so the decisions
"where does the next range start" and "insert it" can never interleave between two claimers. The
database re-checks the same rules with constraints and triggers (migration ``0002``), so a bug here
or a hand-written SQL statement cannot silently break them.

The rooms: :mod:`~streamledger.ledger.statements` (the SQL), :mod:`~streamledger.ledger.session`
(engine, transactions, the database's clock, schema check), :mod:`~streamledger.ledger.sources`
(sources and epochs), :mod:`~streamledger.ledger.claims`, :mod:`~streamledger.ledger.commits`,
:mod:`~streamledger.ledger.publishing` (publish leases), :mod:`~streamledger.ledger.positions`
(positions and watermarks) and :mod:`~streamledger.ledger.lost` (lost and stale ranges).
"""

from __future__ import annotations

from datetime import timedelta

from streamledger.ledger.audit import AuditReport, Brokers, run_audit
from streamledger.ledger.claims import Claims
from streamledger.ledger.commits import Commits
from streamledger.ledger.engine import safe_url
from streamledger.ledger.lost import LostAndStale
from streamledger.ledger.models import Source
from streamledger.ledger.positions import Positions
from streamledger.ledger.publishing import PublishLeases
from streamledger.ledger.types import Watermark


class Ledger(Claims, Commits, PublishLeases, Positions, LostAndStale):
    """The offset ledger at one database URL (SQLite file or PostgreSQL), with its own engine.

    ``create=True`` runs the migrations to head first (safe to do from many processes at once);
    otherwise the schema must already be at head (``streamledger ledger upgrade --ledger URL``).
    """

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({safe_url(self.url)!r})"

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
