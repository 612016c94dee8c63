"""PostgreSQL: the claims of a batch's sources in one round trip.

``streamledger_claim_many(...)`` takes one array element per source (broker, stream, super stream,
end limit, initial start, pinned span and interval) and the arguments a batch shares, and returns
what ``streamledger_claim`` (0008, rule 2 from 0011) gives each source, in order: it calls that
function once per element, so the claim rule is still written once. A source whose first claim
lacks an initial start returns no row, as before. ``Ledger.claim_many`` creates and locks the
sources first (existing ones in id order, then the new ones by name), so the function finds every
source locked already. SQLite keeps the Python path.

Revision ID: 0013_pg_claim_many
Revises: 0012_pinned_redo_pieces
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013_pg_claim_many"
down_revision: str | None = "0012_pinned_redo_pieces"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FUNCTION = """
CREATE FUNCTION streamledger_claim_many(
  p_pipeline varchar, p_brokers varchar[], p_streams varchar[], p_super_streams varchar[],
  p_end_limits bigint[], p_dag_id varchar, p_run_id varchar, p_task_id varchar, p_map_index integer,
  p_try_number integer, p_initials bigint[], p_now timestamp, p_max_span bigint,
  p_abandon_before timestamp, p_span_starts bigint[], p_span_ends bigint[], p_interval_starts timestamp[],
  p_interval_ends timestamp[])
RETURNS SETOF streamledger_range LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  FOR i IN 1 .. COALESCE(array_length(p_streams, 1), 0) LOOP
    RETURN QUERY SELECT * FROM streamledger_claim(p_pipeline, p_brokers[i], p_streams[i], p_super_streams[i],
      p_end_limits[i], p_dag_id, p_run_id, p_task_id, p_map_index, p_try_number, p_initials[i], p_now,
      p_max_span, p_abandon_before, p_span_starts[i], p_span_ends[i], p_interval_starts[i],
      p_interval_ends[i]);
  END LOOP;
END;
$$
"""

_SIGNATURE = (
    "streamledger_claim_many(varchar, varchar[], varchar[], varchar[], bigint[], varchar, varchar, varchar, "
    "integer, integer, bigint[], timestamp, bigint, timestamp, bigint[], bigint[], timestamp[], timestamp[])"
)


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(_FUNCTION)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {_SIGNATURE}")
