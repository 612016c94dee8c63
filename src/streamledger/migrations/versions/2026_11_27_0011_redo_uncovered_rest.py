"""The claim rule redoes every offset a failed range held that no live range covers, not only failed
ranges nobody redid at all.

A failed range a later range covers in part (a lost span recorded at the tail reaching into it, a
narrower pinned range of another run) was no *hole* any more, so the rest of it was never handed out
again: a gap the watermark could pass. Rule 2 of the claim now takes the lowest such offset and
claims from there to the end of the failed range holding it or the next live range.

* ``streamledger_claim`` (PostgreSQL): rule 2 is the redo statement of
  ``streamledger.ledger.statements.redo_spans_sql`` (a frozen copy of it in
  ``sql/streamledger_claim/0011.sql``; a test finds the statement in the function's text at head),
  in place of "the failed range with the lowest start no live range overlaps".
* 0002's contiguity guard (both dialects) lets a range start anywhere inside a failed range that
  holds all of it (before: only at a failed range's start), so the rest after a covered head may be
  claimed while the tail lies further on. Overlaps stay refused.

Revision ID: 0011_redo_uncovered_rest
Revises: 0010_source_tail_replaced
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from streamledger.migrations.revisions import install_function, install_trigger

revision: str = "0011_redo_uncovered_rest"
down_revision: str | None = "0010_source_tail_replaced"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _install(version: str) -> None:
    if op.get_context().dialect.name == "postgresql":
        install_function(op, "streamledger_range_guard", version)
        install_function(op, "streamledger_claim", version)  # same signature: replaced in place
    else:
        install_trigger(op, "streamledger_range_insert_guard", version)


def upgrade() -> None:
    _install("0011")


def downgrade() -> None:
    _install("0008")
