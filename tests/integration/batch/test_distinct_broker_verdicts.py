"""The operator's verdict that two broker names are two brokers
(``Ledger.record_distinct_brokers``, ``streamledger ledger distinct-brokers``). A verdict makes the
audit accept two histories of one stream under two names, so it must cover only what it names, stay
against later findings, survive a rename, and be said by the audit that relies on it. Ledger level,
both ledgers (the audit given no broker reads the ledger's records)."""

from __future__ import annotations

import pytest

from streamledger.batch.proof import audit
from streamledger.cli import main
from streamledger.ledger import AuditReport, Ledger, LedgerError, RunIdentity, SourceRef

A, B, C = "rabbitmq://a/%2F", "rabbitmq://b/%2F", "rabbitmq://c/%2F"
PIPE = "p-s12b"


def _commit(led: Ledger, src: SourceRef, end: int, n: int, pipeline: str = PIPE) -> None:
    rng = led.claim(pipeline, src, end, RunIdentity("dag", f"r{n}", "t"), initial_start=0)
    led.commit(rng.id, records=rng.end - rng.start, first_seen=rng.start, last_seen=rng.end - 1,
               output=f"/out/{n}")


def _twice(led: Ledger, stream: str = "s", pipeline: str = PIPE, n: int = 0) -> None:
    """One stream read [0, 10) under A and under B (what one broker under two names leaves)."""
    _commit(led, SourceRef(A, stream), 10, n + 1, pipeline)
    _commit(led, SourceRef(B, stream), 10, n + 2, pipeline)


def _audit(led: Ledger, pipeline: str = PIPE) -> AuditReport:
    return audit(led, pipeline, outputs_too=False)


def test_a_scoped_verdict_covers_its_stream_and_pipeline_only(any_ledger: Ledger) -> None:
    """--pipeline and --stream: another stream of the pipeline, and the same stream of another
    pipeline, recorded one broker, stay refused by the audit."""
    led = any_ledger
    _twice(led, "s")
    _twice(led, "t", n=10)
    _twice(led, "s", pipeline="q-s12b", n=20)
    for pipe, stream in ((PIPE, "s"), (PIPE, "t"), ("q-s12b", "s")):
        led.record_same_broker(pipe, stream, [A, B], "found")
    assert len(led.record_distinct_brokers(A, B, pipeline=PIPE, stream="s", why="mirrors")) == 1
    judged = {(r.pipeline, r.source.stream) for r in led.same_broker() if r.distinct}
    assert judged == {(PIPE, "s")}
    report = _audit(led)
    assert not report.clean and {v.stream for v in report.violations} == {"t"}, report.to_text()
    assert not _audit(led, "q-s12b").clean


def test_an_unscoped_verdict_covers_every_pipeline_and_stream_either_name_has(any_ledger: Ledger) -> None:
    """No --pipeline, no --stream: every pipeline and stream A or B has a history or record of
    (three here), not a stream read later (a new stream is not judged ahead)."""
    led = any_ledger
    _twice(led, "s")
    _twice(led, "t", n=10)
    _twice(led, "s", pipeline="q-s12b", n=20)
    assert len(led.record_distinct_brokers(A, B)) == 3
    assert _audit(led).clean and _audit(led, "q-s12b").clean
    _twice(led, "later", n=30)
    led.record_same_broker(PIPE, "later", [A, B], "found after the verdict")
    assert not _audit(led).clean


def test_the_cli_names_what_an_unscoped_verdict_covers(capsys: pytest.CaptureFixture[str],
                                                        sqlite_url: str) -> None:
    assert main(["ledger", "upgrade", "--db", sqlite_url]) == 0
    led = Ledger(sqlite_url)
    try:
        _twice(led, "s")
        _twice(led, "t", n=10)
        _twice(led, "s", pipeline="q-s12b", n=20)
    finally:
        led.close()
    capsys.readouterr()
    assert main(["ledger", "distinct-brokers", "--db", sqlite_url, A, B]) == 0
    out = capsys.readouterr().out
    assert "3 stream(s)" in out, out
    assert all(name in out for name in (PIPE, "q-s12b", "'t'")) or all(
        name in out for name in (PIPE, "q-s12b", " t")), out


