"""The example backfill DAG under ``airflow dags test`` over a mewbase channel (issue 20, item 6).

The source is the mewbase emulator (TEST DOUBLE, tests/support/mewbase_emulator.py) listening on a
real TCP port of 127.0.0.1 in this test process; the DAG reaches it through a ``mewbase`` Airflow
connection given as a plain URI (``AIRFLOW_CONN_...=mewbase://host:port``). Events are seeded with
persist times inside two past data intervals (and a third, later one), so no test waits for a clock:
each interval's run reads exactly its events, the second only new ones, and the DAG's own audit
task (against the channel's stored positions) is clean.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import bson
import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import warm_spark_env
from tests.support.airflow import AirflowHome
from tests.support.mewbase_emulator import MewbaseServerEmulator

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

BACKFILL = "streamledger_backfill"
START = datetime(2026, 1, 1, tzinfo=UTC)
INTERVAL = timedelta(minutes=1)
PER_INTERVAL = 12


@pytest.fixture
def emulator() -> Iterator[MewbaseServerEmulator]:
    with MewbaseServerEmulator() as server:
        yield server


def _ids(root: Path) -> Counter[int]:
    return Counter(
        bson.decode(body)["id"]
        for part in sorted(root.glob("**/*.parquet"))
        for body in pq.read_table(part, columns=["body"]).column("body").to_pylist()
    )


@pytest.mark.timeout(900)
def test_backfill_dag_reads_a_mewbase_channel_exactly_once(
    airflow_home: AirflowHome, emulator: MewbaseServerEmulator, tmp_path: Path, spark_connect: str
) -> None:
    from streamledger.batch.proof import audit
    from streamledger.ledger import Ledger
    from streamledger.sources import connect_log

    # interval k = [START + k min, START + (k+1) min); its events are stamped inside it, 3 s apart
    by_interval: dict[int, list[int]] = {}
    for k in range(3):
        for i in range(PER_INTERVAL):
            stamp = START + k * INTERVAL + timedelta(seconds=1 + 3 * i)
            event = k * PER_INTERVAL + i
            emulator.append("orders", {"id": event, "interval": k}, timestamp=int(stamp.timestamp() * 1000))
            by_interval.setdefault(k, []).append(event)
    positions = emulator.positions("orders")
    pipeline = "mb-backfill"
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    out = tmp_path / "output"
    env = {
        "AIRFLOW_CONN_MEWBASE_E2E": emulator.url(),
        "STREAMLEDGER_SOURCE_CONN_ID": "mewbase_e2e",
        "STREAMLEDGER_STREAM": "orders",
        "STREAMLEDGER_PIPELINE": pipeline,
        "STREAMLEDGER_INTERVAL": "1m",
        "STREAMLEDGER_START_DATE": START.isoformat(),
        "STREAMLEDGER_LEDGER_URL": ledger_url,
        "STREAMLEDGER_OUTPUT_ROOT": str(out),
        **warm_spark_env(spark_connect),  # the mewbase source on the warm server
    }
    for k in (0, 1):  # `dags test <date>` processes [date - 1 min, date)
        airflow_home.dags_test(BACKFILL, (START + (k + 1) * INTERVAL).isoformat(), env=env)
        states = airflow_home.task_states(BACKFILL, (START + (k + 1) * INTERVAL).isoformat())
        assert {t: s["state"] for t, s in states.items()} == {"read_interval": "success", "audit": "success"}

    ledger = Ledger(ledger_url)
    ranges = sorted((r.start, r.end, r.records) for r in ledger.ranges(pipeline)
                    if str(r.status) == "committed" and not r.empty)
    first_of = {k: positions[k * PER_INTERVAL] for k in range(3)}
    assert ranges == [(first_of[0], first_of[1], PER_INTERVAL), (first_of[1], first_of[2], PER_INTERVAL)]
    assert _ids(out / pipeline) == Counter(by_interval[0] + by_interval[1])  # each event once, none of k=2
    with connect_log(emulator.url(), timeout=3.0) as log:
        assert log.query_offset("orders", pipeline) == positions[2 * PER_INTERVAL - 1]
        report = audit(ledger, pipeline, broker=log)
    assert report.clean, report.to_text()
