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
    """Writes what the broker view holds for the range, plus a manifest, like the Spark job does."""

    broker: BrokerView
    calls: list[tuple[str, int, int, str]] = field(default_factory=list)
    tamper: dict[str, Any] = field(default_factory=dict)

    def __call__(self, *, url: str, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str,
                 splits: int) -> Mapping[str, Any]:
        ((stream, (start, end)),) = ranges.items()
        offsets = self.broker.records(stream, start, end)
        Path(output).mkdir(parents=True, exist_ok=True)
        (Path(output) / "part.json").write_text(json.dumps(offsets))
        self.calls.append((stream, start, end, output))
        entry = {"start": start, "end": end, "records": len(offsets),
                 "first_offset": offsets[0] if offsets else None,
                 "last_offset": offsets[-1] if offsets else None}
        entry.update(self.tamper)
        return {"streams": {stream: entry}, "output": output, "format": fmt}


def ts(second: int) -> int:
    return int(datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC).timestamp() * 1000)


def at(second: int) -> datetime:
    return datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=True)


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


def test_first_batch_reads_to_the_tail_commits_and_stores(tmp_path: Path, ledger: Ledger,
                                                          broker: BrokerView) -> None:
    runner = Runner(broker)
    result = run_batch(config(tmp_path), run=run(), ledger=ledger, broker=broker, runner=runner)
    assert result.ranges() == {"ev-0": [0, 31], "ev-1": [0, 6]}
    assert result.records == 30 + 6
    (r0, r1) = sorted(ledger.ranges("pipe"), key=lambda r: r.source.stream)
    assert (r0.status.value, r0.records, r0.first_seen, r0.last_seen) == ("committed", 30, 0, 30)
    assert r0.offset_stored and r0.offset_verified
    assert r0.output == output_dir(str(tmp_path / "out"), "pipe", "ev-0", 0, 31)
    assert r0.source.broker == broker_identity(URL) and "secret" not in r0.source.broker
    assert broker.stored == {("ev-0", "pipe"): 30, ("ev-1", "pipe"): 5}
    assert r1.end == 6


def test_next_batch_starts_at_the_ledger_end_and_empty_is_a_no_op(tmp_path: Path, ledger: Ledger,
                                                                   broker: BrokerView) -> None:
    runner = Runner(broker)
    run_batch(config(tmp_path), run=run("r1"), ledger=ledger, broker=broker, runner=runner)
    result = run_batch(config(tmp_path), run=run("r2"), ledger=ledger, broker=broker, runner=runner)
    assert result.empty and result.records == 0
    assert [p.status for p in result.partitions] == ["empty", "empty"]
    assert len(runner.calls) == 2 and len(ledger.ranges("pipe")) == 2
    broker.chunks["ev-1"].append(Chunk(6, [6, 7, 8], ts(20)))
    result = run_batch(config(tmp_path), run=run("r3"), ledger=ledger, broker=broker, runner=runner)
    assert result.ranges() == {"ev-0": [31, 31], "ev-1": [6, 9]}
    assert broker.stored[("ev-1", "pipe")] == 8


def test_start_from_the_broker_stored_offset_and_cap_by_max_records(tmp_path: Path, ledger: Ledger,
                                                                    broker: BrokerView) -> None:
    broker.stored[("ev-0", "pipe")] = 9
    result = run_batch(config(tmp_path, max_records=5), run=run(), ledger=ledger, broker=broker,
                       runner=Runner(broker))
    assert result.ranges() == {"ev-0": [10, 15], "ev-1": [0, 5]}
    assert [p.start_from for p in result.partitions] == ["broker", "first"]


