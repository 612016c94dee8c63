"""``nodes=`` and the broker identity. The ledger files a pipeline's history under the
cluster name the broker reports. A RabbitMQ cluster without a configured ``cluster_name`` reports a
name made from the answering node's own name (``<node prefix>@<its host>``: on the loopback 4.3
broker ``rabbitmqctl eval 'rabbit_runtime_parameters:value_global(cluster_name)'`` answers
``not_found`` while the stream protocol reports ``rabbit43@vm``), so each node of such a cluster
names itself differently. With ``nodes=``, which node answers depends on which one is up: the same
URL then files the same streams under two identities, each with a history of its own, and a batch
through the other node starts its history anew (after the stored offset, which lags the ledger; or,
on a pinned interval, at the interval's start) and reads again what the first identity read, while
the audit of each identity says CLEAN.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from streamledger.batch import BatchError, StreamReplaced, run_batch
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, SourceRef
from streamledger.ledger.types import retired_broker
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.sources import source_identity
from tests.integration.batch.helpers import CountingRunner, committed_bodies, config, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPE = "p-exactly-once"


def test_nodes_fallback_under_a_node_default_cluster_name_is_refused_before_any_claim(
    any_ledger: Ledger, runner: CountingRunner, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
) -> None:
    s = stream_name("nodes-identity")
    create_stream(rabbitmq_url, s, 10)
    port = urlsplit(rabbitmq_url).port
    down = rabbitmq_url.replace(f":{port}", ":1")  # the URL's own node is down: the fallback answers
    url = down + ("&" if "?" in down else "?") + f"nodes=127.0.0.1:{port}"
    with StreamClient.connect(url) as via:
        reported = via.cluster_name
        assert reported is not None and "@" in reported  # RabbitMQ's per-node default, none configured
        with pytest.raises(BatchError, match=r"cluster_name|broker_name"):
            run_batch(config(url, tmp_path, s), run=rid("t"), ledger=any_ledger, broker=via, runner=runner)
    assert any_ledger.ranges(PIPE) == []



@contextmanager
def _parked(ledger: Ledger, identity: str) -> Iterator[None]:
    """While inside, ``identity``'s history is filed under a retired epoch's name, which neither the
    claim nor the audit compares: the ledger a batch from before the claim-time refusal wrote."""
    parked = retired_broker(identity, 99)
    ledger.rename_broker(identity, parked, pipeline=PIPE)
    try:
        yield
    finally:
        ledger.rename_broker(parked, identity, pipeline=PIPE)


def _failover_and_back(ledger: Ledger, client: StreamClient, runner: CountingRunner, url: str, s: str,
                       root: Path, *, unchecked: bool = False) -> tuple[list[bytes], list[BatchError]]:
    """Batch 1 through node 1, batch 2 while node 1 is down (the fallback node answers under its own
    default cluster name: one loopback broker answers under a second name only when it is given one,
    here as ``broker_name``; the rest is the real path), batch 3 through node 1 again, batch 4 while
    it is down again. The bodies a reader of the outputs sees, and the refusals. ``unchecked``: each
    batch runs with the other identity's history parked (:func:`_parked`), as before the refusal."""
    create_stream(url, s, 10)
    own = config(url, root, s)
    node2 = config(url, root, s, broker_name="rabbit2@node2")  # what node 2 reports of itself
    names = (source_identity(url, client.cluster_name), source_identity(url, "rabbit2@node2"))
    refused: list[BatchError] = []

    def batch(cfg: Any, other: str, run: str) -> None:
        with _parked(ledger, other) if unchecked else nullcontext():
            try:
                run_batch(cfg, run=rid("t", run=run), ledger=ledger, broker=client, runner=runner)
            except BatchError as exc:
                refused.append(exc)

    batch(own, names[1], "r1")
    publish(url, s, 10, start=10)
    batch(node2, names[0], "r2")
    publish(url, s, 5, start=20)
    batch(own, names[1], "r3")
    batch(node2, names[0], "r4")
    return sorted(committed_bodies(ledger, PIPE)), refused


