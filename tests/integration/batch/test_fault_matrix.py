"""Issue 19's fault matrix: a batch killed at each of its steps, then retried, never retried, or
overtaken by a newer run, on SQLite and PostgreSQL, against the real RabbitMQ 4.3 broker and local
Spark. Afterwards every record is published exactly once, no committed range is left unpublished,
the broker's stored offset is the ledger's watermark, and the audit (outputs included) is clean;
then an output removed by hand makes it fail.

Issue 42 adds a transform column: the raw landing, or JSON bodies decoded (malformed ones to the
dead letter) and filtered by a SQL transform. With the transform, every committed range's rows
must be what plain Python (:mod:`json`, not the product's code) computes from the broker's records
of exactly that range, once; the ledger's ``rows_out`` / ``dead_letter`` must count them; no row
of a failed attempt may be where a reader looks. The suite runs one cell per row (ledger, step,
afterwards): the transform on one row of each step (the afterwards the step's index modulo 3, the
ledgers taking turns), the raw landing on the others; ``make test-matrix`` runs the other cells
(marked ``matrix``). A transform cell costs about three raw ones (the raw landing, then the
transform's own read and write per range): on a sixth of the rows the sampled matrix took 45 s
against the raw matrix's 34 s before it (1.3x, a quiet machine), against 73 s on a third.

A *kill* is a ``BaseException`` raised inside the batch at that point: none of the batch's own
clean-up runs, as with SIGKILL of the task process.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from streamledger.batch import BatchConfig, run_batch
from streamledger.batch import outputs as batch_outputs
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, RangeStatus, ViolationKind
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.transform import DEAD_LETTER_DIR
from tests.integration.batch.helpers import CountingRunner, KillAtStore, Killed, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream

pytestmark = pytest.mark.timeout(300)

PIPE = "p-exactly-once"
RECORDS = 120
STEPS = ("claim", "read", "verify", "commit", "publish", "store")
AFTERWARDS = ("retried", "never-retried", "newer-run-first")
TRANSFORMS = ("raw", "json")
#: The JSON cell's transform: typed fields, malformed bodies aside, a filter and a derived column.
SCHEMA = "n BIGINT, kind STRING, amount DECIMAL(10,2)"
SQL = "SELECT n, amount * 3 AS tripled, offset AS source_offset FROM records WHERE kind <> 'skip'"


def json_body(i: int) -> bytes:
    """Record ``i`` of the JSON cell: every eleventh cut short, every thirteenth a JSON array (both
    dead letters), every fourth of kind ``skip`` (filtered out)."""
    if i % 11 == 5:
        return b'{"n": 1, "kind": '
    if i % 13 == 7:
        return b"[1, 2, 3]"
    kind = "skip" if i % 4 == 1 else "keep"
    return json.dumps({"n": i, "kind": kind, "amount": f"{i}.{i % 100:02d}"}).encode()


LEDGERS = ("sqlite", "postgres")


def cells() -> list[Any]:
    """Every (ledger, step, afterwards, transform); the suite's one per row: the transform where the
    afterwards is the step's index modulo 3 and the ledger the step's index modulo 2, the rest
    ``matrix``."""
    out = []
    for i, step in enumerate(STEPS):
        for j, afterwards in enumerate(AFTERWARDS):
            for k, ledger in enumerate(LEDGERS):
                chosen = TRANSFORMS[j == i % len(AFTERWARDS) and k == i % len(LEDGERS)]
                for transform in TRANSFORMS:
                    out.append(pytest.param(ledger, step, afterwards, transform,
                                            id=f"{ledger}-{step}-{afterwards}-{transform}",
                                            marks=() if transform == chosen else pytest.mark.matrix))
    return out


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


@pytest.mark.parametrize(("any_ledger", "step", "afterwards", "transform"), cells(), indirect=["any_ledger"])
def test_killed_at_every_step(
    step: str, afterwards: str, transform: str, any_ledger: Ledger, client: StreamClient,
    runner: CountingRunner, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = stream_name(f"fm-{step}")
    settings: dict[str, Any] = {}
    if transform == "raw":
        create_stream(rabbitmq_url, s, RECORDS)
    else:
        client.create_stream(s)
        assert client.publish(s, [json_body(i) for i in range(RECORDS)]).confirmed == RECORDS
        settings = dict(body_format="json", body_schema=SCHEMA, on_bad_record="dead_letter", sql=SQL)
    capped = config(rabbitmq_url, tmp_path, s, max_offsets=40, **settings)
    rest = config(rabbitmq_url, tmp_path, s, **settings)
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

    committed = [r for r in any_ledger.ranges(PIPE) if r.records]
    if transform == "raw":
        assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(body(s, i) for i in range(RECORDS))
    else:
        transformed_once(any_ledger, client, s, tmp_path, rest)
    assert all(r.published_at is not None for r in committed), [r.describe() for r in committed]
    assert client.query_offset(s, PIPE) == RECORDS - 1
    report = audit(any_ledger, PIPE, broker=client, deep=True)
    assert report.clean, report.to_text()

    shutil.rmtree(str(committed[0].output))
    report = audit(any_ledger, PIPE, broker=client)
    assert [v.kind for v in report.violations] == [ViolationKind.OUTPUT_MISSING], report.to_text()


def expected_rows(client: StreamClient, stream: str, start: int, end: int
                  ) -> tuple[list[tuple[Any, ...]], list[int]]:
    """The range's rows and dead-letter offsets, from the broker's records read with its own client and
    decoded with :mod:`json` (the reference: never the product's code)."""
    rows: list[tuple[Any, ...]] = []
    dead: list[int] = []
    for batch in client.read_range(stream, start, end):
        for offset, raw in zip(batch.offsets, batch.bodies, strict=True):
            try:
                value = json.loads(bytes(raw))
            except ValueError:
                value = None
            if not isinstance(value, dict):
                dead.append(offset)
            elif value["kind"] != "skip":
                rows.append((value["n"], Decimal(value["amount"]) * 3, offset))
    return sorted(rows), sorted(dead)


def transformed_once(ledger: Ledger, client: StreamClient, stream: str, root: Path, cfg: BatchConfig) -> None:
    """Every committed range's rows are there once, equal to plain Python's reading of exactly its
    records; the ledger counts them; no other row is where a reader looks."""
    fingerprint = cfg.transformation().fingerprint()  # type: ignore[union-attr]
    committed = [r for r in ledger.ranges(PIPE) if r.records]
    assert sum(r.records or 0 for r in committed) == RECORDS
    everything: list[tuple[Any, ...]] = []
    for r in committed:
        assert r.status == RangeStatus.COMMITTED and r.output is not None, r.describe()
        want, dead = expected_rows(client, stream, r.start, r.end)
        got = table(Path(r.output))
        assert sorted((g["n"], g["tripled"], g["source_offset"]) for g in got) == want, r.describe()
        assert {(g["streamledger_stream"], g["streamledger_start"], g["streamledger_end"]) for g in got} <= {
            (stream, r.start, r.end)}
        assert sorted(d["offset"] for d in table(Path(r.output) / DEAD_LETTER_DIR)) == dead, r.describe()
        assert (r.rows_out, r.dead_letter, r.transform) == (len(want), len(dead), fingerprint), r.describe()
        everything += want
    assert len(everything) == len(set(everything))  # each source record's row in one range only
    # Where a reader looks (not the staging area, not a dead letter): the committed ranges' files only.
    visible = {p.parent for p in root.rglob("*.parquet")
               if not any(part.startswith("_") for part in p.relative_to(root).parts)}
    assert visible <= {Path(r.output) for r in committed}, sorted(map(str, visible))


def table(where: Path) -> list[dict[str, Any]]:
    files = sorted(str(p) for p in where.glob("*.parquet"))
    return ds.dataset(files, format="parquet").to_table().to_pylist() if files else []
