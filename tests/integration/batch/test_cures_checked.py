"""The operator's cures (``ledger skip``, ``ledger new-epoch``) are checked against the broker and the
ledger before they write, so a cure cannot make things worse (issue 43, item 1): a skip past the
broker's committed tail would stall every later batch, and a new epoch of a stream the broker still
holds would read it again. RabbitMQ 4.3, local Spark, both ledgers."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import run_batch
from streamledger.cli import main
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, Killed, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)


def _spans(ledger: Ledger, pipe: str) -> list[tuple[int, int, str]]:
    return [(r.start, r.end, r.status.value) for r in ledger.ranges(pipe)]


def test_a_skip_past_the_brokers_committed_tail_is_refused_and_one_below_it_goes_through(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """[0, 100) committed, the tail at 201: `skip --start 100 --end 1000` is refused in one line naming
    the span and the tail, nothing recorded (before, it was accepted and every later batch refused the
    stream as replaced). `--dry-run` of a span below the tail records nothing; the span itself is
    recorded, and the next batch reads on past it."""
    pipe, s = "p-cure-skip", stream_name("cure-skip")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=pipe)
    run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    publish(rabbitmq_url, s, 101, start=100)
    broker = any_ledger.ranges(pipe)[0].source.broker
    before = _spans(any_ledger, pipe)
    argv = ["ledger", "skip", "--db", any_ledger.url, "--pipeline", pipe, "--stream", s, "--broker", broker,
            "--broker-url", rabbitmq_url, "--reason", "poison"]
    capsys.readouterr()
    rc = main([*argv, "--start", "100", "--end", "1000"])
    err = capsys.readouterr().err
    assert rc != 0 and "[100, 1000)" in err and "committed tail" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert _spans(any_ledger, pipe) == before

    rc = main([*argv, "--start", "100", "--end", "150", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and "dry run" in out and "[100, 150)" in out, out
    assert _spans(any_ledger, pipe) == before

    assert main([*argv, "--start", "100", "--end", "150"]) == 0
    assert (100, 150, RangeStatus.LOST.value) in _spans(any_ledger, pipe)
    result = run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    assert result.partitions[0].start == 150
    read = committed_bodies(any_ledger, pipe)
    assert len(read) == len(set(read)) and body(s, 0) in read and body(s, 200) in read


def test_new_epoch_of_a_stream_the_broker_still_holds_is_refused_unless_forced_with_a_recorded_reason(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """[0, 100) committed and the stream never re-created: `new-epoch` is refused in one line (its
    fingerprinted chunk is still on the broker), nothing changed; before, it retired the history and
    the next batch read [0, 100) again and published it twice. `--force` needs a reason, which the
    ledger records; `--dry-run` changes nothing."""
    pipe, s = "p-cure-epoch", stream_name("cure-epoch")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=pipe)
    run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    broker = any_ledger.ranges(pipe)[0].source.broker
    before = _spans(any_ledger, pipe)
    argv = ["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", pipe, "--stream", s,
            "--broker", broker, "--broker-url", rabbitmq_url]
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "still holds" in err and repr(s) in err and len(err.strip().splitlines()) == 1, err
    assert _spans(any_ledger, pipe) == before
    rc = main([*argv, "--force"])
    err = capsys.readouterr().err
    assert rc == 2 and "--reason" in err, err
    assert main([*argv, "--force", "--reason", "restored from a backup", "--dry-run"]) == 0
    assert "dry run" in capsys.readouterr().out
    assert _spans(any_ledger, pipe) == before
    result = run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    assert result.partitions[0].records == 0  # nothing read again

    assert main([*argv, "--force", "--reason", "restored from a backup"]) == 0
    fresh = [r for r in any_ledger.ranges(pipe) if r.source.broker == broker]
    assert [(r.start, r.end) for r in fresh] == [(0, 0)]
    assert fresh[0].error is not None and "forced: restored from a backup" in fresh[0].error


def test_new_epoch_of_a_stream_the_broker_still_holds_is_refused_when_its_history_only_claimed(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The first batch claims [0, 100) and dies before its job; the claim is released (failed), so the
    history has no live range, only the chunk the claim saw. While the stream is not re-created,
    `new-epoch` is refused in one line (that chunk is still on the broker), nothing changed; once it
    is, the cure goes through and records the old [0, 100) lost. Before:
    the check was skipped for a history without a live range, and the retired history recorded
    [0, 100) lost, "deleted and re-created", while the broker still held every record."""
    pipe, s = "p-cure-claimed", stream_name("cure-claimed")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=pipe)

    def dies(step: str, _batch: Any) -> None:
        if step == "claimed":
            raise Killed("SIGKILL after claimed")

    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner, on_step=dies)
    assert len(any_ledger.release_stale(timedelta(0), pipeline=pipe)) == 1
    broker = any_ledger.ranges(pipe)[0].source.broker
    before = _spans(any_ledger, pipe)
    capsys.readouterr()
    rc = main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", pipe, "--stream", s,
               "--broker", broker, "--broker-url", rabbitmq_url, "--reason", "re-created?"])
    err = capsys.readouterr().err
    assert rc == 2 and "still holds" in err and repr(s) in err and len(err.strip().splitlines()) == 1, err
    assert _spans(any_ledger, pipe) == before
    client.delete_stream(s)  # once the stream is re-created, the chunk tells it apart: the cure goes through
    client.create_stream(s)
    client.publish(s, [b"new-%d" % i for i in range(150)])
    assert main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", pipe, "--stream", s,
                 "--broker", broker, "--broker-url", rabbitmq_url, "--reason", "re-created"]) == 0
    assert sorted((r.start, r.end, r.status.value) for r in any_ledger.ranges(pipe)
                  if r.source.broker != broker) == [(0, 100, "failed"), (0, 100, "lost")]


