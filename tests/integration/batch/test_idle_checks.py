"""Issue 32, item 3: an idle batch asks the broker only what it must. A partition where the batch
writes nothing (no range with offsets, no stored offset) waits with its identity check (the
fingerprint of a committed chunk) for the batch that has something to read; a partition whose new
offsets are only the tracking chunk a StoreOffset wrote is probed once, before the claim. Against the
real RabbitMQ 4.3 broker, local Spark and both ledgers: the broker work counted, a re-created stream
still refused once there is something to read, a producer publishing during the batch never skipped.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchConfig, BatchError, run_batch
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, committed_bodies, config, rid
from tests.integration.batch.test_stream_identity import recreate
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(600)  # four to six batches each, and the Spark session on a busy machine

PIPE = "p-exactly-once"


class Asking:
    """The real stream client, counting the streams each many-stream question names (the fingerprint
    check ``chunks_at``, the probe of a range ``user_records_many``); every call goes through."""

    def __init__(self, client: StreamClient) -> None:
        self._client = client
        self.asked: collections.Counter[str] = collections.Counter()
        self.streams: set[str] = set()

    def chunks_at(self, wanted: Any) -> Any:
        self.asked["chunks_at"] += len(wanted)
        self.streams.update(s for s, _o in wanted)
        return self._client.chunks_at(wanted)

    def chunk_at(self, stream: str, offset: int) -> Any:
        self.asked["chunks_at"] += 1
        self.streams.add(stream)
        return self._client.chunk_at(stream, offset)

    def user_records_many(self, ranges: Any, **kw: Any) -> Any:
        self.asked["user_records_many"] += len(ranges)
        self.streams.update(ranges)
        return self._client.user_records_many(ranges, **kw)

    def read_range(self, stream: str, *a: Any, **kw: Any) -> Any:
        self.asked["read_range"] += 1
        self.streams.add(stream)
        return self._client.read_range(stream, *a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _read_and_stored(ledger: Ledger, client: StreamClient, runner: CountingRunner, url: str, stream_name: Any,
                     tmp_path: Path, label: str, n: int) -> tuple[list[str], BatchConfig]:
    """A super stream of ``n`` partitions of 3 records each, read by a first batch that stored its
    offsets (a tracking chunk at offset 3 of each partition): its partitions and the batch's config."""
    sup = stream_name.super_stream(label)
    client.create_super_stream(sup, partitions=n)
    parts = client.partitions(sup)
    for p in parts:
        client.publish(p, [b"r%d" % i for i in range(3)])
    cfg = BatchConfig(pipeline=PIPE, url=url, output_root=str(tmp_path / "out"), super_stream=sup)
    run_batch(cfg, run=rid("t", run="r1"), ledger=ledger, broker=client, runner=runner)
    assert client.query_offsets(parts, PIPE) == dict.fromkeys(parts, 2)  # tracking chunks at 3
    return parts, cfg


def test_an_idle_batch_checks_and_probes_only_what_it_claims(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    sup = stream_name.super_stream("idle")
    client.create_super_stream(sup, binding_keys=["a", "b", "c"])
    parts = sorted(client.partitions(sup))
    for p in parts:
        publish(rabbitmq_url, p, 5)
    cfg = BatchConfig(pipeline=PIPE, url=rabbitmq_url, output_root=str(tmp_path / "out"), super_stream=sup)
    run_batch(cfg, run=rid("t", run="r1"), ledger=any_ledger, broker=client, runner=runner)
    assert [client.query_offset(p, PIPE) for p in parts] == [4, 4, 4]  # each wrote a tracking chunk at 5

    # idle 1: [5, 6) of each partition is the tracking chunk only: probed once, no fingerprint check
    asking = Asking(client)
    first = run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=asking, runner=runner)
    assert [(r.start, r.end, r.records) for r in first.partitions] == [(5, 6, 0)] * 3
    assert asking.asked == {"user_records_many": 3}, asking.asked
    # idle 2: nothing new anywhere: no question about the streams' data at all
    asking = Asking(client)
    second = run_batch(cfg, run=rid("t", run="r3"), ledger=any_ledger, broker=asking, runner=runner)
    assert [(r.start, r.end) for r in second.partitions] == [(6, 6)] * 3
    assert asking.asked == {}, asking.asked
    assert runner.calls == 1

    # new records on one partition: its identity is checked before they are read, the others wait
    publish(rabbitmq_url, parts[1], 4, start=5)
    asking = Asking(client)
    third = run_batch(cfg, run=rid("t", run="r4"), ledger=any_ledger, broker=asking, runner=runner)
    assert [(r.start, r.end, r.records) for r in third.partitions] == [(6, 6, 0), (6, 10, 4), (6, 6, 0)]
    # its fingerprint checked, then taken of the chunk committed; its new offsets probed once
    assert asking.asked == {"chunks_at": 2, "read_range": 1}, asking.asked
    assert asking.streams == {parts[1]}
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(
        [*(body(p, i) for p in parts for i in range(5)), *(body(parts[1], i) for i in range(5, 9))])
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


