"""One broker under two identities (the claim-time refusal, ``one_broker``)
composed with retention. Two first batches under two names that race past the claim-time check (no
chunk print yet) read the same offsets twice; the audit finds the overlap and both names are refused
while the first name's fingerprinted chunk is on the broker. The refusal and the finding rest on
that chunk alone: once retention rolls it out, nothing in the ledger remembers that the two names are
one broker. Real RabbitMQ 4.3, local Spark, both ledgers; judged by what the outputs hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchError, run_batch
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = pytest.mark.timeout(300)

PIPE = "p-exactly-once"
PAD = b"." * 2_000


def _require(ok: bool, what: object) -> None:
    """A step the scenario needs (not the defect): its failure is an error, never the expected one."""
    if not ok:
        raise RuntimeError(f"scenario broken: {what}")


def _padded(client: StreamClient, s: str, start: int, count: int) -> None:
    got = client.publish(s, [body(s, i) + PAD for i in range(start, start + count)], batch_size=1)
    _require(got.confirmed == count, got)


def test_two_names_of_one_broker_stay_found_after_retention_rolls_out_the_evidence(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("names-retention")
    create_stream(rabbitmq_url, s, 0, max_length_bytes=150_000, max_segment_size_bytes=8_000)
    publish(rabbitmq_url, s, 10)
    east = config(rabbitmq_url, tmp_path, s, broker_name="east")
    west = config(rabbitmq_url, tmp_path, s, broker_name="west")

    def meanwhile(step: str, _batch: Any) -> None:
        if step == "claimed":  # east holds [0, 10) unprinted: west's first batch is not refused
            _padded(client, s, 10, 60)  # 120 kB: west's print stays in the last 150
            run_batch(west, run=rid("t", run="w1"), ledger=any_ledger, broker=client, runner=runner)

    run_batch(east, run=rid("t", run="e1"), ledger=any_ledger, broker=client, runner=runner,
              on_step=meanwhile)
    read = sorted((r.source.broker, r.start, r.end) for r in any_ledger.ranges(PIPE)
                  if r.status == RangeStatus.COMMITTED and r.records)
    _require([(a, b) for _n, a, b in read] == [(0, 10), (0, 70)], read)  # [0, 10) read twice
    before = audit(any_ledger, PIPE, broker=client)  # found while east's chunk is on the broker
    _require([v.kind.value for v in before.violations].count("overlap") == 1, before.to_text())
    try:
        run_batch(west, run=rid("t", run="w2"), ledger=any_ledger, broker=client, runner=runner)
        _require(False, "west's second batch was not refused while east's chunk is there")
    except BatchError as exc:
        _require("one broker under two names" in str(exc), exc)

    sent = 70  # retention rolls out the segment of east's print (offsets below 10), not west's (69)
    while client.first_offset(s) <= 9 and sent < 400:
        _padded(client, s, sent, 3)
        sent += 3
    _require(9 < client.first_offset(s) <= 69, client.first_offset(s))

    # [0, 10) is still in the outputs twice; the audit must still say so (it reports only a broker
    # drift on east's history then, "offsets from 10 are not done", which west did read)
    after = audit(any_ledger, PIPE, broker=client)
    assert [v.kind.value for v in after.violations].count("overlap") == 1, after.to_text()
    with pytest.raises(BatchError, match="one broker under two names"):
        run_batch(west, run=rid("t", run="w3"), ledger=any_ledger, broker=client, runner=runner)


def test_a_refused_second_name_stays_refused_after_retention_rolls_out_the_first_name_s_chunk(
    any_ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    """No race: west is refused at its first claim while east's print is on the broker; east stays
    idle while retention rolls that chunk out. West must still be refused (before: it began a history
    of its own), in one line naming the stream and both names, nothing claimed under it."""
    s = stream_name("names-refused")
    create_stream(rabbitmq_url, s, 0, max_length_bytes=150_000, max_segment_size_bytes=8_000)
    publish(rabbitmq_url, s, 10)
    east = config(rabbitmq_url, tmp_path, s, broker_name="east")
    west = config(rabbitmq_url, tmp_path, s, broker_name="west")
    run_batch(east, run=rid("t", run="e1"), ledger=any_ledger, broker=client, runner=runner)
    try:
        run_batch(west, run=rid("t", run="w1"), ledger=any_ledger, broker=client, runner=runner)
        _require(False, "west's first batch was not refused while east's chunk is there")
    except BatchError as exc:
        _require("one broker under two names" in str(exc), exc)
    sent = 10
    while client.first_offset(s) <= 9 and sent < 400:
        _padded(client, s, sent, 3)
        sent += 3
    _require(client.first_offset(s) > 9, client.first_offset(s))
    calls = runner.calls
    with pytest.raises(BatchError) as caught:
        run_batch(west, run=rid("t", run="w2"), ledger=any_ledger, broker=client, runner=runner)
    text = str(caught.value)
    assert "\n" not in text and repr(s) in text, text
    assert "rabbitmq://east/%2F" in text and "rabbitmq://west/%2F" in text and "rename-broker" in text, text
    assert runner.calls == calls
    assert {r.source.broker for r in any_ledger.ranges(PIPE)} == {"rabbitmq://east/%2F"}
    report = audit(any_ledger, PIPE, broker=client)
    assert [n.kind.value for n in report.notes].count("named_twice") == 1, report.to_text()
