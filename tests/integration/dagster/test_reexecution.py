"""A run killed after claiming (its Spark step wrote staging output, nothing was committed) and then
re-executed from failure: the re-execution has a new run id but the same root run id, gets the same
ranges from the ledger, publishes them once, and every event is written exactly once."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, DagsterRunStatus, ReexecutionOptions, execute_job

from tests.integration.dagster import jobs
from tests.integration.dagster.conftest import Setup

pytestmark = [pytest.mark.dagster, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(180)]


def test_killed_run_reexecuted_from_failure_writes_each_event_once(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup.publish(range(50))
    instance = DagsterInstance.ephemeral()
    job = jobs.reconstructable_batch_job(setup.env())

    # 1. the "kill": the step dies after the Spark job wrote its output, with no clean-up at all
    monkeypatch.setenv(jobs.KILL_ENV, "1")
    # InjectedCrash is a BaseException: the batch's own clean-up (marking ranges failed) never runs.
    # Dagster still records the step as failed; after a real kill run monitoring does the same.
    with execute_job(job, instance=instance, raise_on_error=False) as crashed:
        assert not crashed.success
        [failure] = crashed.get_step_failure_events()
        assert failure.step_key == "stream_batch"
    [killed] = instance.get_runs()
    monkeypatch.delenv(jobs.KILL_ENV)
    claimed = setup.ranges()
    assert {(r.source.stream, r.start, r.end, str(r.status)) for r in claimed} == {
        (p, 0, 25, "claimed") for p in setup.partitions
    }
    assert {r.run.run_id for r in claimed} == {killed.run_id}
    assert setup.written_ids() == []  # read into staging, never committed, so never published

    # 2. the run is failed (run monitoring would mark a killed process so); more data arrives meanwhile
    if not killed.is_finished:
        instance.report_run_failed(killed)
    assert instance.get_run_by_id(killed.run_id).status == DagsterRunStatus.FAILURE
    setup.publish(range(50, 80))

    # 3. re-execute from failure: new run id, same root run id, attempt 2
    with execute_job(
        job, instance=instance, reexecution_options=ReexecutionOptions.from_failure(killed.run_id, instance)
    ) as result:
        assert result.success
        child = result.dagster_run
    assert child.run_id != killed.run_id and child.root_run_id == killed.run_id

    ranges = setup.ranges()
    assert {(r.source.stream, r.start, r.end, str(r.status)) for r in ranges} == {
        (p, 0, 25, "committed") for p in setup.partitions
    }, "the re-execution must finish exactly the claimed ranges, not extend them"
    assert {(r.run.run_id, r.run.try_number) for r in ranges} == {(killed.run_id, 2)}
    assert sorted(setup.written_ids()) == list(range(50))

    # 4. a new run continues after the committed ranges with the events published since
    with execute_job(job, instance=instance) as result:
        assert result.success
    ids = setup.written_ids()
    assert sorted(ids) == list(range(80)) and len(ids) == len(set(ids))


def test_new_run_takes_over_a_killed_runs_claim_once_dagster_reports_it_finished(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup.publish(range(20))
    instance = DagsterInstance.ephemeral()
    job = jobs.reconstructable_batch_job(setup.env())
    monkeypatch.setenv(jobs.KILL_ENV, "1")
    with execute_job(job, instance=instance, raise_on_error=False) as crashed:
        assert not crashed.success
        killed = crashed.dagster_run
    monkeypatch.delenv(jobs.KILL_ENV)
    if not instance.get_run_by_id(killed.run_id).is_finished:
        instance.report_run_failed(killed)

    # a brand-new run (another root): the killed holder is finished, so its claims are released
    # and the ledger hands exactly those spans to the new run
    with execute_job(job, instance=instance) as result:
        assert result.success
        fresh = result.dagster_run.run_id
    by_status = {(r.source.stream, r.start, r.end, str(r.status), r.run.run_id) for r in setup.ranges()}
    assert by_status == {(p, 0, 10, "failed", killed.run_id) for p in setup.partitions} | {
        (p, 0, 10, "committed", fresh) for p in setup.partitions
    }
    assert sorted(setup.written_ids()) == list(range(20))
