"""``streamledger batch run`` against the real broker and local Spark. Issue 21 item 6: for a Delta
table (the Iceberg form is in test_table_sinks.py), with delta-rs: ``--json`` names the table
with its ``version``, progress lines go to stderr while stdout holds only the JSON, and a batch that
fails exits 1 with one line on stderr, nothing claimed. Issue 41: ``--bound-by-interval`` behaves as
the operator's ``bound_by_interval`` (every piece of its interval, through ``run_batch``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import RunId
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.runs import CLI_DAG
from tests.integration.batch.helpers import CountingRunner, committed_bodies, split_pinned_span
from tests.integration.spark.helpers import body, create_stream

pytestmark = pytest.mark.timeout(300)


def test_batch_run_into_delta_prints_the_table_and_progress_and_exits_1_on_failure(
    capsys: pytest.CaptureFixture[str], ledger: Ledger, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
    spark: Any,
) -> None:
    from deltalake import DeltaTable

    from streamledger.cli import main

    s = stream_name("cli-delta")
    create_stream(rabbitmq_url, s, 25)
    location = str(tmp_path / "lake" / "events")
    argv = ["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", "p-cli-delta", "--ledger",
            ledger.url, "--output-root", str(tmp_path / "out"), "--sink", "delta", "--table", location,
            "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)  # stdout is the JSON alone
    table = out["table"]
    assert (table["format"], table["identifier"]) == ("delta", location)
    assert table["version"] == DeltaTable(location).version() and "snapshot_id" not in table
    assert table["location"].rstrip("/").endswith("/lake/events")
    assert out["records"] == 25 and out["run_id"].startswith("cli-")
    progress = [line for line in captured.err.splitlines() if line.startswith("streamledger: ")]
    assert any(s in line for line in progress), captured.err  # progress on stderr while it reads
    assert len(DeltaTable(location).to_pyarrow_table(columns=["offset"])) == 25

    missing = stream_name("cli-missing")  # never created: the batch fails
    assert main([*argv[:5], missing, *argv[6:]]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err and missing in err[-1]
    assert not [r for r in ledger.ranges("p-cli-delta") if r.source.stream == missing]  # nothing claimed


def test_batch_run_bound_by_interval_reads_every_piece_of_its_interval_as_the_operator_does(
    capsys: pytest.CaptureFixture[str], ledger: Ledger, client: StreamClient, runner: CountingRunner,
    rabbitmq_url: str, stream_name: Any, tmp_path: Path,
) -> None:
    """Issue 41: ``batch run --bound-by-interval`` goes through ``run_batch`` as the operator does.
    Interval i1 [t0, t1) holds [0, 150); its first run failed, a narrower interval's run committed
    [50, 100): the command's run of i1 reads both pieces left, [0, 50) and [100, 150), in one
    call (before, it ran one round of the batch and left [100, 150) for a later call)."""
    from streamledger.cli import main

    s = stream_name("cli-pieces")
    create_stream(rabbitmq_url, s)
    pipeline = "p-cli-pieces"
    root = tmp_path / "out"
    i1 = RunId(CLI_DAG, "i1", "batch")  # the command's identity for --run-id i1: this call is its retry
    t0, t1 = split_pinned_span(pipeline, rabbitmq_url, root, s, ledger, client, runner, i1)
    argv = ["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", pipeline, "--ledger",
            ledger.url, "--output-root", str(root), "--bound-by-interval", "--initial-position",
            "interval-start", "--interval-start", t0.isoformat(), "--interval-end", t1.isoformat(),
            "--interval-grace", "5", "--run-id", "i1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranges"] == {s: [0, 50, 100, 150]}, out
    assert out["records"] == 100, out
    live = [(r.start, r.end, r.status.value) for r in ledger.ranges(pipeline)
            if r.status.value != "failed" and r.start < r.end]
    assert live == [(0, 50, "committed"), (50, 100, "committed"), (100, 150, "committed")], live
    assert sorted(committed_bodies(ledger, pipeline)) == sorted(body(s, i) for i in range(150))
    assert client.query_offset(s, pipeline) == 149


def test_batch_run_in_process_leaves_the_batch_loggers_level_and_propagation_as_it_found_them(
    capsys: pytest.CaptureFixture[str], ledger: Ledger, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
    spark: Any,
) -> None:
    """A program that calls ``streamledger.cli.main`` (a task, a notebook) keeps its own logging: the
    command's one line per step goes to stderr while it runs, and afterwards the ``streamledger.batch``
    logger has the level and propagation it had before (an INFO level left behind would send every
    later batch's step lines through the program's handlers)."""
    import logging

    from streamledger.cli import main

    s = stream_name("cli-logger")
    create_stream(rabbitmq_url, s, 5)
    batch_log = logging.getLogger("streamledger.batch")
    before = (batch_log.level, batch_log.propagate, list(batch_log.handlers))
    argv = ["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", "p-cli-logger", "--ledger",
            ledger.url, "--output-root", str(tmp_path / "out")]
    assert main(argv) == 0
    assert any(line.startswith("streamledger: ") for line in capsys.readouterr().err.splitlines())
    assert (batch_log.level, batch_log.propagate, list(batch_log.handlers)) == before
