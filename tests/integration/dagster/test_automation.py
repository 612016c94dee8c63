"""``BacklogAbove`` through Dagster's ``evaluate_automation_conditions``, on the real broker and ledger:
the asset is requested once the records waiting beyond the ledger's frontier reach the threshold,
not after a batch took them (the stored offset's tracking chunk is no backlog), and with
``max_lag_seconds`` once the oldest waiting record is that much older than the newest."""

from __future__ import annotations

import time

import pytest
from dagster import (
    AutomationCondition,
    DagsterInstance,
    Definitions,
    evaluate_automation_conditions,
    materialize,
)

from streamledger.dagster import build_stream_batch_asset
from streamledger.dagster.automation import BacklogAbove
from tests.integration.dagster.conftest import Setup

pytestmark = [pytest.mark.dagster, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(180)]
ENV = "SL_TEST_AUTOMATION_BROKER"


def test_backlog_above_requests_a_run_once_the_threshold_is_passed(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, setup.url)
    condition = BacklogAbove(pipeline=setup.pipeline, super_stream=setup.super_stream, min_backlog=10,
                             broker_url_env=ENV, ledger_url=setup.ledger_url)
    asset = build_stream_batch_asset(
        pipeline=setup.pipeline, super_stream=setup.super_stream, output_root=setup.output_root,
        automation_condition=condition & ~AutomationCondition.in_progress(),
    )
    defs = Definitions(assets=[asset], resources=setup.resources())
    instance = DagsterInstance.ephemeral()

    setup.publish(range(6))
    below = evaluate_automation_conditions(defs=defs, instance=instance)
    assert below.total_requested == 0
    setup.publish(range(6, 12))
    above = evaluate_automation_conditions(defs=defs, instance=instance, cursor=below.cursor)
    assert above.total_requested == 1

    # the batch takes the 12 records: nothing waits beyond the ledger's frontier now
    assert materialize([asset], resources=setup.resources(), instance=instance).success
    after = evaluate_automation_conditions(defs=defs, instance=instance, cursor=above.cursor)
    assert after.total_requested == 0, "the stored offset's tracking chunk is not backlog"
    assert sorted(setup.written_ids()) == list(range(12))

    # by time instead: two records 1.5 s apart are below 10 records but over one second behind
    setup.publish([12, 13])
    time.sleep(1.5)
    setup.publish([14, 15])
    by_lag = build_stream_batch_asset(
        pipeline=setup.pipeline, super_stream=setup.super_stream, output_root=setup.output_root,
        automation_condition=BacklogAbove(pipeline=setup.pipeline, super_stream=setup.super_stream,
                                          min_backlog=10, max_lag_seconds=1.0, broker_url_env=ENV,
                                          ledger_url=setup.ledger_url),
    )
    still = evaluate_automation_conditions(defs=defs, instance=instance, cursor=after.cursor)
    assert still.total_requested == 0, "4 records are below 10"
    lag_defs = Definitions(assets=[by_lag], resources=setup.resources())
    behind = evaluate_automation_conditions(defs=lag_defs, instance=DagsterInstance.ephemeral())
    assert behind.total_requested == 1
