"""Issue 43 (leftovers): a losing publisher that dies between its refused manifest and its cleanup,
against RabbitMQ 4.3, local Spark and a real ledger (both), judged by the audit and the data.

The loser is an attempt of a committed range whose staging copy was gone: it read the range again
(the same rows, data files of another name) and copies onto a store without rename. It looked at the
range's directory before the winner published there; by its manifest the winner's is in place, its
create is refused, and it dies before it removes the files it copied (SIGKILL, as far as it can tell).

* The audit is never CLEAN over it: the published directory holds data files its manifest does not
  list (``output_mismatch`` naming them; ``--deep`` would count the rows twice).
* The next batch of the pipeline (another run) does not touch a published range: the files stay.
* A retry of the loser's run sweeps its earlier attempts' staging; before removing a staging copy it
  withdraws from the range's published directory the files of that copy the manifest there does not
  list (the loser's own rule, ``outputs._withdraw``): the directory is as the winner published it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from streamledger import fs as filesystems
from streamledger.batch import plan, run_batch
from streamledger.batch.outputs import publish
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, RangeStatus
from streamledger.manifest import MANIFEST
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, Killed, config, rid
from tests.integration.spark.helpers import create_stream
from tests.integration.spark.helpers import publish as send

pytestmark = pytest.mark.timeout(300)

PIPE = "p-loser-crash"


class LooseBeforeTheWinner:
    """The loser's view: it looked at ``final`` before the winner published there (a stall between
    its look and its first copy), then copies onto a store without rename and dies at its first
    delete (the cleanup of what it copied)."""

    def __init__(self, final: str) -> None:
        self.inner = filesystems.LocalFS(atomic_rename=False)
        self.final = final.rstrip("/")
        self.looked = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _hidden(self, uri: str) -> bool:
        return not self.looked and str(uri).rstrip("/").startswith(self.final)

    def exists(self, uri: str) -> bool:
        return False if self._hidden(uri) else bool(self.inner.exists(uri))

    def read_bytes(self, uri: str) -> bytes | None:
        return None if self._hidden(uri) else self.inner.read_bytes(uri)  # type: ignore[no-any-return]

    def copy_file(self, src: str, dst: str) -> None:
        self.looked = True  # past its look: from here it sees the store as it is
        self.inner.copy_file(src, dst)

    def delete(self, uri: str) -> None:
        raise Killed(f"killed before deleting {uri}")


def _losers_copy(root: Path, final: Path, run: Any, identity: str, stream: str) -> Path:
    """What the loser's re-read left in its staging: the range's rows under its own file names, and
    its manifest for the range (the winner's, with its files and time)."""
    attempt = Path(plan.staging_dir(str(root), PIPE, identity, run, "deadbeef"))
    copy = attempt / "reread" / stream
    copy.mkdir(parents=True)
    names = []
    for f in sorted(final.glob("*.parquet")):
        name = f.name.replace("part-", "part-loser-", 1)
        shutil.copyfile(f, copy / name)
        names.append(name)
    manifest = json.loads((final / MANIFEST).read_text())
    manifest.update(files=names, written_at="the loser's")
    (copy / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return copy


def test_a_loser_dead_before_its_cleanup_is_found_by_the_audit_and_withdrawn_by_its_runs_retry(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("loser-crash")
    create_stream(rabbitmq_url, s, 40)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE)
    run_batch(cfg, run=rid("t", run="winner"), ledger=any_ledger, broker=client, runner=runner)
    (rng,) = any_ledger.ranges(PIPE)
    assert rng.output is not None and rng.published_at is not None
    final = Path(rng.output)
    published = {p.name: p.read_bytes() for p in final.iterdir()}

    loser = rid("t", run="loser")
    copy = _losers_copy(tmp_path, final, loser, rng.source.broker, s)
    with pytest.raises(Killed):  # its manifest refused (PublishedByAnother next), it dies withdrawing
        publish(str(copy), str(final), rng.id, LooseBeforeTheWinner(str(final)))  # type: ignore[arg-type]
    left = sorted(set(p.name for p in final.iterdir()) - set(published))
    assert left and all(n.startswith("part-loser-") for n in left), left

    report = audit(any_ledger, PIPE, broker=client, deep=True)
    assert [v.kind.value for v in report.violations] == ["output_mismatch"], report.to_text()
    assert all(n in report.to_text() for n in left), report.to_text()

    send(rabbitmq_url, s, 10, start=40)  # the next batch of the pipeline: another run, new records
    run_batch(cfg, run=rid("t", run="next"), ledger=any_ledger, broker=client, runner=runner)
    assert sorted(set(p.name for p in final.iterdir()) - set(published)) == left  # it leaves them
    assert not audit(any_ledger, PIPE, broker=client).clean

    send(rabbitmq_url, s, 10, start=50)
    run_batch(cfg, run=rid("t", run="loser", try_number=2), ledger=any_ledger, broker=client, runner=runner)
    assert {p.name: p.read_bytes() for p in final.iterdir()} == published  # as the winner published it
    assert not copy.exists()  # its staging swept
    assert [r.status for r in any_ledger.ranges(PIPE)] == [RangeStatus.COMMITTED] * 3
    report = audit(any_ledger, PIPE, broker=client, deep=True)
    assert report.clean, report.to_text()