def test_new_epoch_goes_through_once_retention_took_the_chunk_that_showed_the_stream_recreated(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """The first batch claims [0, 100) and dies; the stream is re-created (with retention) and a batch
    refuses it, its chunk at offset 0 not the one the first claim saw (the mark records that
    difference). Retention then rolls the new stream's first segments out, so the chunk can no
    longer be compared: `new-epoch` still goes through on the recorded difference, not refused as
    "no sign of a re-created stream", which left the pipeline refused for good (model soak seed 209)."""
    from streamledger.batch import StreamReplaced

    pipe, s = "p-cure-retained", stream_name("cure-retained")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=pipe)

    def dies(step: str, _batch: Any) -> None:
        if step == "claimed":
            raise Killed("SIGKILL after claimed")

    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner, on_step=dies)
    assert len(any_ledger.release_stale(timedelta(0), pipeline=pipe)) == 1
    broker = any_ledger.ranges(pipe)[0].source.broker
    client.delete_stream(s)
    client.create_stream(s, max_length_bytes=60_000, max_segment_size_bytes=15_000)
    client.publish(s, [b"new-%d" % i for i in range(150)])
    with pytest.raises(StreamReplaced, match="offset 0"):
        run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    for round_ in range(60):  # padded records until retention has taken the chunk at offset 0
        if client.first_offset(s) > 0:
            break
        client.publish(s, [b"pad-%d-%d-" % (round_, i) + b"x" * 1500 for i in range(20)])
    assert client.first_offset(s) > 0
    assert main(["ledger", "new-epoch", "--db", any_ledger.url, "--pipeline", pipe, "--stream", s,
                 "--broker", broker, "--broker-url", rabbitmq_url, "--reason", "re-created"]) == 0
    assert [(r.start, r.end, r.status.value) for r in any_ledger.ranges(pipe)
            if r.source.broker != broker and r.status == RangeStatus.LOST] == [(0, 100, "lost")]



class FirstOffsetBeforeRetention:
    """The real stream client, except that the stream's first offset is the one it had before
    retention ran: what StreamStats answers between osiris deleting a segment and publishing the new
    first chunk id (``osiris_retention:eval`` sets ``first_chunk_id`` in its callback, after the files
    are gone), or a replica's reader whose retention ran ahead of the stats. Every other call goes
    through."""

    def __init__(self, client: StreamClient, first: int) -> None:
        self._client, self._first = client, first

    def first_offset(self, name: str, **_kw: Any) -> int:
        return self._first

    def first_offsets(self, names: Any) -> dict[str, int]:
        return dict.fromkeys(names, self._first)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_new_epoch_is_refused_on_a_mark_made_when_the_printed_chunk_was_missing_not_another(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """The first batch of a stream with retention (never deleted) claims [0, 100) and dies. Retention
    takes the first-claim chunk; a batch asks in the window where the broker's first offset does not
    show it yet. The chunks, not the statistics, decide: the offset is gone, so the stream is not
    refused as replaced (before: no user chunk at a "retained" offset, a mark with the words of
    another chunk found there). And `new-epoch` is refused ("no sign of a re-created stream"): a new
    epoch would record the live stream's offsets lost."""
    from streamledger.batch import StreamReplaced

    pipe, s = "p-cure-missing", stream_name("cure-missing")
    client.create_stream(s, max_length_bytes=60_000, max_segment_size_bytes=15_000)
    client.publish(s, [b"old-%d" % i for i in range(100)])
    cfg = config(rabbitmq_url, tmp_path, s, pipeline=pipe)

    def dies(step: str, _batch: Any) -> None:
        if step == "claimed":
            raise Killed("SIGKILL after claimed")

    with pytest.raises(Killed):
        run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner, on_step=dies)
    assert len(ledger.release_stale(timedelta(0), pipeline=pipe)) == 1
    broker = ledger.ranges(pipe)[0].source.broker
    for round_ in range(60):  # padded records until retention has taken the chunk at offset 0
        if client.first_offset(s) > 0:
            break
        client.publish(s, [b"pad-%d-%d-" % (round_, i) + b"x" * 1500 for i in range(20)])
    assert client.first_offset(s) > 0
    # the chunks themselves say retention took offset 0, whatever the statistics say: no mark, the
    # batch goes on to retention's loss (on_data_loss='fail' refuses it naming the offsets)
    with pytest.raises(Exception) as refused:
        run_batch(cfg, run=rid("t", run="r2"), ledger=ledger, runner=runner,
                  broker=FirstOffsetBeforeRetention(client, 0))
    assert not isinstance(refused.value, StreamReplaced) and "offset 0" in str(refused.value), refused.value
    [src] = {r.source for r in ledger.ranges(pipe)}
    assert ledger.position(pipe, src).replaced is None
    assert main(["ledger", "new-epoch", "--db", ledger.url, "--pipeline", pipe, "--stream", s,
                 "--broker", broker, "--broker-url", rabbitmq_url, "--reason", "re-created"]) == 2