def test_the_audit_notes_the_verdict_it_relies_on(any_ledger: Ledger) -> None:
    led = any_ledger
    _twice(led, "s")
    led.record_same_broker(PIPE, "s", [A, B], "found")
    assert not _audit(led).clean
    led.record_distinct_brokers(A, B, pipeline=PIPE, stream="s", why="mirrors")
    report = _audit(led)
    assert report.clean, report.to_text()
    said = [n.detail for n in report.notes]
    assert any(w in d for d in said for w in ("distinct", "two brokers", "verdict")), report.to_text()


def test_a_verdict_contradicted_through_a_third_name_gets_a_cure_that_works(any_ledger: Ledger) -> None:
    led = any_ledger
    _twice(led, "s")
    led.record_same_broker(PIPE, "s", [A, C], "a is c")
    led.record_same_broker(PIPE, "s", [B, C], "b is c")
    led.record_distinct_brokers(A, B, pipeline=PIPE, stream="s", why="mirrors")
    report = _audit(led)
    assert not report.clean, report.to_text()  # A and B are one broker through C: held
    led.record_distinct_brokers(A, B, pipeline=PIPE, stream="s", why="as the audit says")  # its cure
    again = _audit(led)
    assert again.clean or "distinct-brokers " + f"{A} {B}" not in again.to_text(), again.to_text()


def test_a_verdict_follows_a_rename_and_wins_over_a_one_broker_record(any_ledger: Ledger) -> None:
    """A~B distinct, then B's history renamed C (where A~C was recorded one broker): B was C, so A
    and C are two brokers (the verdict wins over the record)."""
    led = any_ledger
    _commit(led, SourceRef(A, "s"), 10, 1)
    _commit(led, SourceRef(B, "s"), 10, 2)
    led.record_same_broker(PIPE, "s", [A, C], "found")
    led.record_distinct_brokers(A, B, pipeline=PIPE, stream="s")
    led.rename_broker(B, C)
    assert sorted((r.source.broker, r.other, r.distinct) for r in led.same_broker(PIPE)) == [
        (A, C, True), (C, A, True)]
    assert _audit(led).clean


def test_a_verdict_ahead_of_history_needs_both_scopes_and_stays_against_a_later_finding(
        any_ledger: Ledger) -> None:
    led = any_ledger
    with pytest.raises(LedgerError, match="nothing to judge"):
        led.record_distinct_brokers(A, B, pipeline=PIPE)
    with pytest.raises(LedgerError, match="two live identities"):
        led.record_distinct_brokers(A, A + "#epoch0", pipeline=PIPE, stream="s")
    assert len(led.record_distinct_brokers(A, B, pipeline=PIPE, stream="s")) == 1
    _twice(led, "s")
    assert led.record_same_broker(PIPE, "s", [A, B], "a chunk says one") == 0
    assert all(r.distinct for r in led.same_broker(PIPE)) and _audit(led).clean


def test_a_verdict_and_new_epoch(any_ledger: Ledger) -> None:
    """The re-created stream's old history is retired (``#epoch``); the verdict stays with the live
    names and the audit is clean over both epochs."""
    led = any_ledger
    _twice(led, "s")
    led.record_distinct_brokers(A, B, pipeline=PIPE, stream="s")
    led.new_epoch(PIPE, SourceRef(A, "s"), reason="re-created")
    assert {(r.source.broker, r.other) for r in led.same_broker(PIPE) if r.distinct} == {(A, B), (B, A)}
    _commit(led, SourceRef(A, "s"), 10, 9)
    assert _audit(led).clean, _audit(led).to_text()
