"""Shared pieces of the batch tests: a kill the batch cannot catch, a counting Spark runner,
a broker whose StoreOffset kills, and readers of what a downstream reader sees."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from streamledger.batch import BatchConfig, LocalSparkRunner, RunId
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.spark.helpers import publish


class Killed(BaseException):
    """SIGKILL, as far as the batch can tell: no except clause of it sees this."""


class CountingRunner:
    """The real local Spark runner, counting its calls; ``die`` makes the next call fail first."""

    def __init__(self, spark: Any) -> None:
        self.inner = LocalSparkRunner()
        self.inner._spark = spark
        self.calls = 0
        self.die: BaseException | None = None
        self.die_mid_write = False

    def transform_schema(self, *args: Any, **kwargs: Any) -> Any:
        """The inner runner's analysis of a transform (asked before the claim; not a job call)."""
        return self.inner.transform_schema(*args, **kwargs)

    def __call__(self, **kwargs: Any) -> Mapping[str, Any]:
        self.calls += 1
        if self.die_mid_write:
            # What a job that dies mid-write leaves behind in the location it was given.
            out = Path(kwargs["output"])
            out.mkdir(parents=True, exist_ok=True)
            for old in out.rglob("*"):
                if old.is_file():
                    old.unlink()
            (out / "part-00000-dying.parquet").write_bytes(b"PAR1 half a file")
            raise RuntimeError("executor lost mid-write")
        if self.die is not None:
            exc, self.die = self.die, None
            raise exc
        return self.inner(**kwargs)


class KillAtStore:
    """A StreamClient whose next StoreOffset is where the process dies (after the commit)."""

    def __init__(self, client: StreamClient) -> None:
        self._client = client
        self.kill = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def store_offset_verified(self, *args: Any, **kwargs: Any) -> None:
        if self.kill:
            self.kill = False
            raise Killed("killed between commit and StoreOffset")
        self._client.store_offset_verified(*args, **kwargs)

    def store_offsets_verified(self, *args: Any, **kwargs: Any) -> None:
        """The batch stores the offsets of several partitions at once: the kill happens there too."""
        if self.kill:
            self.kill = False
            raise Killed("killed between commit and StoreOffset")
        self._client.store_offsets_verified(*args, **kwargs)


def config(url: str, root: Path | str, stream: str, **kw: Any) -> BatchConfig:
    return BatchConfig(pipeline=kw.pop("pipeline", "p-exactly-once"), url=url, output_root=str(root),
                       stream=stream, **kw)


def rid(task: str, run: str = "r1", try_number: int = 1, map_index: int = -1) -> RunId:
    return RunId("dag", run, task, map_index=map_index, try_number=try_number)


def committed_bodies(ledger: Ledger, pipeline: str) -> list[bytes]:
    """Every body in every committed range's published output (what a downstream reader sees)."""
    bodies: list[bytes] = []
    for r in ledger.ranges(pipeline):
        if r.status == RangeStatus.COMMITTED and r.records:
            assert r.output is not None
            manifest = json.loads((Path(r.output) / "_manifest.json").read_text())
            assert manifest["streams"][r.source.stream]["records"] == r.records
            table = pq.read_table(r.output, columns=["offset", "body"])
            assert table.num_rows == r.records, r
            bodies.extend(table.column("body").to_pylist())
    return bodies


def pinned_interval(pipeline: str, url: str, root: Path, stream: str, start: datetime, end: datetime,
                    **kw: Any) -> BatchConfig:
    """A batch pinned to the interval ``[start, end)`` (the history begins at its start)."""
    return BatchConfig(pipeline=pipeline, url=url, output_root=str(root), stream=stream, interval_start=start,
                       interval_end=end, bound_by_interval=True, interval_grace=5.0,
                       initial_position="interval_start", **kw)


def split_pinned_span(pipeline: str, url: str, root: Path, stream: str, ledger: Ledger, broker: StreamClient,
                      runner: CountingRunner, i1: RunId | None = None) -> tuple[datetime, datetime]:
    """Interval i1 ``[t0, t1)`` holds offsets [0, 150) of a new ``stream``; run ``i1`` (default
    ``("dag", "i1", "read")``) claims it and fails; a run of a narrower interval inside it commits
    [50, 100). Returns (t0, t1): i1's retry must read two pieces of the one stream in one batch,
    [0, 50) and [100, 150)."""
    from streamledger.batch import run_batch

    marks = [datetime.now(UTC)]
    for wave in range(3):
        time.sleep(0.3 if wave == 0 else 0.6)
        publish(url, stream, 50, start=50 * wave, batch_size=10)
        time.sleep(0.6)
        marks.append(datetime.now(UTC))
    time.sleep(0.6)
    publish(url, stream, 5, start=150, batch_size=5)  # makes i1's end resolvable
    t0, ta, tb, t1 = marks
    runner.die = RuntimeError("executor lost")
    try:
        run_batch(pinned_interval(pipeline, url, root, stream, t0, t1), run=i1 or rid("read", run="i1"),
                  ledger=ledger, broker=broker, runner=runner)
    except RuntimeError as exc:
        assert "executor lost" in str(exc), exc
    else:
        raise AssertionError("i1's first attempt should have failed")
    run_batch(pinned_interval(pipeline, url, root, stream, ta, tb), run=rid("read", run="manual__inner"),
              ledger=ledger, broker=broker, runner=runner)
    return t0, t1
