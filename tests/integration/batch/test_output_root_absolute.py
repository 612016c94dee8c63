"""Where a pipeline writes is one place from any directory (issue 43, item 3): the output root and a
Delta table location are made absolute when the spec is built, for every face (the rule is
``streamledger.batch.rules``, asked by ``PipelineSpec``), an empty root is refused before anything is
claimed, and a Delta table on another file system than the root is refused before the claim.
RabbitMQ 4.3, local Spark, both ledgers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, BatchError, run_batch
from streamledger.cli import main
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, rid
from tests.integration.spark.helpers import create_stream

pytestmark = pytest.mark.timeout(300)


def test_a_relative_output_root_is_recorded_absolute_and_the_audit_is_clean_from_another_directory(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    pipe, s = "p-relative-root", stream_name("relative-root")
    create_stream(rabbitmq_url, s, 30)
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    cfg = BatchConfig(pipeline=pipe, url=rabbitmq_url, output_root="out", stream=s)
    assert cfg.output_root == str(tmp_path / "here" / "out")
    run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    outputs = [r.output for r in any_ledger.ranges(pipe) if r.output]
    assert outputs and all(os.path.isabs(o) for o in outputs), outputs
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    rc = main(["ledger", "audit", "--db", any_ledger.url, "--pipeline", pipe])
    out = capsys.readouterr().out
    assert rc == 0, out


def test_an_empty_output_root_is_refused_before_anything_is_claimed(
    ledger: Ledger, rabbitmq_url: str, stream_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = stream_name("empty-root")
    create_stream(rabbitmq_url, s, 5)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    rc = main(["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", "p-empty-root", "--ledger",
               ledger.url, "--output-root", ""])
    err = capsys.readouterr().err
    assert rc == 2 and "output root" in err and len(err.strip().splitlines()) == 1, err
    assert ledger.ranges("p-empty-root") == []
    assert not [p.name for p in tmp_path.iterdir() if not p.name.startswith("ledger.sqlite")]


def test_a_delta_table_on_another_file_system_than_the_root_is_refused_and_a_relative_one_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rabbitmq_url: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BatchError, match="another file system") as refused:
        BatchConfig(pipeline="p-delta-place", url=rabbitmq_url, output_root="s3://lake/delta", stream="s",
                    sink="delta", table="ceo.events_delta")
    assert "\n" not in str(refused.value)
    cfg = BatchConfig(pipeline="p-delta-place", url=rabbitmq_url, output_root="out", stream="s", sink="delta",
                      table="ceo.events_delta")
    assert (cfg.output_root, cfg.table) == (str(tmp_path / "out"), str(tmp_path / "ceo.events_delta"))
    assert cfg.spec.table == cfg.table
    assert list(tmp_path.iterdir()) == []
