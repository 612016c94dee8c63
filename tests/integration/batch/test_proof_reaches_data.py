"""Issue 19: the proof reaches the data. Against the real RabbitMQ 4.3 broker, local Spark and real
ledgers (SQLite and PostgreSQL): nothing committed is left unpublished behind a stored offset, the
audit looks at the published outputs, a re-created stream is refused instead of skipped, an
ambiguous commit keeps its verified copy, and two attempts never publish one range at once.

Each test names the issue item it proves; each failed against the code before the fix for the
reason the issue gives (see the closing note of issue 19).
"""

from __future__ import annotations

import shutil
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from streamledger import fs as filesystems
from streamledger.batch import BatchError, run_batch
from streamledger.batch import outputs as batch_outputs
from streamledger.batch.proof import audit
from streamledger.cli import main
from streamledger.ledger import Ledger, LedgerError, RangeStatus, ViolationKind
from streamledger.manifest import MANIFEST
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, Killed, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream

pytestmark = pytest.mark.timeout(300)

PIPE = "p-exactly-once"


def gone(_holder: Any) -> bool:
    """``holder_alive`` of a scheduler that reports every other holder finished."""
    return False


def die_after(step: str) -> Any:
    def hook(name: str, _batch: Any) -> None:
        if name == step:
            raise Killed(f"SIGKILL after {step}")

    return hook


def expected(stream: str, n: int) -> list[bytes]:
    return sorted(body(stream, i) for i in range(n))


