"""The batch run's rules (plan, claim, verify, commit, store offset, crash recovery) on a real SQLite
ledger, with small in-process stand-ins for the batch's two injected interfaces: the broker view
(``streamledger.batch.Broker``) and the job runner. The real broker and Spark are exercised by the
end-to-end tests; here the point is each planning and verification rule, quickly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import (
    STEPS,
    BatchConfig,
    BatchError,
    InjectedCrash,
    RunId,
    backlog,
    broker_identity,
    output_dir,
    run_batch,
)
from streamledger.ledger import Ledger
from streamledger.paths import broker_component
from tests.support.ledgers import sqlite_ledger_url

URL = "rabbitmq-stream://guest:secret@127.0.0.1:5552/"


@dataclass
class Chunk:
    first: int
    offsets: list[int]
    timestamp_ms: int


@dataclass
class BrokerView:
    """Streams as lists of chunks (offsets may have gaps, like tracking chunks make them)."""

    chunks: dict[str, list[Chunk]]
    super_streams: dict[str, list[str]] = field(default_factory=dict)
    stored: dict[tuple[str, str], int] = field(default_factory=dict)

    def partitions(self, super_stream: str) -> list[str]:
        return self.super_streams[super_stream]

    def first_offset(self, name: str) -> int:
        return self.chunks[name][0].first if self.chunks[name] else 0

    def committed_tail(self, name: str) -> int:
        last = self.chunks[name][-1] if self.chunks[name] else None
        return (last.offsets[-1] + 1) if last else 0

    def query_offset(self, stream: str, reference: str) -> int | None:
        return self.stored.get((stream, reference))

    def resolve_offset(self, name: str, spec: Any) -> int:
        assert spec.kind == "timestamp"
        for chunk in self.chunks[name]:
            if chunk.timestamp_ms >= spec.value:
                return chunk.first
        return self.committed_tail(name)

    def store_offset_verified(
        self, stream: str, reference: str, offset: int, *, timeout: float = 5.0
    ) -> None:
        self.stored[(stream, reference)] = offset

    def records(self, stream: str, start: int, end: int) -> list[int]:
        return [o for c in self.chunks[stream] for o in c.offsets if start <= o < end]


@dataclass
class Runner:
    """Writes what the broker view holds for each range, plus a manifest, like the Spark job does:
    one call per batch, one subdirectory per stream."""

    broker: BrokerView
    calls: list[tuple[dict[str, tuple[int, int]], str]] = field(default_factory=list)
    tamper: dict[str, Any] = field(default_factory=dict)

    def __call__(self, *, url: str, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str,
                 splits: int) -> Mapping[str, Any]:
        self.calls.append((dict(ranges), output))
        streams = {}
        for i, (stream, (start, end)) in enumerate(sorted(ranges.items())):
            offsets = self.broker.records(stream, start, end)
            path = Path(output) / f"part={i}"
            path.mkdir(parents=True, exist_ok=True)
            (path / "part.json").write_text(json.dumps(offsets))
            entry = {"start": start, "end": end, "records": len(offsets),
                     "first_offset": offsets[0] if offsets else None,
                     "last_offset": offsets[-1] if offsets else None, "path": str(path)}
            entry.update(self.tamper)
            streams[stream] = entry
        return {"streams": streams, "output": output, "format": fmt}


def ts(second: int) -> int:
    return int(datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC).timestamp() * 1000)


def at(second: int) -> datetime:
    return datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)


@pytest.fixture
def ledger(tmp_path: Path, sqlite_ledger_template: Path) -> Ledger:
    return Ledger(sqlite_ledger_url(sqlite_ledger_template, tmp_path / "ledger.db"))


@pytest.fixture
def broker() -> BrokerView:
    # s-0: chunks at t=1s (0..9), t=5s (10..19), a tracking chunk at 20, t=9s (21..30)
    return BrokerView(
        chunks={
            "ev-0": [Chunk(0, list(range(0, 10)), ts(1)), Chunk(10, list(range(10, 20)), ts(5)),
                     Chunk(21, list(range(21, 31)), ts(9))],
            "ev-1": [Chunk(0, list(range(0, 4)), ts(2)), Chunk(4, list(range(4, 6)), ts(6))],
        },
        super_streams={"ev": ["ev-0", "ev-1"]},
    )


def config(tmp_path: Path, **kw: Any) -> BatchConfig:
    base: dict[str, Any] = {"pipeline": "pipe", "url": URL, "output_root": str(tmp_path / "out"),
                            "super_stream": "ev"}
    base.update(kw)
    return BatchConfig(**base)


def run(n: str = "r1", try_number: int = 1) -> RunId:
    return RunId("dag", n, "read", -1, try_number)


BROKER = broker_identity(URL)  # the stand-in broker reports no cluster name: the URL's host:port


def published(root: Path, stream: str, start: int, end: int) -> list[int]:
    data: list[int] = json.loads(
        (Path(output_dir(str(root / "out"), "pipe", BROKER, stream, start, end)) / "part.json").read_text())
    return data


def no_staging_left(root: Path) -> bool:
    return not any(p.is_file() for p in (root / "out" / "_staging" / "pipe").rglob("*"))


def test_first_batch_reads_to_the_tail_commits_and_stores(tmp_path: Path, ledger: Ledger,
                                                          broker: BrokerView) -> None:
    runner = Runner(broker)
    result = run_batch(config(tmp_path), run=run(), ledger=ledger, broker=broker, runner=runner)
    assert result.ranges() == {"ev-0": [0, 31], "ev-1": [0, 6]}
    assert result.records == 30 + 6
    assert len(runner.calls) == 1  # one job for every partition of the batch
    (r0, r1) = sorted(ledger.ranges("pipe"), key=lambda r: r.source.stream)
    assert (r0.status.value, r0.records, r0.first_seen, r0.last_seen) == ("committed", 30, 0, 30)
    assert r0.offset_stored and r0.offset_verified
    assert r0.output == output_dir(str(tmp_path / "out"), "pipe", BROKER, "ev-0", 0, 31)
    assert published(tmp_path, "ev-0", 0, 31) == broker.records("ev-0", 0, 31)
    assert r0.source.broker == broker_identity(URL) and "secret" not in r0.source.broker
    assert broker.stored == {("ev-0", "pipe"): 30, ("ev-1", "pipe"): 5}
    assert r1.end == 6
    assert no_staging_left(tmp_path)


def test_next_batch_starts_at_the_ledger_end_and_empty_is_a_no_op(tmp_path: Path, ledger: Ledger,
                                                                   broker: BrokerView) -> None:
    runner = Runner(broker)
    run_batch(config(tmp_path), run=run("r1"), ledger=ledger, broker=broker, runner=runner)
    result = run_batch(config(tmp_path), run=run("r2"), ledger=ledger, broker=broker, runner=runner)
    assert result.empty and result.records == 0
    assert [p.status for p in result.partitions] == ["empty", "empty"]
    # an empty answer is not stored (migration 0014): the idle batch adds no range
    assert len(runner.calls) == 1 and len(ledger.ranges("pipe")) == 2
    broker.chunks["ev-1"].append(Chunk(6, [6, 7, 8], ts(20)))
    result = run_batch(config(tmp_path), run=run("r3"), ledger=ledger, broker=broker, runner=runner)
    assert result.ranges() == {"ev-0": [31, 31], "ev-1": [6, 9]}
    assert runner.calls[-1][0] == {"ev-1": (6, 9)}
    assert broker.stored[("ev-1", "pipe")] == 8


def test_start_from_the_broker_stored_offset_and_cap_by_max_offsets(tmp_path: Path, ledger: Ledger,
                                                                    broker: BrokerView) -> None:
    broker.stored[("ev-0", "pipe")] = 9
    result = run_batch(config(tmp_path, max_offsets=5), run=run(), ledger=ledger, broker=broker,
                       runner=Runner(broker))
    assert result.ranges() == {"ev-0": [10, 15], "ev-1": [0, 5]}


def test_initial_positions(tmp_path: Path, ledger: Ledger, broker: BrokerView) -> None:
    result = run_batch(config(tmp_path, initial_position="tail"), run=run(), ledger=ledger, broker=broker,
                       runner=Runner(broker))
    assert result.empty and result.ranges() == {"ev-0": [31, 31], "ev-1": [6, 6]}
    result = run_batch(config(tmp_path, initial_position=12, stream="ev-0", super_stream=None),
                       run=run("r2"), ledger=ledger, broker=broker, runner=Runner(broker))
    assert result.ranges() == {"ev-0": [31, 31]}  # the ledger has a history now: the tail, not 12
    other = config(tmp_path, initial_position=12, stream="ev-0", super_stream=None, pipeline="other")
    result = run_batch(other, run=run("r3"), ledger=ledger, broker=broker, runner=Runner(broker))
    assert result.ranges() == {"ev-0": [12, 31]}


def test_data_intervals_map_to_offsets_and_reruns_are_idempotent(tmp_path: Path, ledger: Ledger,
                                                                 broker: BrokerView) -> None:
    runner = Runner(broker)

    def interval(a: int, b: int, run_id: str) -> dict[str, list[int]]:
        cfg = config(tmp_path, interval_start=at(a), interval_end=at(b), initial_position="interval_start")
        return run_batch(cfg, run=run(run_id), ledger=ledger, broker=broker, runner=runner).ranges()

    assert interval(0, 4, "i1") == {"ev-0": [0, 10], "ev-1": [0, 4]}
    assert interval(4, 8, "i2") == {"ev-0": [10, 21], "ev-1": [4, 6]}
    # the same run again gets its own ranges back; a re-triggered run (new id) finds them done
    calls = len(runner.calls)
    assert interval(0, 4, "i1") == {"ev-0": [0, 10], "ev-1": [0, 4]}
    assert interval(0, 4, "i1-again") == {"ev-0": [21, 21], "ev-1": [6, 6]}
    assert len(runner.calls) == calls, "a done interval was read again"
    # the last record of [10, 21) is 19: offset 20 is a tracking chunk
    assert broker.stored == {("ev-0", "pipe"): 19, ("ev-1", "pipe"): 5}
    # the next interval goes on where the ledger ends (the chunk at 9 s was never read)
    assert interval(10, 12, "i3") == {"ev-0": [21, 31], "ev-1": [6, 6]}


def test_a_manifest_that_disagrees_fails_the_range_and_the_retry_gets_it_back(
    tmp_path: Path, ledger: Ledger, broker: BrokerView
) -> None:
    bad = Runner(broker, tamper={"end": 99})
    with pytest.raises(BatchError, match=r"stream 'ev-0' range \[0, 31\): the job read \[0, 99\)"):
        run_batch(config(tmp_path), run=run(), ledger=ledger, broker=broker, runner=bad)
    statuses = {r.source.stream: r.status.value for r in ledger.ranges("pipe")}
    assert statuses == {"ev-0": "failed", "ev-1": "failed"}
    assert broker.stored == {}
    result = run_batch(config(tmp_path), run=run(try_number=2), ledger=ledger, broker=broker,
                       runner=Runner(broker))
    assert result.ranges() == {"ev-0": [0, 31], "ev-1": [0, 6]}
    committed = [r for r in ledger.ranges("pipe") if r.status.value == "committed"]
    assert len(committed) == 2 and all(r.run.try_number == 2 for r in committed)


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ({"records": 40}, "impossible record count 40"),
        ({"first_offset": 31}, "lie outside the range"),
        ({"records": 0}, "no records but first/last offsets"),
    ],
)
def test_verification_rules(tmp_path: Path, ledger: Ledger, broker: BrokerView, tamper: dict[str, Any],
                            message: str) -> None:
    with pytest.raises(BatchError, match=message):
        run_batch(config(tmp_path, stream="ev-0", super_stream=None), run=run(), ledger=ledger,
                  broker=broker, runner=Runner(broker, tamper=tamper))


def crash_after(step: str, try_number: int = 1) -> Any:
    def hook(name: str, _batch: Any) -> None:
        if name == step and _batch.run.try_number == try_number:
            raise InjectedCrash(step)
    return hook


@pytest.mark.parametrize("step", STEPS)
def test_crash_after_each_step_then_retry_is_exactly_once(tmp_path: Path, ledger: Ledger,
                                                          broker: BrokerView, step: str) -> None:
    runner = Runner(broker)
    cfg = config(tmp_path, stream="ev-0", super_stream=None)
    with pytest.raises(InjectedCrash):
        run_batch(cfg, run=run(try_number=1), ledger=ledger, broker=broker, runner=runner,
                  on_step=crash_after(step))
    (after_crash,) = ledger.ranges("pipe")
    expected = {"claimed": "claimed", "read": "claimed"}.get(step, "committed")
    assert after_crash.status.value == expected
    assert (("ev-0", "pipe") in broker.stored) == (step == "stored")
    result = run_batch(cfg, run=run(try_number=2), ledger=ledger, broker=broker, runner=runner,
                       on_step=crash_after(step))
    (final,) = ledger.ranges("pipe")
    assert (final.start, final.end, final.status.value, final.records) == (0, 31, "committed", 30)
    assert final.offset_verified and broker.stored[("ev-0", "pipe")] == 30
    assert result.ranges() == {"ev-0": [0, 31]}
    # a committed range is never read again; its one directory holds each offset once
    assert len(runner.calls) == (2 if step == "read" else 1)
    assert published(tmp_path, "ev-0", 0, 31) == broker.records("ev-0", 0, 31)
    # the killed attempt's staging is gone, and nothing unpublished lies in the pipeline's tree
    assert no_staging_left(tmp_path)
    assert [p.relative_to(tmp_path / "out" / "pipe") for p in (tmp_path / "out" / "pipe").glob("*/*")] == [
        Path(broker_component(BROKER), "ev-0")]


def test_a_committed_range_whose_output_was_deleted_is_reread_only_if_unchanged(
    tmp_path: Path, ledger: Ledger, broker: BrokerView
) -> None:
    import shutil

    cfg = config(tmp_path, stream="ev-0", super_stream=None)
    run_batch(cfg, run=run(), ledger=ledger, broker=broker, runner=Runner(broker))
    shutil.rmtree(output_dir(str(tmp_path / "out"), "pipe", BROKER, "ev-0", 0, 31))
    with pytest.raises(BatchError, match=r"re-read found records/first/last \(29, 0, 30\) but the ledger"):
        run_batch(cfg, run=run(try_number=2), ledger=ledger, broker=broker,
                  runner=Runner(broker, tamper={"records": 29}))
    run_batch(cfg, run=run(try_number=3), ledger=ledger, broker=broker, runner=Runner(broker))
    assert published(tmp_path, "ev-0", 0, 31) == broker.records("ev-0", 0, 31)


def test_backlog_counts_offsets_from_the_pipeline_position(tmp_path: Path, ledger: Ledger,
                                                           broker: BrokerView) -> None:
    streams = ["ev-0", "ev-1"]
    assert backlog(ledger, broker, pipeline="pipe", url=URL, streams=streams, super_stream="ev") == {
        "ev-0": 31, "ev-1": 6}
    run_batch(config(tmp_path, max_offsets=10), run=run(), ledger=ledger, broker=broker,
              runner=Runner(broker))
    assert backlog(ledger, broker, pipeline="pipe", url=URL, streams=streams, super_stream="ev") == {
        "ev-0": 21, "ev-1": 0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"super_stream": None}, "exactly one of stream or super_stream"),
        ({"stream": "x"}, "exactly one of stream or super_stream"),
        ({"pipeline": "p" * 256}, "256 bytes"),
        ({"max_offsets": 0}, "max_offsets must be >= 1"),
        ({"initial_position": "interval_start"}, "needs an interval"),
        ({"initial_position": "oldest"}, "is not 'first'"),
        ({"interval_start": at(5), "interval_end": at(1)}, "ends before it starts"),
        ({"heartbeat_interval": 60, "claim_timeout": 30}, "heartbeat_interval"),
    ],
)
def test_config_validation(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(BatchError, match=message):
        config(tmp_path, **kwargs)


def test_a_claim_of_a_dead_holder_is_redone_by_the_next_run(tmp_path: Path, ledger: Ledger,
                                                            broker: BrokerView) -> None:
    cfg = config(tmp_path, stream="ev-0", super_stream=None, interval_start=at(0), interval_end=at(4),
                 initial_position="interval_start")
    with pytest.raises(InjectedCrash):
        run_batch(cfg, run=run("first"), ledger=ledger, broker=broker, runner=Runner(broker),
                  on_step=crash_after("read"))
    # Another run while the holder may live: it does not touch the claim, and stores nothing.
    alive = run_batch(cfg, run=run("second"), ledger=ledger, broker=broker, runner=Runner(broker),
                      holder_alive=lambda holder: holder.run_id == "first")
    assert alive.ranges() == {"ev-0": [10, 10]} and broker.stored == {}
    seen: list[Any] = []
    result = run_batch(cfg, run=run("third"), ledger=ledger, broker=broker, runner=Runner(broker),
                       holder_alive=lambda holder: seen.append(holder) or False)
    assert [h.run_id for h in seen] == ["first"]
    assert result.ranges() == {"ev-0": [0, 10]}
    assert broker.stored == {("ev-0", "pipe"): 9}
    live = [(r.start, r.end, r.status.value, r.run.run_id) for r in ledger.ranges("pipe")
            if r.status.value != "failed" and not r.empty]
    assert live == [(0, 10, "committed", "third")]


def test_retention_loss_fails_or_is_recorded(tmp_path: Path, ledger: Ledger, broker: BrokerView) -> None:
    cfg = config(tmp_path, stream="ev-0", super_stream=None, max_offsets=10)
    run_batch(cfg, run=run("a"), ledger=ledger, broker=broker, runner=Runner(broker))
    broker.chunks["ev-0"] = broker.chunks["ev-0"][2:]  # retention dropped [0, 21)
    with pytest.raises(BatchError, match=r"must read \[10, 20\) but retention removed everything below 21"):
        run_batch(cfg, run=run("b"), ledger=ledger, broker=broker, runner=Runner(broker))
    result = run_batch(config(tmp_path, stream="ev-0", super_stream=None, on_data_loss="record"),
                       run=run("c"), ledger=ledger, broker=broker, runner=Runner(broker))
    assert result.ranges() == {"ev-0": [21, 31]} and result.partitions[0].lost == (10, 21)
    spans = [(r.start, r.end, r.status.value) for r in ledger.ranges("pipe") if r.status.value != "failed"]
    assert spans == [(0, 10, "committed"), (10, 20, "lost"), (20, 21, "lost"), (21, 31, "committed")]


def test_operator_runs_on_the_spark_connect_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """``spark_connect_conn_id`` picks the warm Connect runner with the provider's sc:// URL."""
    from streamledger.operators.batch import StreamBatchOperator
    from streamledger.spark.runners import SparkConnectRunner

    monkeypatch.setenv(
        "AIRFLOW_CONN_SL_CONNECT",
        json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15002}),
    )
    op = StreamBatchOperator(task_id="t", pipeline="p", stream="s", spark_connect_conn_id="sl_connect")
    runner = op._runner()
    assert isinstance(runner, SparkConnectRunner)
    assert runner.url.startswith("sc://127.0.0.1:15002")
    assert op._runner() is runner  # one runner (one gRPC session) per server in a worker process
    with pytest.raises(ValueError, match="not both"):
        StreamBatchOperator(task_id="t", pipeline="p", stream="s", spark_conn_id="spark_default",
                            spark_connect_conn_id="sl_connect")
    with pytest.raises(BatchError, match="sc://host:port"):
        SparkConnectRunner("http://127.0.0.1:15002")


def test_broker_identity_names_the_log_server_not_the_address() -> None:
    assert broker_identity("rabbitmq-stream://u:secret@10.0.0.1:5552/", "rabbit@c1") == "rabbitmq://rabbit@c1/%2F"
    assert broker_identity("rabbitmq-stream://u:secret@lb.example:5552/v1", "rabbit@c1") == "rabbitmq://rabbit@c1/v1"
    assert broker_identity("mewbase://u:secret@127.0.0.1:7451") == "mewbase://127.0.0.1:7451"
