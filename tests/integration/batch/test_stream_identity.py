"""Issue 30, defects 3, 8 and 9: which stream a history belongs to. Against the real RabbitMQ 4.3
broker, local Spark and both ledgers (SQLite and PostgreSQL):

* 3: a re-created stream is told apart by its data (a fingerprint of a committed chunk), also when
  the ledger never stored a broker offset;
* 8: one broker identity whatever the URL's spelling of the virtual host, and histories recorded
  under another spelling adopted, never forked;
* 9: ``ledger new-epoch`` never strands committed but unpublished ranges of the old history.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchError, run_batch
from streamledger.batch.proof import audit
from streamledger.cli import main
from streamledger.ledger import Ledger, LedgerError, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, Killed, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPE = "p-exactly-once"


def die_after(step: str) -> Any:
    def hook(name: str, _batch: Any) -> None:
        if name == step:
            raise Killed(f"SIGKILL after {step}")

    return hook


def recreate(client: StreamClient, stream: str, count: int) -> None:
    """Delete the stream and create it again with ``count`` records other than the old ones."""
    client.delete_stream(stream)
    client.create_stream(stream)
    client.publish(stream, [b"new-%d" % i for i in range(count)])


def vhost_url(url: str, spelling: str) -> str:
    """The broker URL with the default virtual host spelled ``spelling`` (``%2F``, ``%2f``, empty)."""
    return url.rstrip("/") + "/" + spelling


# -- 3: a re-created stream, told apart by its data ---------------------------------------------


def test_a_stream_recreated_after_a_batch_died_before_storeoffset_is_refused(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Defect 3 (the issue's reproduction): the first batch publishes [0, 100) and dies before
    StoreOffset, so the ledger never stored an offset; the stream is re-created with 150 records.
    The retry must refuse in one line naming the stream and `new-epoch`, storing nothing, rather
    than store the old watermark (99) on the new stream; after `new-epoch` all 150 are read."""
    s = stream_name("died-before-store")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s)
    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner,
                  on_step=die_after("published"))
    assert client.query_offset(s, PIPE) is None
    recreate(client, s, 150)
    before = any_ledger.ranges(PIPE)
    with pytest.raises(BatchError) as refused:
        run_batch(cfg, run=rid("t", try_number=2), ledger=any_ledger, broker=client, runner=runner)
    line = str(refused.value)
    assert "\n" not in line and repr(s) in line and "new-epoch" in line, line
    assert client.query_offset(s, PIPE) is None
    assert any_ledger.ranges(PIPE) == before

    broker = before[0].source.broker
    assert main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", PIPE, "--stream", s,
                 "--broker", broker, "--reason", "re-created"]) == 0
    result = run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    assert (result.partitions[0].start, result.partitions[0].records) == (0, 150)
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(
        [*(body(s, i) for i in range(100)), *(b"new-%d" % i for i in range(150))])
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


def test_a_recreated_stream_of_a_pipeline_that_never_stores_offsets_is_refused(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Defect 3 with ``store_offset=False``: no stored offset on either side, the new stream longer
    than the old: the next batch must not read [100, 150) of the new stream and skip [0, 100)."""
    s = stream_name("no-store")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s, store_offset=False)
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    recreate(client, s, 150)
    with pytest.raises(BatchError, match=rf"stream {s!r}: .*new-epoch"):
        run_batch(cfg, run=rid("t", run="r2"), ledger=ledger, broker=client, runner=runner)
    assert [(r.start, r.end) for r in ledger.ranges(PIPE) if r.records] == [(0, 100)]


def test_the_audit_reports_a_recreated_stream_holding_the_old_stored_offset(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Defect 3 in the audit: the new stream carries the stored offset the old one had (an older
    batch stored the old watermark on it, or another consumer of the same reference did): stored
    offsets and tails agree with the ledger, only the data tells the streams apart."""
    s = stream_name("audit-recreated")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s)
    run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    assert audit(any_ledger, PIPE, broker=client).clean
    recreate(client, s, 150)
    client.store_offset_verified(s, PIPE, 99)
    report = audit(any_ledger, PIPE, broker=client)
    assert not report.clean, "the audit is CLEAN on a re-created stream"
    found = [v for v in report.violations if v.stream == s and v.kind.value == "stream_replaced"]
    assert found and "new-epoch" in found[0].detail, report.to_text()


