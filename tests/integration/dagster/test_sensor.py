"""The backlog sensor through ``build_sensor_context``: its cursor is recomputed from the ledger's
committed ranges, so a failed run leaves it covering that run's offsets, and the tracking chunk a
stored offset appends never counts as backlog."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context, materialize

from streamledger.batch import JobRunner
from streamledger.dagster import StreamSparkResource, build_stream_backlog_sensor, build_stream_batch_asset
from tests.integration.dagster.conftest import Setup

pytestmark = [pytest.mark.dagster, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(180)]


class BrokenSparkResource(StreamSparkResource):
    """A Spark step that fails after the ranges were claimed (an executor lost mid-job)."""

    def get_runner(self) -> JobRunner:
        def runner(**kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
            raise RuntimeError("executor lost while reading")

        return runner


def tick(sensor: Any, setup: Setup, instance: DagsterInstance, cursor: str | None) -> SensorResult:
    context = build_sensor_context(instance=instance, cursor=cursor, resources=setup.resources())
    result = sensor(context)
    assert isinstance(result, SensorResult)
    return result


def test_cursor_never_passes_uncommitted_work(setup: Setup) -> None:
    asset = build_stream_batch_asset(
        pipeline=setup.pipeline, super_stream=setup.super_stream, output_root=setup.output_root
    )
    sensor = build_stream_backlog_sensor(asset, pipeline=setup.pipeline, super_stream=setup.super_stream)
    instance = DagsterInstance.ephemeral()

    empty = tick(sensor, setup, instance, None)
    assert not empty.run_requests and "0 records waiting" in str(empty.skip_reason)

    setup.publish(range(40))
    first = tick(sensor, setup, instance, empty.cursor)
    [request] = first.run_requests
    assert json.loads(first.cursor or "") == {"committed": {p: None for p in setup.partitions}, "failed": {}}
    again = tick(sensor, setup, instance, first.cursor)
    assert again.run_requests[0].run_key == request.run_key  # Dagster starts no duplicate for it

    # a run fails after claiming: the cursor stays where it was, still covering offsets [0, 20)
    failed = materialize(
        [asset], resources=setup.resources(spark=BrokenSparkResource()), instance=instance,
        raise_on_error=False,
    )
    assert not failed.success
    assert {(r.start, r.end, str(r.status)) for r in setup.ranges()} == {(0, 20, "failed")}
    after_failure = tick(sensor, setup, instance, first.cursor)
    cursor = json.loads(after_failure.cursor or "")
    assert cursor["committed"] == {p: None for p in setup.partitions}
    assert set(cursor["failed"]) == set(setup.partitions)
    [retry] = after_failure.run_requests  # a new key: the failed span is work to redo
    assert retry.run_key != request.run_key

    # the requested run redoes exactly the failed ranges; now the cursor moves to the committed end
    done = materialize([asset], resources=setup.resources(), instance=instance)
    assert done.success
    caught_up = tick(sensor, setup, instance, after_failure.cursor)
    assert json.loads(caught_up.cursor or "")["committed"] == {p: 20 for p in setup.partitions}
    assert not caught_up.run_requests, "the stored offset's tracking chunk is not backlog"
    assert "0 records waiting" in str(caught_up.skip_reason)
    assert sorted(setup.written_ids()) == list(range(40))

    setup.publish([40])
    [more] = tick(sensor, setup, instance, caught_up.cursor).run_requests
    assert more.run_key not in {request.run_key, retry.run_key}


def test_one_broker_connection_per_tick(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamledger.protocol.rabbitmq import StreamClient

    opened: list[str] = []
    real = StreamClient.connect.__func__  # type: ignore[attr-defined]

    def counting(cls: type[StreamClient], *args: Any, **kwargs: Any) -> StreamClient:
        opened.append("connect")
        return real(cls, *args, **kwargs)  # type: ignore[no-any-return]

    sensor = build_stream_backlog_sensor("stream_batch", pipeline=setup.pipeline,
                                         super_stream=setup.super_stream, min_backlog=40)
    setup.publish(range(40))  # the tick reads from every partition to count 40 records
    monkeypatch.setattr(StreamClient, "connect", classmethod(counting))
    result = tick(sensor, setup, DagsterInstance.ephemeral(), None)
    assert result.run_requests and len(opened) == 1


def test_a_caught_up_tick_counts_every_partitions_records_in_one_broker_call(
        setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a run stores its offsets each partition ends in a tracking chunk: the tick must look at
    all of them to say "0 records waiting", and it asks the broker once for all (one pipelined
    round of subscriptions, ``user_records_many``), not one read per partition."""
    from streamledger.protocol.rabbitmq import StreamClient

    asset = build_stream_batch_asset(pipeline=setup.pipeline, super_stream=setup.super_stream,
                                     output_root=setup.output_root)
    sensor = build_stream_backlog_sensor(asset, pipeline=setup.pipeline, super_stream=setup.super_stream)
    instance = DagsterInstance.ephemeral()
    setup.publish(range(len(setup.partitions) * 4))
    assert materialize([asset], resources=setup.resources(), instance=instance).success

    calls: list[str] = []
    for name in ("read_range", "user_records_many"):
        real = getattr(StreamClient, name)

        def counting(self: StreamClient, *args: Any, _real: Any = real, _name: str = name,
                     **kwargs: Any) -> Any:
            calls.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(StreamClient, name, counting)
    caught_up = tick(sensor, setup, instance, None)
    assert not caught_up.run_requests and "0 records waiting" in str(caught_up.skip_reason)
    assert calls == ["user_records_many"], calls
