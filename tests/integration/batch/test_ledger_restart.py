"""A PostgreSQL restart under a batch (the ledger, and the Iceberg SQL catalog in the same database):
what a task log shows and what the next attempt meets. Against a private PostgreSQL cluster of its
own (the shared one of the other tests is never restarted), the real 4.3 broker and local Spark.
"""

from __future__ import annotations

import logging
import os
import shutil
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import run_batch
from streamledger.errors import StreamledgerError
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.chaos.servers import PrivatePostgres
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.spark.helpers import create_stream

pytestmark = pytest.mark.timeout(600)

PIPE = "p-exactly-once"
SL_HOME = Path(os.environ.get("STREAMLEDGER_HOME", "/var/tmp/streamledger"))


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    """A cluster this module may restart (under the state home: its server user must reach it)."""
    home = SL_HOME / "pg-restart-tests" / uuid.uuid4().hex[:8]
    pg = PrivatePostgres(home)
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def pg_ledger(private_pg: PrivatePostgres) -> Iterator[Ledger]:
    ledger = Ledger(private_pg.create_database(f"l_{uuid.uuid4().hex[:8]}"), create=True)
    try:
        yield ledger
    finally:
        ledger.close()


def restart_after(pg: PrivatePostgres, step: str) -> Any:
    def hook(name: str, _batch: Any) -> None:
        if name == step:
            pg.restart()

    return hook


def raw_driver_text(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Log records carrying a traceback or a database driver's own error class."""
    return [r.getMessage() for r in caplog.records
            if r.exc_info or "AdminShutdown" in r.getMessage() or "psycopg" in r.getMessage()]


@pytest.mark.parametrize("sink", ["directory", "iceberg"])
def test_a_postgres_restart_during_the_job_leaves_the_batch_clean(
    sink: str, private_pg: PrivatePostgres, pg_ledger: Ledger, client: StreamClient, runner: CountingRunner,
    rabbitmq_url: str, stream_name: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The database restarts while the batch's job runs (its connections from the claim are dead
    by the commit): the batch commits and publishes with new connections, no error, no traceback."""
    s = stream_name(f"pgr-{sink}")
    create_stream(rabbitmq_url, s, 50)
    cfg = config(rabbitmq_url, tmp_path, s, sink=sink)
    caplog.set_level(logging.INFO)
    result = run_batch(cfg, run=rid("t"), ledger=pg_ledger, broker=client, runner=runner,
                       on_step=restart_after(private_pg, "read"))
    assert [(p.status, p.records) for p in result.partitions] == [("committed", 50)]
    assert [(r.status, r.records) for r in pg_ledger.ranges(PIPE)] == [(RangeStatus.COMMITTED, 50)]
    assert not raw_driver_text(caplog)


def test_the_ledger_down_at_the_commit_is_one_line_and_the_retry_is_clean(
    private_pg: PrivatePostgres, pg_ledger: Ledger, client: StreamClient, runner: CountingRunner,
    rabbitmq_url: str, stream_name: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The database goes away after the job and is not back by the commit: the try fails with one
    line naming the ledger and the reason, and logs no driver traceback; the next try (the database
    back) commits every record once."""
    s = stream_name("pgr-down")
    create_stream(rabbitmq_url, s, 40)
    cfg = config(rabbitmq_url, tmp_path, s)

    def stop(name: str, _batch: Any) -> None:
        if name == "read":
            private_pg.stop()

    caplog.set_level(logging.INFO)
    try:
        with pytest.raises(StreamledgerError) as failed:
            run_batch(cfg, run=rid("t"), ledger=pg_ledger, broker=client, runner=runner, on_step=stop)
    finally:
        private_pg.start()
    said = str(failed.value)
    assert "\n" not in said and "127.0.0.1" in said and "ledger" in said, said
    shown = "".join(traceback.format_exception(failed.value))  # what the task log prints
    assert "psycopg.errors" not in shown and "OperationalError" not in shown, shown
    assert not raw_driver_text(caplog)
    caplog.clear()
    result = run_batch(cfg, run=rid("t", try_number=2), ledger=pg_ledger, broker=client, runner=runner)
    assert sum(p.records or 0 for p in result.partitions) == 40
    assert not raw_driver_text(caplog)


def test_the_ledgers_own_sql_with_the_database_gone_is_one_line(
    private_pg: PrivatePostgres, pg_ledger: Ledger,
) -> None:
    """The audit's per-source summary (what the table check of the backfill DAG's audit task reads)
    with the database down: a one-line LedgerError naming the ledger, not the driver's error (a
    topology run's audit task failed with a raw psycopg AdminShutdown there)."""
    from streamledger.ledger import LedgerError
    from streamledger.ledger.coverage import sources

    assert sources(pg_ledger, PIPE) == []
    private_pg.stop()
    try:
        with pytest.raises(LedgerError) as failed:
            sources(pg_ledger, PIPE)
    finally:
        private_pg.start()
    said = str(failed.value)
    assert "\n" not in said and "127.0.0.1" in said, said
    shown = "".join(traceback.format_exception(failed.value))
    assert "psycopg.errors" not in shown and "OperationalError" not in shown, shown
    assert sources(pg_ledger, PIPE) == []  # the database back: the next call is clean
