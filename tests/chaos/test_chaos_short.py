"""The short chaos variant inside ``make test``: a real Airflow 3 (api-server, scheduler with the
LocalExecutor, dag-processor, triggerer) runs the example backfill DAG while records are published,
two task processes are SIGKILLed, the broker restarts mid-read and PostgreSQL mid-commit; at the
end every record is in exactly one committed output, the stored offsets are the ledger's watermark,
no claim is left and the audit is clean. ``make chaos`` is the long form (20 kills).
"""

from __future__ import annotations

import os

import pytest

from tests.chaos.harness import ChaosOptions, report, run_chaos
from tests.support.rabbitmq import ensure_broker, streamledger_home

pytestmark = [pytest.mark.airflow, pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.spark,
              pytest.mark.slow]


@pytest.mark.timeout(1800)
def test_chaos_short() -> None:
    # The run directory is under $STREAMLEDGER_HOME (PostgreSQL runs as its own user and cannot
    # enter pytest's private tmp directories); it is removed when the run is clean.
    ensure_broker("4.3")  # provisions the installation the private node runs from
    opts = ChaosOptions(
        seed=int(os.environ.get("STREAMLEDGER_CHAOS_SEED", "7")), kills=2, duration=30, interval=20,
        rate=20, idle_runs=1, interval_grace=5, settle_timeout=900, broker_home=streamledger_home(),
    )
    result = run_chaos(opts)
    print(report(result))
    assert result.figures.kills == 2 and result.figures.broker_restarts == 1
    assert result.figures.postgres_restarts == 1
    assert result.figures.published > 0 and result.figures.missing == 0 and result.figures.duplicates == 0
    assert result.clean, report(result)