def test_initial_positions(tmp_path: Path, ledger: Ledger, broker: BrokerView) -> None:
    result = run_batch(config(tmp_path, initial_position="tail"), run=run(), ledger=ledger, broker=broker,
                       runner=Runner(broker))
    assert result.empty and result.ranges() == {"ev-0": [31, 31], "ev-1": [6, 6]}
    result = run_batch(config(tmp_path, initial_position=12, stream="ev-0", super_stream=None),
                       run=run("r2"), ledger=ledger, broker=broker, runner=Runner(broker))
    assert result.ranges() == {"ev-0": [12, 31]}


def test_data_intervals_map_to_offsets_and_reruns_find_their_range(tmp_path: Path, ledger: Ledger,
                                                                   broker: BrokerView) -> None:
    runner = Runner(broker)

    def interval(a: int, b: int, run_id: str) -> dict[str, list[int]]:
        cfg = config(tmp_path, interval_start=at(a), interval_end=at(b), initial_position="interval_start")
        return run_batch(cfg, run=run(run_id), ledger=ledger, broker=broker, runner=runner).ranges()

    assert interval(0, 4, "i1") == {"ev-0": [0, 10], "ev-1": [0, 4]}
    assert interval(4, 8, "i2") == {"ev-0": [10, 21], "ev-1": [4, 6]}
    # a re-triggered run of the first interval (new run id): the same ranges, read again
    calls = len(runner.calls)
    assert interval(0, 4, "i1-again") == {"ev-0": [0, 10], "ev-1": [0, 4]}
    assert len(runner.calls) == calls + 2
    assert len(ledger.ranges("pipe")) == 4
    # and it leaves the broker offset at the newest range's end
    assert broker.stored == {("ev-0", "pipe"): 20, ("ev-1", "pipe"): 5}
    # an interval with no chunks is empty
    assert interval(10, 12, "i3") == {"ev-0": [31, 31], "ev-1": [6, 6]}


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


