"""Two genuinely different brokers (the 4.3 and 4.0 servers) with a stream of
one name each, fed by one producer that fans every batch out to both (mirrored clusters). A chunk
print is (first offset, timestamp in ms, CRC of the records): the same records written in the same
millisecond at the same offset give the same print on both brokers (measured on loopback: 25 of 40
single-message fan-outs). ``one_broker`` then takes the two brokers for one, and no chunk can tell
them apart, so the cure is the operator's verdict (``streamledger ledger distinct-brokers``): the
refusal and the audit name it, and after it batches on both brokers run and the audit is CLEAN.
Real brokers, local Spark, both ledgers."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch import BatchError, run_batch
from streamledger.batch.proof import audit
from streamledger.offsets import ChunkPrint
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.sources import source_identity
from tests.integration.batch.helpers import CountingRunner, committed_bodies, config, rid
from tests.integration.spark.helpers import body

pytestmark = pytest.mark.timeout(300)

PIPE = "p-s12-twins"


def _require(ok: bool, what: object) -> None:
    if not ok:
        raise RuntimeError(f"scenario broken: {what}")


def _fan_out(logs: list[StreamClient], s: str, messages: list[bytes]) -> None:
    """One producer writing the same batch to both brokers at once."""
    bar = threading.Barrier(len(logs))

    def send(log: StreamClient) -> None:
        bar.wait()
        got = log.publish(s, messages, batch_size=len(messages), application_properties={"source": "fan-out"})
        _require(got.confirmed == len(messages), got)

    threads = [threading.Thread(target=send, args=(log,)) for log in logs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _twin_stream(logs: list[StreamClient]) -> str:
    """A stream of one name on both brokers whose first chunk has one print on both (a few tries)."""
    for _ in range(30):
        s = f"s12-twins-{uuid.uuid4().hex[:8]}"
        for log in logs:
            log.create_stream(s)
        _fan_out(logs, s, [body(s, i) for i in range(3)])
        # one print on both for the first chunk and for the one holding the last record (the chunk a
        # commit fingerprints): under load a broker may cut the three records into two chunks
        prints = {(ChunkPrint.of(log.chunk_at(s, 0)), ChunkPrint.of(log.chunk_at(s, 2))) for log in logs}
        if len(prints) == 1:
            return s
        for log in logs:
            log.delete_stream(s)
    raise RuntimeError("scenario broken: no fan-out gave one print on both brokers in 30 tries")


def test_two_mirrored_brokers_fed_by_one_producer_run_once_the_operator_judges_them_distinct(
    any_ledger: Any, runner: CountingRunner, broker_43: Any, broker_40: Any, tmp_path: Path,
) -> None:
    """A chunk print cannot tell a mirror from one broker under a second name: the batch under the
    second broker is refused and the refusal names both cures. After the operator's verdict
    (``distinct-brokers``) batches on both run, now and later, and the audit given both is CLEAN."""
    logs = [StreamClient.connect(b.url) for b in (broker_43, broker_40)]
    s = ""
    try:
        s = _twin_stream(logs)
        east, west = (source_identity(b.url, log.cluster_name)
                      for b, log in zip((broker_43, broker_40), logs, strict=True))
        _require(east != west, (east, west))

        urls = (broker_43.url, broker_40.url)

        def batch(i: int, run: str) -> Any:
            return run_batch(config(urls[i], tmp_path, s, pipeline=PIPE), run=rid("t", run=run),
                             ledger=any_ledger, broker=logs[i], runner=runner)

        assert batch(0, "e1").records == 3
        with pytest.raises(BatchError, match="distinct-brokers") as refused:
            batch(1, "w1")
        assert "rename-broker" in str(refused.value) and "\n" not in str(refused.value)
        judged = any_ledger.record_distinct_brokers(east, west, pipeline=PIPE, why="mirrored clusters")
        assert len(judged) == 1
        assert batch(1, "w2").records == 3
        _fan_out(logs, s, [body(s, i) for i in range(3, 5)])
        assert batch(0, "e2").records == 2 and batch(1, "w3").records == 2
        kept = any_ledger.same_broker(PIPE)
        assert sorted((r.source.broker, r.other, r.distinct) for r in kept) == sorted(
            [(east, west, True), (west, east, True)])
        assert sorted(committed_bodies(any_ledger, PIPE)) == sorted(2 * [body(s, i) for i in range(5)])
        report = audit(any_ledger, PIPE, broker={east: logs[0], west: logs[1]})
        assert report.clean, report.to_text()
    finally:
        for log in logs:
            if s:
                log.delete_stream(s)
            log.close()


def test_the_audit_given_two_mirrored_brokers_names_the_verdict_and_is_clean_after_it(
    any_ledger: Any, runner: CountingRunner, broker_43: Any, broker_40: Any, tmp_path: Path,
) -> None:
    """Both first batches claim before either has a print, so both run; the audit given both
    brokers finds them one by the print and names both cures; after the operator's verdict it is
    CLEAN, records nothing as one broker, and later batches on both run."""
    logs = [StreamClient.connect(b.url) for b in (broker_43, broker_40)]
    s = ""
    try:
        s = _twin_stream(logs)
        urls = (broker_43.url, broker_40.url)
        east, west = (source_identity(b.url, log.cluster_name)
                      for b, log in zip((broker_43, broker_40), logs, strict=True))

        def batch(i: int, run: str, on_step: Any = None) -> Any:
            return run_batch(config(urls[i], tmp_path, s, pipeline=PIPE), run=rid("t", run=run),
                             ledger=any_ledger, broker=logs[i], runner=runner, on_step=on_step)

        def meanwhile(step: str, _batch: Any) -> None:
            if step == "claimed":  # both first batches claim before either has a print
                _require(batch(1, "w1").records == 3, "west's first batch")

        _require(batch(0, "e1", meanwhile).records == 3, "east's first batch")
        given = {east: logs[0], west: logs[1]}
        before = audit(any_ledger, PIPE, broker=given)
        assert not before.clean and "distinct-brokers" in before.to_text(), before.to_text()
        assert len(any_ledger.record_distinct_brokers(east, west, pipeline=PIPE, stream=s)) == 1
        report = audit(any_ledger, PIPE, broker=given)
        assert report.clean, report.to_text()
        assert all(r.distinct for r in any_ledger.same_broker(PIPE))
        _fan_out(logs, s, [body(s, 3)])
        assert batch(0, "e2").records == 1 and batch(1, "w2").records == 1
        assert audit(any_ledger, PIPE, broker=given).clean
    finally:
        for log in logs:
            if s:
                log.delete_stream(s)
            log.close()
