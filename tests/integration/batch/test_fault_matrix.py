"""Issue 19's fault matrix: a batch killed at each of its steps, then retried, never retried, or
overtaken by a newer run, on SQLite and PostgreSQL, against the real RabbitMQ 4.3 broker and local
Spark. Afterwards every record is published exactly once, no committed range is left unpublished,
the broker's stored offset is the ledger's watermark, and the audit (outputs included) is clean;
then an output removed by hand makes it fail.

A *kill* is a ``BaseException`` raised inside the batch at that point: none of the batch's own
clean-up runs, as with SIGKILL of the task process.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, run_batch
from streamledger.batch import outputs as batch_outputs
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, ViolationKind
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, KillAtStore, Killed, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream

pytestmark = pytest.mark.timeout(300)

PIPE = "p-exactly-once"
RECORDS = 120
STEPS = ("claim", "read", "verify", "commit", "publish", "store")
AFTERWARDS = ("retried", "never-retried", "newer-run-first")


def alive(_holder: Any) -> bool:
    return True


def gone(_holder: Any) -> bool:
    return False


def killed_run(step: str, cfg: BatchConfig, ledger: Ledger, client: StreamClient, runner: CountingRunner,
               monkeypatch: pytest.MonkeyPatch) -> None:
    """Run A (run r1, try 1) and kill it at ``step``."""
    broker: Any = client
    hook: Callable[[str, Any], None] | None = None
    if step in ("claim", "verify", "commit"):
        after = {"claim": "claimed", "verify": "read", "commit": "committed"}[step]

        def hook(name: str, _batch: Any) -> None:
            if name == after:
                raise Killed(f"SIGKILL after {after}")
    elif step == "read":
        runner.die = Killed("SIGKILL during the job")
    elif step == "publish":
        real = batch_outputs.publish

        def dies_after_rename(*args: Any, **kwargs: Any) -> None:  # the rename happened, the mark did not
            real(*args, **kwargs)
            raise Killed("SIGKILL between the rename and recording it")

        monkeypatch.setattr(batch_outputs, "publish", dies_after_rename)
    else:
        broker = KillAtStore(client)
        broker.kill = True
    try:
        with pytest.raises(Killed):
            run_batch(cfg, run=rid("a", run="r1"), ledger=ledger, broker=broker, runner=runner, on_step=hook)
    finally:
        monkeypatch.undo()
        runner.die = None


@pytest.mark.parametrize("afterwards", AFTERWARDS)
@pytest.mark.parametrize("step", STEPS)
def test_killed_at_every_step(
    step: str, afterwards: str, any_ledger: Ledger, client: StreamClient, runner: CountingRunner,
    rabbitmq_url: str, stream_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = stream_name(f"fm-{step}")
    create_stream(rabbitmq_url, s, RECORDS)
    capped = config(rabbitmq_url, tmp_path, s, max_offsets=40)
    rest = config(rabbitmq_url, tmp_path, s)
    killed_run(step, capped, any_ledger, client, runner, monkeypatch)

    def run(cfg: BatchConfig, who: Any, holder_alive: Callable[[Any], bool] | None = None) -> Any:
        return run_batch(cfg, run=who, ledger=any_ledger, broker=client, runner=runner,
                         holder_alive=holder_alive)

    if afterwards == "retried":
        run(capped, rid("a", run="r1", try_number=2))
    elif afterwards == "newer-run-first":  # the scheduler still believes A alive: nothing of A is taken
        run(rest, rid("b", run="r2"), alive)
        stored = client.query_offset(s, PIPE)
        mark = any_ledger.watermark(PIPE, any_ledger.ranges(PIPE)[0].source)
        assert mark.accepts(stored), (stored, mark)
        run(capped, rid("a", run="r1", try_number=2))
    # Whatever came before, later runs of the pipeline (A reported gone) bring it to the end: one
    # range per run, so a few runs until one finds nothing new.
    for n in range(3, 9):
        if run(rest, rid("c", run=f"r{n}"), gone).empty:
            break

    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(body(s, i) for i in range(RECORDS))
    committed = [r for r in any_ledger.ranges(PIPE) if r.records]
    assert all(r.published_at is not None for r in committed), [r.describe() for r in committed]
    assert client.query_offset(s, PIPE) == RECORDS - 1
    report = audit(any_ledger, PIPE, broker=client, deep=True)
    assert report.clean, report.to_text()

    shutil.rmtree(str(committed[0].output))
    report = audit(any_ledger, PIPE, broker=client)
    assert [v.kind for v in report.violations] == [ViolationKind.OUTPUT_MISSING], report.to_text()
