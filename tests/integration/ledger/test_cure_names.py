"""`ledger distinct-brokers` and `ledger rename-broker` take broker identities in any spelling, as every
other command does (issue 43, item 4): the verdict or the rename lands on the names the ledger
records, two spellings of one broker are refused in one line (exit 2) with nothing written, and
`--dry-run` says what would change and changes nothing. Both ledgers."""

from __future__ import annotations

import pytest

from streamledger.cli import main
from streamledger.ledger import Ledger, SourceRef
from tests.unit.ledger.util import run

C1, C2 = "rabbitmq://c1/%2F", "rabbitmq://c2/%2F"


def _two_histories(ledger: Ledger, pipe: str) -> None:
    for n, broker in enumerate((C1, C2), start=1):
        r = ledger.claim(pipe, SourceRef(broker, "s"), 10, run(n), initial_start=0)
        ledger.commit(r.id, records=1, first_seen=0, last_seen=0, output=f"/out/{pipe}/{n}")
    ledger.record_same_broker(pipe, "s", [C1, C2], "found by a chunk")


def test_distinct_brokers_takes_any_spelling_and_refuses_one_broker_spelled_twice(
    any_ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = "p-cure-names-distinct"
    _two_histories(any_ledger, pipe)
    argv = ["ledger", "distinct-brokers", "--db", any_ledger.url, "--pipeline", pipe, "--stream", "s"]
    capsys.readouterr()
    assert main([*argv, "rabbitmq://c1/", "rabbitmq://c1/%2f"]) == 2
    err = capsys.readouterr().err
    assert "two spellings" in err and len(err.strip().splitlines()) == 1, err
    assert main([*argv, "rabbitmq://c1/%2f", "rabbitmq://c2/", "--dry-run"]) == 0
    assert "dry run" in capsys.readouterr().out
    assert not any(r.distinct for r in any_ledger.same_broker(pipe))
    assert main([*argv, "rabbitmq://c1/%2f", "rabbitmq://c2/", "--reason", "mirrors"]) == 0
    records = any_ledger.same_broker(pipe)
    assert {(r.source.broker, r.other) for r in records} == {(C1, C2), (C2, C1)}
    assert all(r.distinct for r in records), records
    assert all(x.distinct for x in any_ledger.position(pipe, SourceRef(C2, "s")).same_broker)


def test_rename_broker_takes_any_spelling_and_refuses_one_broker_spelled_twice(
    any_ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = "p-cure-names-rename"
    r = any_ledger.claim(pipe, SourceRef(C1, "s"), 10, run(1), initial_start=0)
    any_ledger.commit(r.id, records=1, first_seen=0, last_seen=0, output=f"/out/{pipe}/1")
    argv = ["ledger", "rename-broker", "--db", any_ledger.url, "--pipeline", pipe]
    capsys.readouterr()
    assert main([*argv, "rabbitmq://c1/", "rabbitmq://c1/%2f"]) == 2
    assert "two spellings" in capsys.readouterr().err
    assert main([*argv, "rabbitmq://c1/%2f", "rabbitmq://c3/", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run" in out and "1 source(s)" in out, out
    assert [x.source.broker for x in any_ledger.ranges(pipe)] == [C1]
    assert main([*argv, "rabbitmq://c1/%2f", "rabbitmq://c3/"]) == 0
    assert [x.source.broker for x in any_ledger.ranges(pipe)] == ["rabbitmq://c3/%2F"]