def test_a_new_epoch_records_the_old_streams_unread_tail_lost(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """The checker's `missing-before-recreate`: the stream held [0, 100) when a batch saw it; the
    pipeline committed [0, 40), a second run claimed [40, 80) and died; then the stream was deleted
    and re-created. Nobody can read [40, 100) any more, yet only the failed claim's span was
    recorded lost by `new-epoch` and [80, 100) vanished with the audit CLEAN. The ledger keeps the
    greatest tail a batch saw, and the new epoch records everything from the history's end up to it
    as lost, naming the re-created stream (audit rule 1)."""
    s = stream_name("epoch-unread-tail")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s, max_offsets=40)
    run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner,
                  on_step=die_after("claimed"))
    assert len(any_ledger.release_stale(timedelta(0), pipeline=PIPE)) == 1
    tail = client.committed_tail(s)  # past the 100 records (the stored offset's tracking chunk)
    assert tail >= 100
    recreate(client, s, 30)
    [src] = {r.source for r in any_ledger.ranges(PIPE)}
    any_ledger.new_epoch(PIPE, src, reason="re-created")
    retired = sorted((r.start, r.end, r.status.value) for r in any_ledger.ranges(PIPE)
                     if r.source.broker != src.broker and r.status != RangeStatus.FAILED)
    assert retired == [(0, 40, "committed"), (40, tail, "lost")], retired
    [lost] = [r for r in any_ledger.ranges(PIPE) if r.status == RangeStatus.LOST]
    assert "re-created" in (lost.error or ""), lost
    run_batch(cfg, run=rid("t", run="r3"), ledger=any_ledger, broker=client, runner=runner)
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


def test_a_stream_recreated_while_its_first_claim_was_open_is_told_apart_from_the_old_one(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """The first batch claims [0, 100) and dies before its job; the stream is deleted and re-created
    with 150 other records. The next batch must not take the new stream's [0, 100) for the old one's:
    it refuses (the stream was replaced: `new-epoch`), or the old records end up recorded lost, and
    never does the audit say CLEAN over 100 records nobody read."""
    s = stream_name("recreated-open-claim")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s)
    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner,
                  on_step=die_after("claimed"))
    recreate(client, s, 150)
    assert len(any_ledger.release_stale(timedelta(0), pipeline=PIPE)) == 1
    try:
        run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    except BatchError as refused:
        assert "new-epoch" in str(refused), refused
        return
    read = sorted(committed_bodies(any_ledger, PIPE))
    old_lost = [r for r in any_ledger.ranges(PIPE) if r.status == RangeStatus.LOST and r.start == 0]
    report = audit(any_ledger, PIPE, broker=client)
    assert old_lost or not report.clean, (read[:3], report.to_text())