class Frames:
    """Every request the batch writes to the broker, by command (on every connection it opens)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from streamledger.protocol.rabbitmq import constants as c
        from streamledger.protocol.rabbitmq.connection import Connection

        self.sent: collections.Counter[str] = collections.Counter()
        send = Connection.send

        def counting(conn: Connection, frame: Any) -> None:
            view, i = memoryview(bytes(frame)), 0
            while i + 6 <= len(view):
                self.sent[c.command_name(int.from_bytes(view[i + 4:i + 6], "big"))] += 1
                i += 4 + int.from_bytes(view[i:i + 4], "big")
            send(conn, frame)

        monkeypatch.setattr(Connection, "send", counting)


def test_idle_batches_over_many_partitions_ask_each_partition_once(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 32, item 3 (the idle batch at 1,000 partitions): what an idle batch asks the broker,
    counted by command over 24 partitions. The first after a batch that stored its offsets finds a
    tracking chunk past each ledger end: told from the stats and the last user chunk, no
    subscription; the store step asks no stored offset again (nothing of an idle partition moves).
    The next asks each partition's tail and stored offset once, and nothing else per partition."""
    n = 24
    _parts, cfg = _read_and_stored(any_ledger, client, runner, rabbitmq_url, stream_name, tmp_path,
                                   "idle-many", n)

    frames = Frames(monkeypatch)
    first = run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    assert [(r.start, r.end, r.records) for r in first.partitions] == [(3, 4, 0)] * n
    asked = dict(frames.sent)
    assert asked.pop("Subscribe", 0) == 0, frames.sent
    assert asked.pop("QueryOffset") == n, frames.sent  # the survey's; none at the store step
    assert asked.pop("ResolveOffsetSpec") == n, frames.sent  # the last user chunk, behind the tracking chunk
    assert asked.pop("StreamStats") == n, frames.sent  # the survey's tails, whose stats the probe takes
    assert sum(asked.values()) <= 3, frames.sent  # the partitions, the members (Metadata), no StoreOffset

    frames.sent.clear()
    second = run_batch(cfg, run=rid("t", run="r3"), ledger=any_ledger, broker=client, runner=runner)
    assert [(r.start, r.end, r.records) for r in second.partitions] == [(4, 4, 0)] * n
    assert frames.sent == {"Partitions": 1, "StreamStats": n, "QueryOffset": n}, frames.sent
    assert runner.calls == 1
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


def test_a_probe_spread_over_side_connections_reads_records_published_right_after_the_store(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 44: the first idle batch's probe of many partitions (the last user chunk of each, one
    ResolveOffsetSpec per partition) is spread over side connections (``StreamClient.spread_at``,
    lowered here from 256 so 24 partitions spread over four connections). Each partition is asked once
    over all of them; a partition where a record was published right after the first batch's store
    (behind its tracking chunk) is read, the others commit their tracking chunk: nothing skipped."""
    n = 24
    parts, cfg = _read_and_stored(any_ledger, client, runner, rabbitmq_url, stream_name, tmp_path,
                                  "idle-spread", n)
    late = parts[1::5]
    for p in late:
        client.publish(p, [b"late"])  # a user chunk at 4, right behind the tracking chunk

    client.spread_at = 8
    frames = Frames(monkeypatch)  # every connection's requests
    first = run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    assert len(client.last_side) == 3
    assert [(r.stream, r.start, r.end, r.records) for r in first.partitions] == [
        (p, 3, 5, 1) if p in late else (p, 3, 4, 0) for p in parts]
    assert frames.sent["ResolveOffsetSpec"] == n, frames.sent  # each partition once, over four connections
    second = run_batch(cfg, run=rid("t", run="r3"), ledger=any_ledger, broker=client, runner=runner)
    assert all(r.records == 0 for r in second.partitions)
    want = [*(b"r%d" % i for _p in parts for i in range(3)), *(b"late" for _p in late)]
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(want)
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


@pytest.mark.parametrize("length", [100, 150])
def test_a_recreated_stream_holding_the_old_stored_offset_is_refused_once_there_is_something_to_read(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, length: int,
) -> None:
    """The hardest case for a skipped check: the new stream carries the stored offset the old one had
    (another consumer of the reference stored it), so only the data tells the streams apart. Of the
    same length, its new offsets are a tracking chunk: the idle batch reads and stores nothing, as if
    it had not run, and the first batch with something to read refuses; longer, it refuses at once.
    Nothing of the new stream is read into the old history."""
    s = stream_name(f"recreated-{length}")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s)
    run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    recreate(client, s, length)
    client.store_offset_verified(s, PIPE, 99)
    if length == 100:
        idle = run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
        assert [(r.start, r.end, r.records) for r in idle.partitions] == [(100, 101, 0)]
        publish(rabbitmq_url, s, 10, start=0)
    with pytest.raises(BatchError, match=rf"stream {s!r}: .*chunk at offset \d+ is not the one .*new-epoch"):
        run_batch(cfg, run=rid("t", run="r3"), ledger=any_ledger, broker=client, runner=runner)
    assert [(r.start, r.end) for r in any_ledger.ranges(PIPE) if r.records] == [(0, 100)]
    assert client.query_offset(s, PIPE) == 99
    with pytest.raises(BatchError, match="replaced"):  # remembered, as every refusal is
        run_batch(cfg, run=rid("t", run="r4"), ledger=any_ledger, broker=client, runner=runner)


def test_a_recreated_stream_without_the_stored_offset_is_refused_even_when_idle(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Re-created with as many records as the ledger read (its tail at the ledger's end): the stored
    offset the ledger recorded is missing, so the batch is no idle one and refuses."""
    s = stream_name("recreated-same")
    create_stream(rabbitmq_url, s, 100)
    cfg = config(rabbitmq_url, tmp_path, s)
    run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    run_batch(cfg, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)  # [100, 101)
    recreate(client, s, 101)
    with pytest.raises(BatchError, match=rf"stream {s!r}: .*no stored offset.*new-epoch"):
        run_batch(cfg, run=rid("t", run="r3"), ledger=any_ledger, broker=client, runner=runner)
    assert client.query_offset(s, PIPE) is None


