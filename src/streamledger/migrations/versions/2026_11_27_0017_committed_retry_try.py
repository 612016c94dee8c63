"""A retry handed back its committed range keeps its try: ``streamledger_idle_run.try_number``.

Rule 1 of the claim hands a run key back the range it holds. A claimed one records the new try on
the range; a committed one recorded nothing, so ``Ledger.last_try`` stayed at the committing try
and ``batch run --run-id`` numbered the third, fourth... attempt try 2 again: a publish lease a
killed try 2 left was not taken over as superseded but refused until ``claim_timeout``.

* The committed range keeps the try that committed it (coverage, lost ranges and the audit name
  that attempt). The later try is recorded with the run in ``streamledger_idle_run`` (0014/0015),
  raised only when it grows, the one place ``last_try`` reads a run's tries beside its ranges: no
  new table or column, and rule 1 stays one rule (a source the key never claimed answers the retry
  "nothing new" at its tail: a retry redoes its run's work and takes no new work).
* PostgreSQL ``streamledger_claim`` (0015's text, one edit; same signature, so replaced in place)
  does it in its rule 1 branch. SQLite does it in ``Claims._claim_sqlite``. No schema change.

Revision ID: 0017_committed_retry_try
Revises: 0016_one_broker_names
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from streamledger.migrations.revisions import previous as _previous

revision: str = "0017_committed_retry_try"
down_revision: str | None = "0016_one_broker_names"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_HELD = """\
    IF held.status = 'claimed' THEN
      UPDATE streamledger_range SET try_number = p_try_number, heartbeat_at = p_now, updated_at = p_now
       WHERE id = held.id RETURNING * INTO held;
    END IF;"""
_NEW_HELD = """\
    IF held.status = 'claimed' THEN
      UPDATE streamledger_range SET try_number = p_try_number, heartbeat_at = p_now, updated_at = p_now
       WHERE id = held.id RETURNING * INTO held;
    ELSIF p_try_number > held.try_number THEN
      -- a committed range keeps its try; the later try is recorded with the run (0017: last_try)
      INSERT INTO streamledger_idle_run (pipeline_id, dag_id, run_id, task_id, map_index, claimed_at,
          try_number)
        SELECT src.pipeline_id, p_dag_id, p_run_id, p_task_id, p_map_index, p_now, p_try_number
          FROM streamledger_source src WHERE src.id = sid
        ON CONFLICT (pipeline_id, dag_id, run_id, task_id, map_index) DO UPDATE
          SET try_number = EXCLUDED.try_number
          WHERE streamledger_idle_run.try_number < EXCLUDED.try_number;
    END IF;"""


def function(with_retry: bool) -> str:
    """The PostgreSQL claim function of this revision (``with_retry``) or of 0015, as a replacement."""
    text = str(_previous("2026_11_27_0015_idle_run_try.py").function(with_try=True))
    if with_retry:
        assert text.count(_OLD_HELD) == 1, _OLD_HELD
        text = text.replace(_OLD_HELD, _NEW_HELD)
    return text


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(function(with_retry=True))


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(function(with_retry=False))
