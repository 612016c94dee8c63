"""Issue 43 (leftovers): a streaming micro-batch's manifest is written create-only, by the batch's rule
(``outputs.create_manifest``), against the real broker, a real ledger (both) and local Spark.

Two writers reach the manifest line of ``MicroBatchRecorder.settle`` for one range directory when a
micro-batch's claim is released (``ledger release-stale``) while it settles, after it found its claim
and before it wrote: the span is then claimed again whole (the redo rule) by whoever asks next, a
batch or another query, which writes (or publishes) that directory and commits. The stalled
micro-batch then used to write its manifest over theirs (an overwrite): the committed range's
directory named the failed claim (the audit: ``output_mismatch``, a foreign directory) and a batch's
data files were no longer listed by any manifest. A replayed micro-batch (the query restarted after a
crash between its manifest and its commit) finds its own manifest there and commits what it says.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import run_batch
from streamledger.batch.microbatch import MicroBatchError, MicroBatchRecorder
from streamledger.batch.plan import broker_identity
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, SourceRef
from streamledger.ledger.types import SourcePosition
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, Killed, config, rid
from tests.integration.spark.helpers import create_stream

pytestmark = pytest.mark.timeout(300)

PIPELINE = "p-mb-create"


class StallingLedger(Ledger):
    """The real ledger; ``stall`` runs once inside the next ``positions`` read, which a settling
    micro-batch makes after it found its claim and before it writes its manifest (a spy: nothing of
    the ledger replaced). ``die_at_commit`` raises :class:`Killed` at the next commit instead of it."""

    stall: Callable[[], None] | None = None
    die_at_commit = False

    def positions(self, pipeline: str, sources: Sequence[SourceRef], **kw: Any) -> list[SourcePosition]:
        if self.stall is not None:
            run, self.stall = self.stall, None
            run()
        return super().positions(pipeline, sources, **kw)

    def commit(self, range_id: int, **kw: Any) -> Any:
        if self.die_at_commit:
            self.die_at_commit = False
            raise Killed("killed between the manifest and the commit")
        return super().commit(range_id, **kw)


def _manifest(directory: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(directory) / "_manifest.json").read_text())
    return data


def test_a_micro_batch_released_while_it_settles_leaves_the_batchs_published_output(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Query A claims [0, 5) and settles; between finding its claim and writing its manifest, the
    operator releases it and a batch of the same pipeline and root claims [0, 5) again, reads it and
    publishes it with its data file. A's manifest must not replace the batch's: A fails in one line,
    the batch's directory is as published and the audit (deep) is clean. Before: A's manifest (its
    failed range, no files) replaced the batch's, the audit said output_mismatch."""
    s = stream_name("mb-batch")
    create_stream(rabbitmq_url, s, 5)
    root = tmp_path / "out"
    spy = StallingLedger(any_ledger.url)
    a = MicroBatchRecorder(spy, PIPELINE, str(root), broker_identity(rabbitmq_url, "east"))
    a.claim("qa", 0, s, 0, 5)

    def release_and_batch() -> None:
        assert [r.start for r in any_ledger.release_stale(timedelta(0), pipeline=PIPELINE)] == [0]
        run_batch(config(rabbitmq_url, root, s, pipeline=PIPELINE, broker_name="east"),
                  run=rid("read", run="b1"), ledger=any_ledger, broker=client, runner=runner)

    spy.stall = release_and_batch
    with pytest.raises(MicroBatchError) as lost:
        a.settle("qa", 0, {s: 5}, client)
    said = str(lost.value)
    assert "\n" not in said and repr(s) in said and "micro-batch 0 of query qa" in said, said
    (done,) = [r for r in any_ledger.ranges(PIPELINE) if r.status.value == "committed"]
    assert done.run.dag_id == "dag" and done.output is not None
    published = _manifest(done.output)
    assert published["range_id"] == done.id and len(published["files"]) >= 1, published
    report = audit(any_ledger, PIPELINE, broker=client, deep=True, stale_after=timedelta(0))
    assert report.clean, report.to_text()
    a.close()