@pytest.mark.parametrize("after", ["planned", "probed"])
def test_a_producer_publishing_during_an_idle_batch_is_read_by_the_next(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, after: str,
) -> None:
    """The tail an idle batch observed bounds what it claims: records published after it (before
    the claim, or between the claim and the commit of a tracking-only range) are past that tail and
    read by the next batch, after its identity check; none is skipped or read twice."""
    s = stream_name(f"producer-{after}")
    create_stream(rabbitmq_url, s, 20)
    cfg = config(rabbitmq_url, tmp_path, s)
    run_batch(cfg, run=rid("t"), ledger=any_ledger, broker=client, runner=runner)
    published = 20

    def produce(name: str, _batch: Any) -> None:
        nonlocal published
        if name == after:
            publish(rabbitmq_url, s, 7, start=published)
            published += 7

    for n in (2, 3):  # first the tracking-only range [20, 21), then nothing new
        run_batch(cfg, run=rid("t", run=f"r{n}"), ledger=any_ledger, broker=client, runner=runner,
                  on_step=produce)
    asking = Asking(client)
    run_batch(cfg, run=rid("t", run="r4"), ledger=any_ledger, broker=asking, runner=runner)
    assert asking.asked["chunks_at"] >= 1, asking.asked
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(body(s, i) for i in range(published))
    report = audit(any_ledger, PIPE, broker=client)
    assert report.clean, report.to_text()


def test_an_idle_partition_whose_ledger_moves_during_the_batch_is_checked_before_it_is_read(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Between the batch's survey (nothing to do) and its claim, records arrive and another run
    claims and fails them: the claim redoes that failed range past the tail the batch saw, so the
    identity check it skipped is made before anything is read."""
    s = stream_name("moved")
    create_stream(rabbitmq_url, s, 20)
    cfg = config(rabbitmq_url, tmp_path, s)
    run_batch(cfg, run=rid("t"), ledger=ledger, broker=client, runner=runner)
    run_batch(cfg, run=rid("t", run="r2"), ledger=ledger, broker=client, runner=runner)  # [20, 21)
    src = ledger.ranges(PIPE)[0].source

    def other_run(name: str, _batch: Any) -> None:
        if name == "planned":
            publish(rabbitmq_url, s, 5, start=20)
            other = ledger.claim(PIPE, src, 26, rid("other"))
            ledger.fail(other.id, "the other run died")

    asking = Asking(client)
    done = run_batch(cfg, run=rid("t", run="r3"), ledger=ledger, broker=asking, runner=runner,
                     on_step=other_run)
    assert [(r.start, r.end, r.records) for r in done.partitions] == [(21, 26, 5)]
    # checked late, the range probed after the claim (as any claimed range), the commit's fingerprint
    assert asking.asked == {"chunks_at": 2, "read_range": 1}, asking.asked
    assert sorted(committed_bodies(ledger, PIPE)) == sorted(body(s, i) for i in range(25))
