"""`ledger audit --broker-url`: each source is checked against its own broker, and sources of brokers
not given are skipped with a note (issue 19, item 9). A real RabbitMQ broker and an emulated mewbase
server hold the stored offsets; the ledger is SQLite."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from streamledger.cli import main
from streamledger.ledger import Ledger, SourceRef, ViolationKind
from streamledger.protocol.mewbase import MewbaseLog
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.sources import source_identity
from tests.support.mewbase_emulator import MewbaseServerEmulator
from tests.unit.ledger.util import run

pytestmark = [pytest.mark.rabbitmq]

ELSEWHERE = "rabbitmq://rabbit@elsewhere/%2F"  # a cluster nobody passes to the audit


@pytest.fixture
def mewbase() -> Iterator[MewbaseServerEmulator]:
    with MewbaseServerEmulator() as emu:
        yield emu


def commit(ledger: Ledger, broker: str, stream: str, start: int, end: int, last: int, n: int) -> None:
    r = ledger.claim("pipe", SourceRef(broker, stream), end, run(f"{broker}-{stream}"), initial_start=start)
    ledger.commit(r.id, records=n, first_seen=start, last_seen=last, output=None)


def audit(capsys: pytest.CaptureFixture[str], db: str, *urls: str) -> tuple[int, dict[str, object], str]:
    argv = ["ledger", "audit", "--db", db, "--no-outputs"]  # the histories are synthetic
    for url in urls:
        argv += ["--broker-url", url]
    rc = main([*argv, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert main(argv) == rc
    return rc, report, capsys.readouterr().out


def test_each_source_is_checked_against_its_own_broker(
    capsys: pytest.CaptureFixture[str], sqlite_url: str, rabbitmq_url: str, stream_name: object,
    mewbase: MewbaseServerEmulator,
) -> None:
    stream, legacy_stream = stream_name(), stream_name()  # type: ignore[operator]
    with StreamClient.connect(rabbitmq_url) as client:
        rabbit = source_identity(rabbitmq_url, client.cluster_name)
        legacy = source_identity(rabbitmq_url)  # a 0.1 row, named by host:port, not yet adopted
        assert client.cluster_name and rabbit != legacy
        for name in (stream, legacy_stream):
            client.create_stream(name)
            assert client.publish(name, [b"m%d" % i for i in range(5)]).confirmed == 5
            client.store_offset_verified(name, "pipe", 4)
    positions = [mewbase.append(stream, {"n": i}) for i in range(3)]  # a channel of the same name
    with MewbaseLog.connect(mewbase.url()) as log:
        log.store_offset_verified(stream, "pipe", positions[-1])
    on_mewbase = source_identity(mewbase.url())

    ledger = Ledger(sqlite_url, create=True)
    commit(ledger, rabbit, stream, 0, 5, 4, 5)
    commit(ledger, legacy, legacy_stream, 0, 5, 4, 5)
    commit(ledger, on_mewbase, stream, positions[0], positions[-1] + 1, positions[-1], 3)
    commit(ledger, ELSEWHERE, stream, 0, 100, 99, 100)
    capsys.readouterr()

    # Only the RabbitMQ broker given: its two sources are checked (agree), the others are skipped.
    rc, report, text = audit(capsys, sqlite_url, rabbitmq_url)
    assert report["violations"] == [], report["violations"]
    assert rc == 0 and report["broker_checked"] is True
    skipped = {(n["broker"], n["stream"]) for n in report["notes"]  # type: ignore[union-attr]
               if n["kind"] == ViolationKind.BROKER_NOT_GIVEN}
    assert skipped == {(on_mewbase, stream), (ELSEWHERE, stream)}
    assert "2 source(s) of brokers not given were not compared" in text
    assert f"{ViolationKind.BROKER_NOT_GIVEN.value}" in text and ELSEWHERE in text

    # Both servers given: the mewbase source is checked against mewbase, and agrees.
    rc, report, text = audit(capsys, sqlite_url, rabbitmq_url, mewbase.url())
    assert rc == 0 and report["violations"] == []
    assert [(n["broker"], n["kind"]) for n in report["notes"]] == [  # type: ignore[union-attr]
        (ELSEWHERE, ViolationKind.BROKER_NOT_GIVEN.value)
    ]

    # The mewbase consumer is rewound: drift on that source only, found on its own server.
    with MewbaseLog.connect(mewbase.url()) as log:
        log.store_offset_verified(stream, "pipe", positions[0])
    rc, report, _ = audit(capsys, sqlite_url, mewbase.url(), rabbitmq_url)
    assert rc == 1
    assert [(v["kind"], v["broker"]) for v in report["violations"]] == [  # type: ignore[union-attr]
        (ViolationKind.BROKER_DRIFT.value, on_mewbase)
    ]
    ledger.close()


def test_the_python_api_keeps_one_lookup_for_every_source(
    sqlite_url: str, rabbitmq_url: str, stream_name: object
) -> None:
    """``Ledger.audit(broker=client)`` still asks the one client about every source (0.x callers)."""
    stream = stream_name()  # type: ignore[operator]
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [b"a", b"b"])
        client.store_offset_verified(stream, "pipe", 1)
        ledger = Ledger(sqlite_url, create=True)
        commit(ledger, ELSEWHERE, stream, 0, 2, 1, 2)
        assert ledger.audit(broker=client).clean
        assert ledger.audit(broker=client.query_offset).broker_checked
        by_identity = ledger.audit(broker={ELSEWHERE: client})
        assert by_identity.clean and by_identity.notes == ()
        none_given = ledger.audit(broker={})
        assert none_given.clean and [n.kind for n in none_given.notes] == [ViolationKind.BROKER_NOT_GIVEN]
    ledger.close()