def test_a_micro_batch_released_while_it_settles_leaves_the_other_querys_manifest(
    any_ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
) -> None:
    """The same with another query B of the pipeline (a second checkpoint) taking the released span:
    B's manifest stays, A fails in one line and records nothing, the audit is clean. Before: A's
    manifest replaced B's (the audit: output_mismatch, B's directory naming A's failed range)."""
    s = stream_name("mb-query")
    create_stream(rabbitmq_url, s, 5)
    root, broker = str(tmp_path / "out"), broker_identity(rabbitmq_url, "east")
    spy = StallingLedger(any_ledger.url)
    a = MicroBatchRecorder(spy, PIPELINE, root, broker)
    b = MicroBatchRecorder(any_ledger, PIPELINE, root, broker)
    a.claim("qa", 0, s, 0, 5)

    def release_and_query() -> None:
        any_ledger.release_stale(timedelta(0), pipeline=PIPELINE)
        b.claim("qb", 0, s, 0, 5)
        b.settle("qb", 0, {s: 5}, client)

    spy.stall = release_and_query
    with pytest.raises(MicroBatchError, match=r"another attempt published .* first"):
        a.settle("qa", 0, {s: 5}, client)
    (done,) = [r for r in any_ledger.ranges(PIPELINE) if r.status.value == "committed"]
    assert done.run.dag_id.endswith("qb"), done.run
    assert done.output is not None and _manifest(done.output)["range_id"] == done.id
    report = audit(any_ledger, PIPELINE, broker=client, stale_after=timedelta(0))
    assert report.clean, report.to_text()
    a.close()


def test_a_replayed_micro_batch_commits_the_manifest_its_first_try_wrote(
    any_ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
) -> None:
    """The query dies between its manifest and its commit; restarted on its checkpoint (same query
    id, same batch) it finds its own claim and its own manifest: the create-only write is refused,
    the manifest in place names this range, so it stays as written and the range is committed with
    it; the audit is clean."""
    s = stream_name("mb-replay")
    create_stream(rabbitmq_url, s, 5)
    root, broker = str(tmp_path / "out"), broker_identity(rabbitmq_url, "east")
    spy = StallingLedger(any_ledger.url)
    first = MicroBatchRecorder(spy, PIPELINE, root, broker)
    first.claim("q", 0, s, 0, 5)
    spy.die_at_commit = True
    with pytest.raises(Killed):
        first.settle("q", 0, {s: 5}, client)
    (claimed,) = any_ledger.ranges(PIPELINE)
    assert claimed.output is None
    written = next(Path(root).rglob("_manifest.json")).read_bytes()

    again = MicroBatchRecorder(any_ledger, PIPELINE, root, broker)
    again.claim("q", 0, s, 0, 5)
    again.settle("q", 0, {s: 5}, client)
    (done,) = any_ledger.ranges(PIPELINE)
    assert (done.id, done.status.value, done.records) == (claimed.id, "committed", 5)
    assert done.output is not None and (Path(done.output) / "_manifest.json").read_bytes() == written
    report = audit(any_ledger, PIPELINE, broker=client, stale_after=timedelta(0))
    assert report.clean, report.to_text()
    first.close()


def test_a_query_restarted_after_its_claim_was_released_replaces_the_failed_ranges_manifest(
    any_ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
) -> None:
    """The query dies between its manifest and its commit, the operator releases its claim
    (``release-stale``), the query restarts on its checkpoint and claims the span again (a new range):
    the manifest in place names the failed range, which nothing can commit any more, so its directory
    is moved aside (never deleted) and the new range's manifest created; the query goes on and the
    audit is clean."""
    s = stream_name("mb-released")
    create_stream(rabbitmq_url, s, 5)
    root, broker = str(tmp_path / "out"), broker_identity(rabbitmq_url, "east")
    spy = StallingLedger(any_ledger.url)
    first = MicroBatchRecorder(spy, PIPELINE, root, broker)
    first.claim("q", 0, s, 0, 5)
    spy.die_at_commit = True
    with pytest.raises(Killed):
        first.settle("q", 0, {s: 5}, client)
    (released,) = any_ledger.release_stale(timedelta(0), pipeline=PIPELINE)

    again = MicroBatchRecorder(any_ledger, PIPELINE, root, broker)
    again.claim("q", 0, s, 0, 5)
    again.settle("q", 0, {s: 5}, client)
    (done,) = [r for r in any_ledger.ranges(PIPELINE) if r.status.value == "committed"]
    assert done.id != released.id and done.output is not None
    assert _manifest(done.output)["range_id"] == done.id
    aside = [p.name for p in Path(done.output).parent.iterdir() if ".superseded-" in p.name]
    assert len(aside) == 1, aside
    report = audit(any_ledger, PIPELINE, broker=client, stale_after=timedelta(0))
    assert report.clean, report.to_text()
    first.close()
