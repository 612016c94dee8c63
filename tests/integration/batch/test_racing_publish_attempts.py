"""Two attempts racing to publish one committed range, judged by the data.

Each test drives ``run_batch`` against RabbitMQ 4.3, local Spark and a real ledger, and reads the
outputs back: every published record must be in the range's recorded output exactly once, and
nothing else under the pipeline's directory (what a reader globbing ``<root>/<pipeline>/`` reads)
may hold a second copy.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger import fs as filesystems
from streamledger.batch import plan, run_batch
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, RangeStatus
from streamledger.manifest import MANIFEST
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.spark.helpers import body, create_stream

pytestmark = pytest.mark.timeout(300)

PIPE = "p-redteam-publish"


def glob_bodies(root: Path, pipeline: str) -> list[bytes]:
    """Every body in every Parquet file under the pipeline's published tree, as a reader globbing
    ``<root>/<pipeline>/`` reads it (hidden ``_``/``.`` files skipped, as Spark and pyarrow do)."""
    base = Path(plan.pipeline_dir(str(root), pipeline))
    out: list[bytes] = []
    for f in sorted(base.rglob("*.parquet")):
        if any(part.startswith(("_", ".")) for part in f.relative_to(base).parts):
            continue
        out.extend(pq.read_table(f, columns=["body"]).column("body").to_pylist())
    return out


def recorded_bodies(ledger: Ledger, pipeline: str) -> list[bytes]:
    """Every body in each committed range's recorded output directory (empty when it is gone)."""
    out: list[bytes] = []
    for r in ledger.ranges(pipeline):
        if (r.status == RangeStatus.COMMITTED and r.records and r.output
                and (Path(r.output) / MANIFEST).is_file()):
                out.extend(pq.read_table(r.output, columns=["body"]).column("body").to_pylist())
    return out


class HeldAtFinal:
    """A local file system (atomic rename or not) that holds the ``zombie`` thread the first time it
    asks whether a final range directory exists: the pause of a process (GC, SIGSTOP, a slow store)
    right after its lease check and before it moves anything."""

    def __init__(self, root: Path, atomic: bool) -> None:
        self.inner = filesystems.LocalFS(atomic_rename=atomic)
        self.published_tree = plan.pipeline_dir(str(root), PIPE)
        self.hold = threading.Event()
        self.reached = threading.Event()
        self.held_once = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def exists(self, uri: str) -> bool:
        if (threading.current_thread().name == "zombie" and not self.held_once
                and str(uri).startswith(self.published_tree)):
            self.held_once = True
            self.reached.set()
            self.hold.wait(120)
        return bool(self.inner.exists(uri))


@pytest.mark.parametrize("atomic", [True, False], ids=["rename", "copy"])
def test_a_zombie_resuming_after_its_retry_published_leaves_the_output_in_place(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, atomic: bool,
) -> None:
    """Try 1 commits and passes its publish-lease check, then pauses before it moves anything; try 2
    of the same task takes the lease over (superseded) and publishes. The zombie resumes: whatever it
    does, the published output must still hold every record exactly once, in its recorded place."""
    s = stream_name("zombie-final")
    create_stream(rabbitmq_url, s, 60)
    held = HeldAtFinal(tmp_path, atomic)
    monkeypatch.setattr(filesystems, "filesystem_for", lambda location, runner=None: held)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=PIPE)
    failure: list[BaseException] = []

    def zombie() -> None:
        try:
            run_batch(cfg, run=rid("t", try_number=1), ledger=any_ledger, broker=client, runner=runner)
        except BaseException as exc:  # the zombie may fail; what it leaves is the question
            failure.append(exc)

    thread = threading.Thread(target=zombie, name="zombie")
    thread.start()
    assert held.reached.wait(120), "the zombie never reached its publish"
    with StreamClient.connect(rabbitmq_url) as own:
        run_batch(cfg, run=rid("t", try_number=2), ledger=any_ledger, broker=own, runner=runner)
    want = sorted(body(s, i) for i in range(60))
    assert sorted(recorded_bodies(any_ledger, PIPE)) == want  # the retry published it
    held.hold.set()
    thread.join(120)
    assert not thread.is_alive()
    # The data, after the zombie resumed: the recorded output holds every record once, and the
    # pipeline's tree holds no second copy.
    assert sorted(recorded_bodies(any_ledger, PIPE)) == want, f"zombie: {failure}"
    assert sorted(glob_bodies(tmp_path, PIPE)) == want
    assert audit(any_ledger, PIPE, broker=client).clean
