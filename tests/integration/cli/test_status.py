"""``streamledger status`` on the real broker and a real SQLite ledger (issue 33): the lag counts only
offsets that hold user records (a StoreOffset's tracking chunk after the last batch is not lag), and
the table is one a person reads. The ledger's history is made with the ledger's own calls (a claim and
its commit, as a batch makes them) and the broker offset with the broker's own StoreOffset, so no Spark
job is needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch.plan import broker_identity
from streamledger.ledger import Ledger, RunIdentity, SourceRef
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.cli.helpers import cli
from tests.integration.spark.helpers import create_stream, publish

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(300)]


def _batch_done(url: str, ledger_url: str, stream: str, pipeline: str, end: int, run: RunIdentity) -> None:
    """What a batch over ``[0, end)`` leaves: a committed range and the broker offset stored at end - 1."""
    with StreamClient.connect(url) as client, Ledger(ledger_url, create=True) as ledger:
        source = SourceRef(broker=broker_identity(url, client.cluster_name), stream=stream)
        claimed = ledger.claim(pipeline, source, end, run, initial_start=0)
        assert (claimed.start, claimed.end) == (0, end)
        ledger.commit(claimed.id, records=end, first_seen=0, last_seen=end - 1, output="/out/" + stream)
        client.store_offset(stream, pipeline, end - 1)  # a tracking chunk: the tail moves to end + 1


def _status(env: dict[str, str]) -> dict[str, Any]:
    r = cli("status", "--json", env=env)
    assert r.rc == 0, r.err
    (row,) = json.loads(r.out)
    return dict(row)


def test_lag_counts_user_records_not_the_tracking_chunk(rabbitmq_url: str, stream_name: Any,
                                                        tmp_path: Path) -> None:
    s = stream_name("status-lag")
    create_stream(rabbitmq_url, s, 10)
    env = {"STREAMLEDGER_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
           "STREAMLEDGER_BROKER_URL": rabbitmq_url}
    _batch_done(rabbitmq_url, env["STREAMLEDGER_LEDGER_URL"], s, "lagging", 10,
                RunIdentity("streamledger-cli", "cli-0123456789ab", "batch"))
    row = _status(env)
    assert (row["done_to"], row["stored"], row["tail"]) == (10, 9, 11)  # the tracking chunk took offset 10
    assert row["lag"] == 0, row  # nothing a batch would read is waiting

    publish(rabbitmq_url, s, 5, start=10)
    row = _status(env)
    assert row["tail"] == 16 and row["lag"] == 6, row  # offsets from the watermark: an upper bound on records


def _lined_up(header: str, row: str, labels: list[str]) -> None:
    """Each value starts under its label (text) or ends under its label's end (numbers)."""
    at = 0
    for label in labels:
        start = header.index(label, at)
        end = at = start + len(label)
        left = row[start] != " " and (start == 0 or row[start - 1] == " ")
        right = row[end - 1] != " " and (end >= len(row) or row[end] == " ")
        assert left or right, f"{label!r} does not line up:\n{header}\n{row}"


def test_status_and_ranges_are_tables_that_line_up(rabbitmq_url: str, stream_name: Any,
                                                   tmp_path: Path) -> None:
    s = stream_name("status-table")
    create_stream(rabbitmq_url, s, 10000)
    env = {"STREAMLEDGER_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
           "STREAMLEDGER_BROKER_URL": rabbitmq_url}
    _batch_done(rabbitmq_url, env["STREAMLEDGER_LEDGER_URL"], s, "tables", 10000,
                RunIdentity("streamledger-cli", "cli-0123456789ab", "batch"))

    r = cli("ledger", "ranges", env=env)
    assert r.rc == 0, r.err
    header, row = r.out.splitlines()
    _lined_up(header, row, ["ID", "PIPELINE", "STREAM", "RANGE", "STATUS", "RECORDS", "WHEN", "PUBLISHED",
                            "OFFSET", "RUN", "OUTPUT"])
    assert row.split()[-1] == "/out/" + s

    r = cli("status", env=env)
    assert r.rc == 0, r.err
    header, row = r.out.splitlines()
    _lined_up(header, row, ["PIPELINE", "STREAM", "COMMITTED", "OPEN", "FAILED", "DONE TO", "LAST RECORD",
                            "STORED", "TAIL", "LAG", "LAST RUN", "WHEN", "OUTPUT"])


def test_the_last_run_reads_as_who_ran_it_and_json_keeps_the_id(rabbitmq_url: str, stream_name: Any,
                                                                 tmp_path: Path) -> None:
    s = stream_name("status-who")
    create_stream(rabbitmq_url, s, 10)
    env = {"STREAMLEDGER_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
           "STREAMLEDGER_BROKER_URL": rabbitmq_url}
    runs = {"by-cli": RunIdentity("streamledger-cli", "cli-0123456789ab", "batch"),
            "by-airflow": RunIdentity("orders_hourly", "scheduled__2026-11-27T09:00:00+00:00", "read", 3, 2),
            "by-dagster": RunIdentity("dagster", "5f0c2a9e-1d2b-4c8e-9f00-aa11bb22cc33",
                                      "orders/raw[2026-11-27]")}
    for pipeline, run in runs.items():
        _batch_done(rabbitmq_url, env["STREAMLEDGER_LEDGER_URL"], s, pipeline, 10, run)

    r = cli("status", env=env)
    assert r.rc == 0, r.err
    shown = {line.split()[0]: line for line in r.out.splitlines()[1:]}
    assert "CLI" in shown["by-cli"] and "cli-0123456789ab" not in shown["by-cli"]
    assert "streamledger-cli/" not in r.out
    assert "Airflow orders_hourly" in shown["by-airflow"] and "read[3]" in shown["by-airflow"]
    assert "scheduled__2026-11-27T09:00:00+00:00" in shown["by-airflow"] and "try 2" in shown["by-airflow"]
    assert "Dagster run 5f0c2a9e" in shown["by-dagster"] and "orders/raw[2026-11-27]" in shown["by-dagster"]
    r = cli("ledger", "ranges", "--pipeline", "by-cli", env=env)
    assert "CLI" in r.out and "cli-0123456789ab" not in r.out, r.out

    r = cli("status", "--json", env=env)
    ids = {row["pipeline"]: row["last_run"] for row in json.loads(r.out)}
    assert ids == {p: str(run) for p, run in runs.items()}  # the exact identity stays in --json