def test_offsets_read_under_two_names_of_one_broker_are_no_clean_audit(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """The audit must never say CLEAN while the outputs hold an offset twice. Before: CLEAN with 40
    records in the outputs for 25 offsets ([10, 25) under both identities), SQLite and PostgreSQL.
    The batch now refuses the second name before it claims: the doubled ledger is one an earlier
    version wrote (each batch run with the other identity's history parked)."""
    s = stream_name("nodes-audit")
    got, refused = _failover_and_back(any_ledger, client, runner, rabbitmq_url, s, tmp_path, unchecked=True)
    assert refused == [] and len(got) == 40  # the doubling an earlier version wrote
    report = audit(any_ledger, PIPE, broker=client)
    assert not report.clean, f"the audit says CLEAN with {len(got)} records in the outputs for 25 offsets"
    doubled = sorted((v.start, v.end) for v in report.violations if v.kind.value == "overlap")
    assert len(doubled) == 2 and doubled[0][0] == 10 and doubled[1][1] >= 25, report.to_text()
    # as `streamledger ledger audit --broker-url` gives it: the URL's server under the name it answers to
    own = {source_identity(rabbitmq_url, client.cluster_name): client}
    report = audit(any_ledger, PIPE, broker=own)
    assert not report.clean, f"the audit says CLEAN with {len(got)} records in the outputs for 25 offsets"
    assert [v.kind.value for v in report.violations].count("overlap") == 2, report.to_text()


def test_a_failover_and_back_under_per_node_cluster_names_reads_no_offset_twice(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Before: 40 records in the outputs for 25 offsets, each identity's history whole on its own.
    Now the batches through the second name are refused before they claim; node 1's go on."""
    s = stream_name("nodes-failover")
    got, refused = _failover_and_back(any_ledger, client, runner, rabbitmq_url, s, tmp_path)
    assert got == sorted(body(s, i) for i in range(25)), f"{len(got)} records in the outputs for 25 offsets"
    own = source_identity(rabbitmq_url, client.cluster_name)
    node2 = source_identity(rabbitmq_url, "rabbit2@node2")
    assert len(refused) == 2
    for exc in refused:
        text = str(exc)
        assert "\n" not in text and s in text and own in text and node2 in text, text
        assert "broker_name" in text and "cluster_name" in text, text
    assert {r.source.broker for r in any_ledger.ranges(PIPE)} == {own}  # nothing claimed under node 2
    assert audit(any_ledger, PIPE, broker=client).clean


def test_two_broker_names_given_for_one_broker_are_refused_before_any_claim(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """Two explicit ``broker_name`` s for one broker: the second is refused in one line naming the stream
    and both identities, nothing claimed or stored under it; the first goes on where it stopped."""
    s = stream_name("two-names")
    create_stream(rabbitmq_url, s, 20)
    east = config(rabbitmq_url, tmp_path, s, broker_name="east")
    west = config(rabbitmq_url, tmp_path, s, broker_name="west")
    run_batch(east, run=rid("t", run="r1"), ledger=any_ledger, broker=client, runner=runner)
    stored = client.query_offset(s, PIPE)
    publish(rabbitmq_url, s, 10, start=20)
    calls = runner.calls
    with pytest.raises(BatchError) as caught:
        run_batch(west, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    text = str(caught.value)
    assert "\n" not in text and repr(s) in text, text
    assert "rabbitmq://east/%2F" in text and "rabbitmq://west/%2F" in text, text
    assert runner.calls == calls and client.query_offset(s, PIPE) == stored
    assert {r.source.broker for r in any_ledger.ranges(PIPE)} == {"rabbitmq://east/%2F"}
    run_batch(east, run=rid("t", run="r3"), ledger=any_ledger, broker=client, runner=runner)
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(body(s, i) for i in range(30))
    assert audit(any_ledger, PIPE, broker=client).clean


def test_two_brokers_with_streams_of_one_name_are_not_one_broker(
    any_ledger: Ledger, runner: CountingRunner, broker_43: Any, broker_40: Any, stream_name: Any,
    tmp_path: Path,
) -> None:
    """One pipeline reads a stream of one name on the 4.3 and on the 4.0 server, batch after batch:
    each history's chunks are on its own broker only, so neither is refused, and the audit given both
    brokers is clean."""
    s = stream_name("two-brokers")
    brokers = {b.url: StreamClient.connect(b.url) for b in (broker_43, broker_40)}
    try:
        for url in brokers:
            create_stream(url, s, 10)
        for n in range(2):
            for i, (url, log) in enumerate(brokers.items()):
                if n:
                    publish(url, s, 5, start=10)
                run_batch(config(url, tmp_path, s), run=rid("t", run=f"r{n}-{i}"), ledger=any_ledger,
                          broker=log, runner=runner)
        named = {source_identity(url, log.cluster_name): log for url, log in brokers.items()}
        assert len(named) == 2 and {r.source.broker for r in any_ledger.ranges(PIPE)} == set(named)
        assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(2 * [body(s, i) for i in range(15)])
        report = audit(any_ledger, PIPE, broker=named)
        assert report.clean, report.to_text()
    finally:
        for log in brokers.values():
            log.close()


def test_a_second_name_on_a_pinned_interval_is_refused_before_any_claim(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """A pinned run (an Airflow data interval) under a second name of the broker would read its interval
    at the interval's start, again: refused before it claims, nothing under the second name."""
    s = stream_name("two-names-pinned")
    create_stream(rabbitmq_url, s)
    start = datetime.now(UTC)
    time.sleep(0.3)
    publish(rabbitmq_url, s, 20, batch_size=10)
    time.sleep(0.6)
    end = datetime.now(UTC)
    time.sleep(0.6)
    publish(rabbitmq_url, s, 5, start=20)  # after the interval: its end is resolvable now

    def pinned(name: str) -> Any:
        return config(rabbitmq_url, tmp_path, s, broker_name=name, interval_start=start, interval_end=end,
                      bound_by_interval=True, interval_grace=5.0)

    got = run_batch(pinned("east"), run=rid("t", run="i1"), ledger=any_ledger, broker=client, runner=runner)
    assert [(p.start, p.records) for p in got.partitions] == [(0, 20)]
    with pytest.raises(BatchError, match=r"rabbitmq://east/%2F.*rabbitmq://west/%2F|rabbitmq://west/%2F.*east"):
        run_batch(pinned("west"), run=rid("t", run="i1-west"), ledger=any_ledger, broker=client,
                  runner=runner)
    assert {r.source.broker for r in any_ledger.ranges(PIPE)} == {"rabbitmq://east/%2F"}
    assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(body(s, i) for i in range(20))


def test_a_new_epoch_under_one_name_is_compared_and_the_retired_one_is_not(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """The stream re-created: the old epoch's chunks are gone, so its history never refuses a name;
    the new epoch's history under east makes west one broker under two names again."""
    s = stream_name("two-names-epoch")
    create_stream(rabbitmq_url, s, 10)
    east = config(rabbitmq_url, tmp_path, s, broker_name="east")
    west = config(rabbitmq_url, tmp_path, s, broker_name="west")
    run_batch(east, run=rid("t", run="r1"), ledger=any_ledger, broker=client, runner=runner)
    client.delete_stream(s)
    client.create_stream(s)
    client.publish(s, [b"new-%d" % i for i in range(7)])
    with pytest.raises(StreamReplaced):
        run_batch(east, run=rid("t", run="r2"), ledger=any_ledger, broker=client, runner=runner)
    any_ledger.new_epoch(PIPE, SourceRef("rabbitmq://east/%2F", s), reason="re-created")
    run_batch(east, run=rid("t", run="r3"), ledger=any_ledger, broker=client, runner=runner)
    with pytest.raises(BatchError) as caught:
        run_batch(west, run=rid("t", run="r4"), ledger=any_ledger, broker=client, runner=runner)
    assert "#epoch" not in str(caught.value) and "rabbitmq://east/%2F" in str(caught.value)
    assert not any(r.source.broker.startswith("rabbitmq://west/") for r in any_ledger.ranges(PIPE))
    assert audit(any_ledger, PIPE, broker=client).clean


def test_two_first_batches_under_two_names_that_race_are_no_clean_audit(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """What the claim-time refusal cannot see: a batch under a second name that surveys while the
    first name's first batch is between its claim and its commit (no print yet). The audit finds it."""
    s = stream_name("two-names-race")
    create_stream(rabbitmq_url, s, 10)
    east = config(rabbitmq_url, tmp_path, s, broker_name="east")
    west = config(rabbitmq_url, tmp_path, s, broker_name="west")

    def meanwhile(step: str, _batch: Any) -> None:
        if step == "claimed":
            run_batch(west, run=rid("t", run="w1"), ledger=any_ledger, broker=client, runner=runner)

    run_batch(east, run=rid("t", run="e1"), ledger=any_ledger, broker=client, runner=runner,
              on_step=meanwhile)
    assert len(committed_bodies(any_ledger, PIPE)) == 20
    report = audit(any_ledger, PIPE, broker=client)
    assert [v.kind.value for v in report.violations].count("overlap") == 1, report.to_text()
    for cfg, name in ((west, "w2"), (east, "e2")):  # from now on each name is refused: one must go
        with pytest.raises(BatchError, match="one broker under two names"):
            run_batch(cfg, run=rid("t", run=name), ledger=any_ledger, broker=client, runner=runner)
