"""Issue 21 item 6: ``streamledger batch run`` for a Delta table (the Iceberg form is in
test_table_sinks.py), against the real broker, local Spark and delta-rs: ``--json`` names the table
with its ``version``, progress lines go to stderr while stdout holds only the JSON, and a batch that
fails exits 1 with one line on stderr, nothing claimed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamledger.ledger import Ledger
from tests.integration.spark.helpers import create_stream

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
