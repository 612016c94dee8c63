"""The command line's retries of a run killed after its commit, through the
real batch (RabbitMQ 4.3, local Spark, both ledgers), numbered as ``streamledger batch run --run-id``
numbers them (``_try_number``): does the next attempt take over the publish lease the killed one left?"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchError, RunId, run_batch
from streamledger.cli.batch import DAG, TASK, _try_number
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, Killed, committed_bodies, config
from tests.integration.spark.helpers import create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPE = "p-exactly-once"


def _require(ok: bool, what: object) -> None:
    if not ok:
        raise RuntimeError(f"scenario broken: {what}")


def _attempt(ledger: Ledger, run_id: str) -> RunId:
    return RunId(DAG, run_id, TASK, try_number=_try_number(ledger, PIPE, run_id))


def _killed_twice(ledger: Ledger, client: StreamClient, runner: CountingRunner, cfg: Any) -> Any:
    """Try 1 killed after its commit; try 2 killed while publishing (its lease left behind)."""

    def die(step: str, _batch: Any) -> None:
        if step == "committed":
            raise Killed("killed after the commit, before publishing")

    first = _attempt(ledger, "x")
    _require(first.try_number == 1, first)
    with pytest.raises(Killed):
        run_batch(cfg, run=first, ledger=ledger, broker=client, runner=runner, on_step=die)
    (rng,) = [r for r in ledger.ranges(PIPE) if r.records]
    _require(rng.status == RangeStatus.COMMITTED and rng.published_at is None, rng)
    # try 2 takes over the lease the commit gave try 1 (superseded, as BatchRun._replace decides) to
    # publish, and is SIGKILLed while publishing: its lease stays until claim_timeout
    _require(RunId.from_attempt_token(rng.publisher or "") == first, rng.publisher)
    second = _attempt(ledger, "x")
    _require(second.try_number == 2, second)
    _require(ledger.claim(PIPE, rng.source, 100, second).id == rng.id, "try 2 got its range back")
    held = ledger.take_publish_many([(rng.id, rng.publisher)], second.attempt_token("killed02"),
                                    lease=timedelta(seconds=cfg.claim_timeout))
    _require(held[0] is not None, held)
    return rng


def test_an_attempt_numbered_past_the_killed_one_takes_over_its_lease_and_publishes_once(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Promise kept when the try is right (a scheduler that counts its own tries, as Airflow does):
    try 3 takes the lease over at once and the records are published once."""
    s = stream_name("s12-lease-ok")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 6)
    cfg = config(rabbitmq_url, tmp_path, s)
    rng = _killed_twice(any_ledger, client, runner, cfg)
    run_batch(cfg, run=RunId(DAG, "x", TASK, try_number=3), ledger=any_ledger, broker=client, runner=runner)
    assert any_ledger.get(rng.id).published_at is not None
    assert len(committed_bodies(any_ledger, PIPE)) == 6


def test_the_third_cli_attempt_of_a_committed_run_takes_over_the_lease_the_killed_second_left(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("s12-lease")
    create_stream(rabbitmq_url, s, 0)
    publish(rabbitmq_url, s, 6)
    cfg = config(rabbitmq_url, tmp_path, s)
    rng = _killed_twice(any_ledger, client, runner, cfg)
    third = _attempt(any_ledger, "x")  # what `streamledger batch run --run-id x` runs next
    try:
        run_batch(cfg, run=third, ledger=any_ledger, broker=client, runner=runner)
    except BatchError as exc:
        raise AssertionError(f"the CLI's next attempt (try {third.try_number}) was refused: {exc}") from None
    assert any_ledger.get(rng.id).published_at is not None
    assert len(committed_bodies(any_ledger, PIPE)) == 6
