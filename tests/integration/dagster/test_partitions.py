"""Time-window partitions mapped to offsets through chunk timestamps: one-minute windows (the finest
cron step), two waves of events published in two consecutive minutes of broker time. Each window
reads exactly its wave; a window asked for before an earlier one with data is refused; a repeated
window run again finds nothing new.

Each test has a super stream of its own whose waves :class:`~tests.integration.dagster.conftest.MinuteWaves`
published in the background from the first Dagster test on (wave A: ids 0-39, wave B: ids 40-69 in
the next minute), so the minutes have usually passed when the tests run."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, TimeWindowPartitionsDefinition, materialize

from streamledger.dagster import build_partition_audit_check, build_stream_batch_asset
from tests.integration.dagster.conftest import MinuteWaves, Setup, materializations

pytestmark = [pytest.mark.dagster, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(240)]
FMT = "%Y-%m-%d-%H:%M"


@pytest.fixture
def ordered(minute_waves: MinuteWaves, tmp_path: Path, spark: Any) -> Setup:
    return minute_waves.setup("ordered", tmp_path)


@pytest.fixture
def pinned(minute_waves: MinuteWaves, tmp_path: Path, spark: Any) -> Setup:
    return minute_waves.setup("pinned", tmp_path)


def test_windows_read_their_own_events_in_order(ordered: Setup, minute_waves: MinuteWaves) -> None:
    setup = ordered
    wave_a, wave_b = minute_waves.both()  # wave A in wave_a's minute, wave B in the next
    assert wave_b == wave_a + timedelta(minutes=1)

    partitions = TimeWindowPartitionsDefinition(
        cron_schedule="* * * * *", start=wave_a - timedelta(minutes=1), fmt=FMT, end_offset=1
    )
    asset = build_stream_batch_asset(
        pipeline=setup.pipeline, super_stream=setup.super_stream, output_root=setup.output_root,
        partitions_def=partitions,
    )
    check = build_partition_audit_check(asset, pipeline=setup.pipeline)
    instance = DagsterInstance.ephemeral()

    def run(window: datetime, ok: bool = True) -> object:
        result = materialize(
            [asset, check], resources=setup.resources(), instance=instance,
            partition_key=window.strftime(FMT),
            raise_on_error=False,
        )
        assert result.success is ok
        return result

    # wave B's window first: refused, wave A's window holds unprocessed offsets
    refused = run(wave_b, ok=False)
    [failure] = refused.get_step_failure_events()  # type: ignore[attr-defined]
    message = failure.step_failure_data.error.to_string()
    assert "StreamBatchOrderError" in message and "materialize the earlier partitions first" in message
    assert setup.ranges() == []

    # the window before wave A is empty; wave A's window reads exactly wave A
    [empty] = materializations(run(wave_a - timedelta(minutes=1)))
    assert empty.metadata["records"].value == 0
    result_a = run(wave_a)
    [mat_a] = materializations(result_a)
    assert mat_a.metadata["records"].value == 40
    # the partition's own check: its ranges only, committed, contiguous, rows counted in the output
    [audit_a] = result_a.get_asset_check_evaluations()  # type: ignore[attr-defined]
    assert audit_a.passed and audit_a.metadata["records"].value == 40
    assert audit_a.metadata["partition"].value == wave_a.strftime(FMT)
    assert sorted(setup.written_ids()) == list(range(40))

    [mat_b] = materializations(run(wave_b))
    assert mat_b.metadata["records"].value == 30
    ranges_a, ranges_b = mat_a.metadata["ranges"].value, mat_b.metadata["ranges"].value
    assert all(ranges_b[p][0] == ranges_a[p][1] for p in setup.partitions)  # consecutive, no overlap

    # wave A's window again (a new run): its range is done, so nothing new and nothing duplicated
    [again] = materializations(run(wave_a))
    assert again.metadata["records"].value == 0
    ids = setup.written_ids()
    assert sorted(ids) == list(range(70))
    done = {
        (r.source.stream, r.start, r.end)
        for r in setup.ranges()
        if str(r.status) == "committed" and not r.empty  # empty windows leave empty bookkeeping rows
    }
    expected = {(p, *ranges_a[p]) for p in setup.partitions} | {(p, *ranges_b[p]) for p in setup.partitions}
    assert done == expected


def test_pinned_windows_read_their_own_events_in_any_order(pinned: Setup, minute_waves: MinuteWaves) -> None:
    """Issue 41: ``bound_by_interval=True`` on the asset factory (the operator's pinned intervals):
    each window's range is pinned to its own events, so a later window may run first (no order
    check), and running a window again gives the same range without reading it again."""
    setup = pinned
    wave_a, wave_b = minute_waves.both()
    assert wave_b == wave_a + timedelta(minutes=1)
    # past wave B's end and its grace (2 s): an idle partition's end is its committed tail
    minute_waves.sleep_until(wave_b + timedelta(minutes=1, seconds=3.5))

    partitions = TimeWindowPartitionsDefinition(
        cron_schedule="* * * * *", start=wave_a - timedelta(minutes=1), fmt=FMT, end_offset=1
    )
    asset = build_stream_batch_asset(
        pipeline=setup.pipeline, super_stream=setup.super_stream, output_root=setup.output_root,
        partitions_def=partitions, bound_by_interval=True, interval_grace=2.0,
    )
    instance = DagsterInstance.ephemeral()

    def run(window: datetime) -> object:
        result = materialize([asset], resources=setup.resources(), instance=instance,
                             partition_key=window.strftime(FMT), raise_on_error=False)
        assert result.success, [e.step_failure_data.error.to_string()  # type: ignore[attr-defined]
                                for e in result.get_step_failure_events()]  # type: ignore[attr-defined]
        return result

    [mat_b] = materializations(run(wave_b))  # the later window first
    assert mat_b.metadata["records"].value == 30
    [mat_a] = materializations(run(wave_a))
    assert mat_a.metadata["records"].value == 40
    ranges_a, ranges_b = mat_a.metadata["ranges"].value, mat_b.metadata["ranges"].value
    assert all(ranges_b[p][0] == ranges_a[p][-1] for p in setup.partitions if p in ranges_a and p in ranges_b)
    [again] = materializations(run(wave_b))  # a new run of a done window: the same range, read once
    assert again.metadata["ranges"].value == ranges_b
    assert sorted(setup.written_ids()) == list(range(70))  # nothing written twice