def test_the_audit_finds_a_stream_recreated_under_a_history_that_only_claimed(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """The first batch claims [0, 100) and dies before its job; the stream is re-created with other
    records. Before any batch runs again, the audit given the broker reports the stream replaced
    (from the chunk the claim saw), never CLEAN over 100 records nobody read."""
    s = stream_name("recreated-audit")
    create_stream(rabbitmq_url, s, 100)
    with pytest.raises(Killed):
        run_batch(config(rabbitmq_url, tmp_path, s), run=rid("t"), ledger=any_ledger, broker=client,
                  runner=runner, on_step=die_after("claimed"))
    assert len(any_ledger.release_stale(timedelta(0), pipeline=PIPE)) == 1
    recreate(client, s, 150)
    report = audit(any_ledger, PIPE, broker=client)
    assert "stream_replaced" in {v.kind.value for v in report.violations}, report.to_text()


# -- 8: one identity per broker, whatever the URL's spelling ------------------------------------


def test_three_spellings_of_one_vhost_read_every_record_once(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Defect 8 (the issue's reproduction): the default vhost read as `/%2F`, then `/%2f`, then
    `/`: 100 records give exactly 100 rows, one history, the audit clean."""
    s = stream_name("spellings")
    create_stream(rabbitmq_url, s, 60)
    run_batch(config(vhost_url(rabbitmq_url, "%2F"), tmp_path, s), run=rid("t", run="r1"),
              ledger=any_ledger, broker=client, runner=runner)
    publish(rabbitmq_url, s, 40, start=60)
    for n, spelling in enumerate(["%2f", ""], start=2):
        run_batch(config(vhost_url(rabbitmq_url, spelling), tmp_path, s), run=rid("t", run=f"r{n}"),
                  ledger=any_ledger, broker=client, runner=runner)
    bodies = committed_bodies(any_ledger, PIPE)
    assert len(bodies) == 100 and sorted(bodies) == sorted(body(s, i) for i in range(100))
    assert len({r.source.broker for r in any_ledger.ranges(PIPE)}) == 1
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


def test_a_history_recorded_under_another_spelling_is_adopted(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Defect 8: a history an earlier version recorded under `…/%2f` (raw from the URL) is taken
    over by the next batch, whatever its spelling, and never forked into a second one."""
    s = stream_name("adopt")
    create_stream(rabbitmq_url, s, 60)
    first = run_batch(config(vhost_url(rabbitmq_url, "%2F"), tmp_path, s), run=rid("t", run="r1"),
                      ledger=any_ledger, broker=client, runner=runner)
    old_spelling = first.broker.replace("%2F", "%2f")
    assert old_spelling != first.broker
    assert any_ledger.rename_broker(first.broker, old_spelling, pipeline=PIPE) == 1
    publish(rabbitmq_url, s, 40, start=60)
    run_batch(config(vhost_url(rabbitmq_url, ""), tmp_path, s), run=rid("t", run="r2"),
              ledger=any_ledger, broker=client, runner=runner)
    assert {r.source.broker for r in any_ledger.ranges(PIPE)} == {first.broker}
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(body(s, i) for i in range(100))


def test_the_audit_compares_stored_offsets_whatever_the_spelling_of_the_broker_url(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Defect 8 in the audit: a pipeline recorded through `…/%2F`, audited with `--broker-url …/%2f`,
    has its broker's stored offset compared (here: a wrong one, so the audit must fail), not
    skipped as "not given"."""
    s = stream_name("audit-spelling")
    create_stream(rabbitmq_url, s, 50)
    run_batch(config(vhost_url(rabbitmq_url, "%2F"), tmp_path, s), run=rid("t"),
              ledger=any_ledger, broker=client, runner=runner)
    client.store_offset_verified(s, PIPE, 10)  # BEHIND the ledger's last record 49
    capsys.readouterr()
    rc = main(["ledger", "audit", "--db", any_ledger.url, "--pipeline", PIPE, "--no-outputs", "--json",
               "--broker-url", vhost_url(rabbitmq_url, "%2f")])
    out = capsys.readouterr().out
    report = json.loads(out)
    kinds = {v["kind"] for v in report["violations"]}
    assert rc == 1 and "broker_drift" in kinds, out


# -- 9: a new epoch never strands the old history's unpublished ranges --------------------------


def test_new_epoch_refuses_while_the_old_history_has_unpublished_ranges(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Defect 9: [0, 100) is committed and its run dies before publishing; the stream is re-created.
    `new-epoch` must refuse in one line naming the range (once the old history is retired, no run
    would ever publish it)."""
    s = stream_name("epoch-strand")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s)
    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner,
                  on_step=die_after("committed"))
    [rng] = [r for r in any_ledger.ranges(PIPE) if r.records]
    assert rng.status == RangeStatus.COMMITTED and rng.published_at is None
    recreate(client, s, 60)
    with pytest.raises(LedgerError) as refused:
        any_ledger.new_epoch(PIPE, rng.source, reason="re-created")
    line = str(refused.value)
    assert "\n" not in line and "[0, 100)" in line and repr(s) in line, line
    capsys.readouterr()
    rc = main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", PIPE, "--stream", s,
               "--broker", rng.source.broker])
    err = capsys.readouterr().err
    assert rc != 0 and "[0, 100)" in err, err
    assert any_ledger.positions(PIPE, [rng.source])[0].epoch == 0


def test_a_batch_refusing_a_recreated_stream_publishes_the_old_streams_stranded_ranges(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Defect 9, the way out: the batch that refuses the re-created stream publishes the old
    history's committed ranges from their staging copies first (no read of the new stream), so
    `new-epoch` then goes ahead and nothing is stranded: every record once, the audit clean."""
    s = stream_name("epoch-publish")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s)
    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner,
                  on_step=die_after("committed"))
    recreate(client, s, 60)
    calls = runner.calls
    with pytest.raises(BatchError, match="new-epoch"):  # the scheduler reports the dead run gone
        run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner,
                  holder_alive=lambda _holder: False)
    assert runner.calls == calls  # nothing read from the new stream
    [rng] = [r for r in any_ledger.ranges(PIPE) if r.records]
    assert rng.published_at is not None
    epochs = any_ledger.new_epoch(PIPE, rng.source, reason="re-created")
    assert epochs == (0, 1)
    run_batch(cfg, run=rid("t", run="r3"), ledger=any_ledger, broker=client, runner=runner)
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(
        [*(body(s, i) for i in range(100)), *(b"new-%d" % i for i in range(60))])
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()