@pytest.mark.parametrize("step", ["after_claim", "after_write", "after_commit", "after_store"])
def test_crash_at_each_step_then_retry_is_exactly_once(tmp_path: Path, ledger: Ledger, broker: BrokerView,
                                                       monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    monkeypatch.setenv("STREAMLEDGER_CRASH_AT", step)
    monkeypatch.setenv("STREAMLEDGER_CRASH_MODE", "raise")
    runner = Runner(broker)
    cfg = config(tmp_path, stream="ev-0", super_stream=None)
    with pytest.raises(InjectedCrash):
        run_batch(cfg, run=run(try_number=1), ledger=ledger, broker=broker, runner=runner)
    (after_crash,) = ledger.ranges("pipe")
    expected = {"after_claim": "claimed", "after_write": "claimed"}.get(step, "committed")
    assert after_crash.status.value == expected
    assert (("ev-0", "pipe") in broker.stored) == (step == "after_store")
    result = run_batch(cfg, run=run(try_number=2), ledger=ledger, broker=broker, runner=runner)
    (final,) = ledger.ranges("pipe")
    assert (final.start, final.end, final.status.value, final.records) == (0, 31, "committed", 30)
    assert final.offset_verified and broker.stored[("ev-0", "pipe")] == 30
    assert result.ranges() == {"ev-0": [0, 31]}
    # every attempt wrote the same directory; it holds each offset once
    outputs = {c[3] for c in runner.calls}
    assert len(outputs) == 1
    assert json.loads((Path(outputs.pop()) / "part.json").read_text()) == broker.records("ev-0", 0, 31)


def test_a_reread_that_finds_other_data_fails(tmp_path: Path, ledger: Ledger, broker: BrokerView) -> None:
    cfg = config(tmp_path, stream="ev-0", super_stream=None)
    run_batch(cfg, run=run(), ledger=ledger, broker=broker, runner=Runner(broker))
    with pytest.raises(BatchError, match="re-read found 29 records but the ledger committed 30"):
        run_batch(cfg, run=run(try_number=2), ledger=ledger, broker=broker,
                  runner=Runner(broker, tamper={"records": 29}))


def test_backlog_counts_offsets_from_the_pipeline_position(tmp_path: Path, ledger: Ledger,
                                                           broker: BrokerView) -> None:
    streams = ["ev-0", "ev-1"]
    assert backlog(ledger, broker, pipeline="pipe", url=URL, streams=streams, super_stream="ev") == {
        "ev-0": 31, "ev-1": 6}
    run_batch(config(tmp_path, max_records=10), run=run(), ledger=ledger, broker=broker,
              runner=Runner(broker))
    assert backlog(ledger, broker, pipeline="pipe", url=URL, streams=streams, super_stream="ev") == {
        "ev-0": 21, "ev-1": 0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"super_stream": None}, "exactly one of stream or super_stream"),
        ({"stream": "x"}, "exactly one of stream or super_stream"),
        ({"pipeline": "p" * 257}, "1..256 characters"),
        ({"max_records": 0}, "max_records must be >= 1"),
        ({"initial_position": "interval_start"}, "needs an interval"),
        ({"initial_position": "oldest"}, "is not 'first'"),
        ({"interval_start": at(5), "interval_end": at(1)}, "ends before it starts"),
    ],
)
def test_config_validation(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(BatchError, match=message):
        config(tmp_path, **kwargs)


def test_a_new_run_of_the_same_interval_takes_over_a_dead_claim_only(
    tmp_path: Path, ledger: Ledger, broker: BrokerView, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path, stream="ev-0", super_stream=None, interval_start=at(0), interval_end=at(4),
                 initial_position="interval_start")
    monkeypatch.setenv("STREAMLEDGER_CRASH_AT", "after_write")
    monkeypatch.setenv("STREAMLEDGER_CRASH_MODE", "raise")
    with pytest.raises(InjectedCrash):
        run_batch(cfg, run=run("first"), ledger=ledger, broker=broker, runner=Runner(broker))
    monkeypatch.delenv("STREAMLEDGER_CRASH_AT")
    with pytest.raises(BatchError, match=r"claimed by dag/first/read try 1 which may still be running"):
        run_batch(cfg, run=run("second"), ledger=ledger, broker=broker, runner=Runner(broker))
    with pytest.raises(BatchError, match="may still be running"):
        run_batch(cfg, run=run("second"), ledger=ledger, broker=broker, runner=Runner(broker),
                  holder_alive=lambda holder: holder.run_id == "first")
    seen = []
    result = run_batch(cfg, run=run("second"), ledger=ledger, broker=broker, runner=Runner(broker),
                       holder_alive=lambda holder: seen.append(holder) or False)
    assert [h.run_id for h in seen] == ["first"]
    assert result.ranges() == {"ev-0": [0, 10]}
    live = [r for r in ledger.ranges("pipe") if r.status.value != "failed"]
    assert [(r.start, r.end, r.status.value, r.run.run_id) for r in live] == [(0, 10, "committed", "second")]


def test_retention_loss_fails_or_is_recorded(tmp_path: Path, ledger: Ledger, broker: BrokerView) -> None:
    cfg = config(tmp_path, stream="ev-0", super_stream=None, max_records=10)
    run_batch(cfg, run=run("a"), ledger=ledger, broker=broker, runner=Runner(broker))
    broker.chunks["ev-0"] = broker.chunks["ev-0"][2:]  # retention dropped [0, 21)
    with pytest.raises(BatchError, match=r"must resume at offset 10 .* removed everything below 21"):
        run_batch(cfg, run=run("b"), ledger=ledger, broker=broker, runner=Runner(broker))
    result = run_batch(config(tmp_path, stream="ev-0", super_stream=None, on_data_loss="record"),
                       run=run("c"), ledger=ledger, broker=broker, runner=Runner(broker))
    assert result.ranges() == {"ev-0": [21, 31]} and result.partitions[0].lost == (10, 21)
    spans = [(r.start, r.end, r.status.value) for r in ledger.ranges("pipe")]
    assert spans == [(0, 10, "committed"), (10, 21, "lost"), (21, 31, "committed")]
