"""Contract check: ``MewbaseLog`` serves as the batch core's broker, unchanged (TEST DOUBLE server).

The product path (``LocalSparkRunner`` and the ``mewbase`` Spark format) is tested in
test_spark_batch.py. This test drives ``run_batch`` with a small Spark-free runner that reads through
``MewbaseLog.read_range`` and writes Parquet: the contract of the log calls alone (first offset, tail,
stored position, verified store, the no-record probe via ``read_range(..., decode="raw")``), and a
reminder that any callable honouring the runner contract works with a mewbase source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamledger.batch import BatchConfig, RunId, run_batch
from streamledger.ledger import Ledger
from streamledger.protocol.mewbase import MewbaseLog
from tests.support.mewbase_emulator import MewbaseServerEmulator


def mewbase_runner(*, url: str, ranges: dict[str, tuple[int, int]], output: str, **_: Any) -> dict[str, Any]:
    streams: dict[str, Any] = {}
    with MewbaseLog.connect(url, timeout=3) as log:
        for channel, (start, end) in ranges.items():
            target = Path(output) / channel
            target.mkdir(parents=True, exist_ok=True)
            pos: list[int] = []
            events: list[bytes] = []
            for batch in log.read_range(channel, start, end):
                pos += batch.positions
                events += batch.events
            table = pa.table({"pos": pa.array(pos, pa.int64()), "event": pa.array(events, pa.binary())})
            pq.write_table(table, target / "part-0.parquet")
            streams[channel] = {
                "start": start,
                "end": end,
                "records": len(pos),
                "path": str(target),
                "first_offset": pos[0] if pos else None,
                "last_offset": pos[-1] if pos else None,
            }
    return {"streams": streams, "output": output}


def test_two_batches_from_a_channel_into_the_ledger(
    emulator: MewbaseServerEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMLEDGER_HOME", str(tmp_path))
    for i in range(30):
        emulator.append("orders", {"n": i})
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.sqlite", create=True)
    cfg = BatchConfig(
        pipeline="billing",
        url=emulator.url(),
        output_root=str(tmp_path / "out"),
        stream="orders",
        initial_position="first",
        broker_name="mewbase-emulator",
    )
    with MewbaseLog.connect(emulator.url(), timeout=3) as log:
        first = run_batch(
            cfg, run=RunId("dag", "run-1", "task"), ledger=ledger, broker=log, runner=mewbase_runner
        )
        positions = emulator.positions("orders")
        assert first.records == 30
        assert first.to_dict()["ranges"] == {"orders": [0, positions[-1] + 1]}
        assert log.query_offset("orders", "billing") == positions[-1]  # the last processed position

        for i in range(5):
            emulator.append("orders", {"n": 100 + i})
        second = run_batch(
            cfg, run=RunId("dag", "run-2", "task"), ledger=ledger, broker=log, runner=mewbase_runner
        )
        positions = emulator.positions("orders")
        assert second.records == 5 and second.to_dict()["ranges"]["orders"][1] == positions[-1] + 1
        assert log.query_offset("orders", "billing") == positions[-1]

        # Nothing new: the next batch is empty and stores nothing.
        third = run_batch(
            cfg, run=RunId("dag", "run-3", "task"), ledger=ledger, broker=log, runner=mewbase_runner
        )
        assert third.records == 0

        report = ledger.audit("billing", broker=log)
        assert report.clean, report.to_text()
    written = pq.read_table(tmp_path / "out").column("pos").to_pylist()
    assert sorted(written) == positions
