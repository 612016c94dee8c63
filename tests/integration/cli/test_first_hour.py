"""A new user's first hour on the real command (issue 33), against the real broker, local Spark and a
SQLite ledger that does not exist yet: ``batch run`` creates it (from ``$STREAMLEDGER_LEDGER_URL``),
takes the Spark and position flags, and reports progress on stderr; ``ledger ranges`` is a readable
table; ``read`` shows its progress; ``--json`` works on the broker commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli.helpers import cli
from tests.integration.cli.test_spark_quiet import NOISE as SPARK_NOISE
from tests.integration.spark.helpers import create_stream

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(600)]


def test_a_first_batch_on_a_new_sqlite_ledger(rabbitmq_url: str, stream_name: Any, tmp_path: Path,
                                              spark: Any) -> None:
    s = stream_name("first-batch")
    create_stream(rabbitmq_url, s, 40)
    ledger = tmp_path / "state" / "ledger.sqlite"  # neither the file nor its directory exists
    env = {"STREAMLEDGER_LEDGER_URL": f"sqlite:///{ledger}", "STREAMLEDGER_BROKER_URL": rabbitmq_url,
           "STREAMLEDGER_PROGRESS_SECONDS": "0.2"}
    out = str(tmp_path / "out")
    r = cli("batch", "run", "--stream", s, "--pipeline", "first", "--output-root", out, "--json",
            "--master", "local[1]", "--conf", "spark.sql.shuffle.partitions=1", "--splits", "2",
            "--on-data-loss", "record", env=env)
    assert r.rc == 0, r.err
    assert [n for n in SPARK_NOISE if n in r.err] == [], r.err  # Spark's start-up noise stays off (issue 33)
    result = json.loads(r.out)  # stdout is the JSON alone
    assert result["records"] == 40 and [p["status"] for p in result["partitions"]] == ["committed"]
    assert ledger.is_file()
    progress = [line for line in r.err.splitlines() if line.startswith("streamledger: batch first:")]
    assert any("offsets planned" in line for line in progress), r.err
    assert any("records/s" in line for line in progress), r.err
    assert len([line for line in r.err.splitlines() if "published stream" in line]) == 1, r.err  # once

    # a second run starting at `next` for a new pipeline reads nothing old
    r = cli("batch", "run", "--stream", s, "--pipeline", "only-new", "--output-root", out, "--json",
            "--initial-position", "next", env=env)
    assert r.rc == 0, r.err
    assert json.loads(r.out)["records"] == 0

    r = cli("ledger", "ranges", "--pipeline", "first", env=env)
    assert r.rc == 0, r.err
    header, *rows = r.out.splitlines()
    assert header.split() == ["ID", "PIPELINE", "STREAM", "RANGE", "STATUS", "RECORDS", "WHEN", "PUBLISHED",
                              "OFFSET", "RUN", "OUTPUT"]
    assert len(rows) == 1 and f"{s}" in rows[0] and "[0, " in rows[0] and "committed" in rows[0]
    assert "Z" in rows[0] and out in rows[0]  # times in UTC and the output's path
    r = cli("ledger", "ranges", "--status", "failed", "--since", "1h", "--limit", "5", env=env)
    assert r.rc == 0 and r.out == "", r.err
    r = cli("ledger", "audit", "--pipeline", "first", "--broker-url", rabbitmq_url, env=env)
    assert r.rc == 0, r.out + r.err

    r = cli("status", "--pipeline", "first", env=env)  # the broker from $STREAMLEDGER_BROKER_URL
    assert r.rc == 0, r.err
    header, row = r.out.splitlines()
    assert header.split()[:4] == ["PIPELINE", "STREAM", "COMMITTED", "OPEN"] and "LAG" in header
    assert row.split()[:2] == ["first", s] and out in row
    (status,) = json.loads(cli("status", "--pipeline", "first", "--json", env=env).out)
    assert (status["done_to"], status["last_record"], status["stored"]) == (40, 39, 39)
    # the stored offset's tracking chunk takes an offset past 40, but only user records are lag
    assert status["tail"] > 40 and status["lag"] == 0
    assert status["committed"] == 1 and status["open_claims"] == 0

    r = cli("check", "--output-root", out, env=env)
    assert r.rc == 0 and [line.split()[:2] for line in r.out.splitlines()] == [
        ["broker", "ok"], ["ledger", "ok"], ["spark", "ok"], ["output", "ok"]], r.out + r.err


def test_read_reports_progress_and_every_broker_command_speaks_json(
    rabbitmq_url: str, stream_name: Any, tmp_path: Path
) -> None:
    s = stream_name("read-progress")
    create_stream(rabbitmq_url, s, 3000)
    env = {"STREAMLEDGER_BROKER_URL": rabbitmq_url, "STREAMLEDGER_PROGRESS_SECONDS": "0"}
    r = cli("read", s, "--start", "earliest", "--end", "tail", "--output", str(tmp_path / "x.parquet"),
            env=env)
    assert r.rc == 0, r.err
    assert json.loads(r.out)["records"] == 3000
    lines = [line for line in r.err.splitlines() if line.startswith(f"streamledger: read {s} [0, 3000)")]
    assert lines and all("offsets/s" in line for line in lines), r.err
    assert "3,000 / 3,000 offsets" in lines[-1] and "3,000 records" in lines[-1]

    r = cli("offset", "query", s, "nobody", "--json", env=env)
    assert r.rc == 0 and json.loads(r.out)["offset"] is None, r.err
    r = cli("stream", "stats", s, "--json", env=env)
    assert r.rc == 0 and json.loads(r.out)["committed_tail"] == 3000, r.err
    r = cli("read", "no-such-stream-" + s, "--start", "first", "--end", "next", "--output",
            str(tmp_path / "y.jsonl"), env=env)
    assert r.rc == 1 and "no-such-stream" in r.one_error_line()