def test_a_range_committed_by_a_run_killed_before_publish_is_published_by_the_next_run(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 1: run A commits [0, 100) and dies before publishing, never retried (retries=0). The
    next runs publish A's range from its staging copy before storing an offset past it."""
    s = stream_name("strand")
    create_stream(rabbitmq_url, s, 250)
    cfg = config(rabbitmq_url, tmp_path, s, max_offsets=100)
    with pytest.raises(Killed):
        run_batch(cfg, run=rid("a", run="r1"), ledger=any_ledger, broker=client, runner=runner,
                  on_step=die_after("committed"))
    reads = runner.calls
    for n, run in enumerate(("r2", "r3"), start=2):
        run_batch(cfg, run=rid("b", run=run), ledger=any_ledger, broker=client, runner=runner,
                  holder_alive=gone)
        assert runner.calls == reads + n - 1  # A's range was published from staging, not read again
    assert sorted(committed_bodies(any_ledger, PIPE)) == expected(s, 250)
    assert client.query_offset(s, PIPE) == 249
    assert all(r.published_at is not None for r in any_ledger.ranges(PIPE) if r.records)
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


def test_the_offset_never_passes_a_committed_range_whose_publish_lease_is_still_live(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 1 without a scheduler to ask: while the dead run's publish lease has not expired, the
    next run publishes its own range but stores no offset past the stranded one; once the lease
    expired (claim_timeout), the run after it finishes the publish."""
    s = stream_name("lease")
    create_stream(rabbitmq_url, s, 200)
    # The lease must outlive the next run's whole batch on a loaded machine (a job alone took ~2 s).
    cfg = config(rabbitmq_url, tmp_path, s, max_offsets=100, heartbeat_interval=0.5, claim_timeout=8.0)
    with pytest.raises(Killed):
        run_batch(cfg, run=rid("a", run="r1"), ledger=ledger, broker=client, runner=runner,
                  on_step=die_after("committed"))
    run_batch(cfg, run=rid("b", run="r2"), ledger=ledger, broker=client, runner=runner)
    assert client.query_offset(s, PIPE) is None  # [0, 100) is committed but nobody can read it yet
    first = ledger.ranges(PIPE)[0]
    assert (first.start, first.end, first.published_at) == (0, 100, None)
    notes = audit(ledger, PIPE, broker=client)
    assert [v.kind for v in notes.notes] == [ViolationKind.UNPUBLISHED]
    # wait until the killed attempt's publish lease (claim_timeout 8 s) ended by the ledger's clock
    # (UTC): its last beat is in the ledger, and run b has used up part of those 8 s already
    now = datetime.now(UTC)
    beat = (first.publish_beat or now).replace(tzinfo=UTC)
    time.sleep(max(0.0, (beat + timedelta(seconds=8.2) - now).total_seconds()))
    quiet = audit(ledger, PIPE, stale_after=timedelta(seconds=1))
    assert quiet.of_kind(ViolationKind.UNPUBLISHED), quiet.to_text()  # its lease went quiet: a violation
    run_batch(cfg, run=rid("c", run="r3"), ledger=ledger, broker=client, runner=runner)
    assert sorted(committed_bodies(ledger, PIPE)) == expected(s, 200)
    assert client.query_offset(s, PIPE) == 199
    assert audit(ledger, PIPE, broker=client).clean


def test_a_publish_that_raises_is_finished_by_the_next_run(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 1: the publish itself fails (an object-store copy error): nothing is stored past the
    range, the audit says so, and the next run of the pipeline publishes it."""
    s = stream_name("pubfail")
    create_stream(rabbitmq_url, s, 150)
    cfg = config(rabbitmq_url, tmp_path, s, max_offsets=100)
    real = batch_outputs.publish

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("copy to the object store failed: 503 Slow Down")

    monkeypatch.setattr(batch_outputs, "publish", broken)
    with pytest.raises(OSError, match="Slow Down"):
        run_batch(cfg, run=rid("a", run="r1"), ledger=any_ledger, broker=client, runner=runner)
    monkeypatch.setattr(batch_outputs, "publish", real)
    assert client.query_offset(s, PIPE) is None
    report = audit(any_ledger, PIPE)
    assert [v.kind for v in report.violations] == [ViolationKind.UNPUBLISHED], report.to_text()
    run_batch(cfg, run=rid("b", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    assert sorted(committed_bodies(any_ledger, PIPE)) == expected(s, 150)
    assert client.query_offset(s, PIPE) == 149
    assert audit(any_ledger, PIPE, broker=client).clean


def audit_cli(capsys: pytest.CaptureFixture[str], ledger: Ledger, *extra: str) -> tuple[int, str]:
    rc = main(["ledger", "audit", "--db", ledger.url, "--pipeline", PIPE, *extra])
    out, _err = capsys.readouterr()
    return rc, out


def test_the_audit_checks_the_published_outputs(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Item 2: a deleted range directory, a foreign one, a duplicated and a missing data file each
    make ``streamledger ledger audit`` exit 1 naming the directory."""
    s = stream_name("outaudit")
    create_stream(rabbitmq_url, s, 90)
    cfg = config(rabbitmq_url, tmp_path, s, max_offsets=30)
    for n in range(3):
        run_batch(cfg, run=rid("t", run=f"r{n}"), ledger=ledger, broker=client, runner=runner)
    first, second, third = [r for r in ledger.ranges(PIPE) if r.records]
    assert audit_cli(capsys, ledger, "--deep")[0] == 0

    shutil.rmtree(str(first.output))
    rc, out = audit_cli(capsys, ledger)
    assert rc == 1 and "output_missing" in out and str(first.output) in out, out

    manifest = Path(str(second.output), MANIFEST)
    manifest.write_text(manifest.read_text().replace(f'"range_id": {second.id}', '"range_id": 999999'))
    rc, out = audit_cli(capsys, ledger)
    assert rc == 1 and "foreign" in out and str(second.output) in out, out

    data = sorted(p for p in Path(str(third.output)).iterdir() if p.suffix == ".parquet")
    shutil.copy(data[0], data[0].with_name("copy-" + data[0].name))  # a duplicated data file
    rc, out = audit_cli(capsys, ledger)  # the manifest lists the range's files: no data read
    assert rc == 1 and "not in the manifest" in out and str(third.output) in out, out
    data[0].unlink()
    rc, out = audit_cli(capsys, ledger, "--deep")
    assert rc == 1 and "missing" in out and str(third.output) in out, out


def test_a_deleted_and_recreated_stream_is_refused_until_a_new_epoch(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Item 3: the stream is deleted and re-created with 60 records. The next batch refuses in one
    line naming the stream, the ledger's end and the broker's tail, and stores nothing; after
    `streamledger ledger new-epoch` the new stream is read from its first offset."""
    s = stream_name("recreate")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s)
    run_batch(cfg, run=rid("t", run="r1"), ledger=any_ledger, broker=client, runner=runner)
    old_output = next(r.output for r in any_ledger.ranges(PIPE) if r.records)
    assert client.query_offset(s, PIPE) == 99
    client.delete_stream(s)
    client.create_stream(s)
    client.publish(s, [b"new-%d" % i for i in range(60)])
    before = any_ledger.ranges(PIPE)
    with pytest.raises(BatchError) as refused:
        run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    line = str(refused.value)
    assert "\n" not in line and repr(s) in line and "ledger's end 100" in line and "tail 60" in line, line
    assert client.query_offset(s, PIPE) is None
    assert any_ledger.ranges(PIPE) == before

    broker = any_ledger.ranges(PIPE)[0].source.broker
    rc = main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", PIPE, "--stream", s,
               "--broker", broker, "--reason", "stream re-created"])
    assert rc == 0, capsys.readouterr()
    result = run_batch(cfg, run=rid("t", run="r3"), ledger=any_ledger, broker=client, runner=runner)
    assert (result.partitions[0].start, result.partitions[0].records) == (0, 60)
    new_output = result.partitions[0].output
    assert new_output != old_output and Path(str(old_output)).is_dir()
    bodies = sorted(committed_bodies(any_ledger, PIPE))
    assert bodies == sorted([*expected(s, 100), *(b"new-%d" % i for i in range(60))])
    assert client.query_offset(s, PIPE) == 59
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


def test_a_recreated_stream_longer_than_the_old_one_is_refused_too(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Item 3: re-created with more records than the ledger's end: the broker lost the offset the
    ledger stored there, so the batch refuses rather than starting in the middle of the new stream."""
    s = stream_name("recreate-long")
    create_stream(rabbitmq_url, s, 50)
    cfg = config(rabbitmq_url, tmp_path, s)
    run_batch(cfg, run=rid("t", run="r1"), ledger=ledger, broker=client, runner=runner)
    client.delete_stream(s)
    create_stream(rabbitmq_url, s, 120)
    with pytest.raises(BatchError, match=r"no stored offset .* although the ledger stored 49"):
        run_batch(cfg, run=rid("t", run="r2"), ledger=ledger, broker=client, runner=runner)
    assert client.query_offset(s, PIPE) is None
    assert len(ledger.ranges(PIPE)) == 1


class LostReply:
    """A ledger whose commit happens but whose reply is lost (the connection dropped after the
    server committed); ``blind`` also makes the read-back fail once (the database still away)."""

    def __init__(self, inner: Ledger, *, blind: bool) -> None:
        self._inner, self.blind, self.lost = inner, blind, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        self._inner.commit(*args, **kwargs)
        self.lost += 1
        raise LedgerError("commit range: lost the ledger database postgresql://127.0.0.1/x")

    def commit_many(self, *args: Any, **kwargs: Any) -> Any:  # the batch commits its ranges together
        self._inner.commit_many(*args, **kwargs)
        self.lost += 1
        raise LedgerError("commit of ranges: lost the ledger database postgresql://127.0.0.1/x")

    def get(self, range_id: int) -> Any:
        if self.blind:
            self.blind = False
            raise LedgerError(f"read range {range_id}: lost the ledger database postgresql://127.0.0.1/x")
        return self._inner.get(range_id)


@pytest.mark.parametrize("blind", [False, True], ids=["read-back", "blind"])
def test_an_ambiguous_commit_keeps_the_verified_copy(
    blind: bool, postgres_url: str, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path,
) -> None:
    """Item 5: on PostgreSQL a commit succeeded but its reply was lost. The batch reads the range
    back: committed -> it goes on; unreadable -> it fails but keeps the staging copy the ledger
    points at, and the retry publishes it without reading the stream again."""
    s = stream_name("ambiguous")
    create_stream(rabbitmq_url, s, 80)
    cfg = config(rabbitmq_url, tmp_path, s)
    with Ledger(postgres_url, create=True) as real:
        flaky = LostReply(real, blind=blind)
        if not blind:
            result = run_batch(cfg, run=rid("t"), ledger=flaky, broker=client, runner=runner)  # type: ignore[arg-type]
            assert flaky.lost == 1 and result.records == 80
        else:
            with pytest.raises(BatchError, match=r"cannot be read back .* staging copy is kept"):
                run_batch(cfg, run=rid("t"), ledger=flaky, broker=client, runner=runner)  # type: ignore[arg-type]
            (rng,) = [r for r in real.ranges(PIPE) if r.records]
            assert rng.status == RangeStatus.COMMITTED and rng.staging and Path(rng.staging).is_dir()
            reads = runner.calls
            run_batch(cfg, run=rid("t", try_number=2), ledger=real, broker=client, runner=runner)
            assert runner.calls == reads
        assert sorted(committed_bodies(real, PIPE)) == expected(s, 80)
        assert client.query_offset(s, PIPE) == 79
        assert audit(real, PIPE, broker=client).clean


class PausedCopy:
    """A local file system without atomic rename (as on object stores) whose copies into the final
    directory can be held mid-way and are counted per thread."""

    def __init__(self) -> None:
        self.inner = filesystems.LocalFS(atomic_rename=False)
        self.copies: dict[str, int] = {}
        self.hold: threading.Event | None = None
        self.reached = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def copy_file(self, src: str, dst: str) -> None:
        who = threading.current_thread().name
        self.copies[who] = self.copies.get(who, 0) + 1
        self.inner.copy_file(src, dst)
        if self.hold is not None and who == "zombie":
            self.reached.set()
            self.hold.wait(60)


def test_a_zombie_and_its_retry_never_publish_one_range_at_once(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 7: try 1 (a zombie) stalls mid-copy into the final directory; try 2 of the same task
    takes the publish lease over and publishes; the zombie, resuming, stops before its next file
    and cannot record the range published."""
    s = stream_name("zombie")
    create_stream(rabbitmq_url, s, 120)
    paused = PausedCopy()
    monkeypatch.setattr(filesystems, "filesystem_for", lambda location, runner=None: paused)
    cfg = config(rabbitmq_url, tmp_path, s, splits=3)
    paused.hold = threading.Event()
    failure: list[BaseException] = []

    def zombie() -> None:
        try:
            run_batch(cfg, run=rid("t", try_number=1), ledger=any_ledger, broker=client, runner=runner)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=zombie, name="zombie")
    thread.start()
    assert paused.reached.wait(120), "the zombie never reached its publish"
    zombie_copies = paused.copies["zombie"]
    with StreamClient.connect(rabbitmq_url) as own:
        run_batch(cfg, run=rid("t", try_number=2), ledger=any_ledger, broker=own, runner=runner)
    paused.hold.set()
    thread.join(120)
    assert paused.copies["zombie"] == zombie_copies  # stopped before its next file
    assert failure and "lease was taken over" in str(failure[0])
    assert sorted(committed_bodies(any_ledger, PIPE)) == expected(s, 120)
    (rng,) = [r for r in any_ledger.ranges(PIPE) if r.records]
    assert rng.published_at is not None and "\"t\",-1,2]" in str(rng.publisher)
    assert audit(any_ledger, PIPE, broker=client).clean
