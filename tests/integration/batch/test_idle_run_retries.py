"""Idle claims answered, not stored (migration 0014), composed with a
command-line retry of the same run id and with ``new-epoch``. Real ledgers (SQLite and PostgreSQL),
claims made through the ledger's one claim rule; ledger-only, so each test takes seconds."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from streamledger.cli.batch import DAG, TASK, _try_number
from streamledger.ledger import ClaimRequest, Ledger, RangeStatus, RunIdentity, SourceRef

pytestmark = pytest.mark.timeout(120)

BROKER = "rabbitmq-stream://127.0.0.1:5552/%2F"


def _pipe() -> str:
    return f"p-s11-idle-{uuid.uuid4().hex[:8]}"


def _cli(run_id: str, try_number: int = 1) -> RunIdentity:
    return RunIdentity(DAG, run_id, TASK, try_number=try_number)


def test_cli_retry_of_an_idle_run_is_numbered_past_its_first_try(any_ledger: Ledger) -> None:
    pipe, src = _pipe(), SourceRef(BROKER, "s11-idle-try")
    first = any_ledger.claim(pipe, src, 3, _cli("cli-data"), initial_start=0)
    any_ledger.commit(first.id, records=3, first_seen=0, last_seen=2, output=None)
    idle = any_ledger.claim(pipe, src, 3, _cli("cli-idle"))
    if not (idle.empty and not idle.recorded and _try_number(any_ledger, pipe, "cli-data") == 2):
        raise RuntimeError(f"scenario broken: {idle}")  # answered, not stored: the run key alone kept
    # the first attempt of cli-idle ran (try 1); its retry is try 2, as for a run that read something
    assert _try_number(any_ledger, pipe, "cli-idle") == 2


def test_a_retry_of_an_idle_run_after_new_epoch_gets_nothing_and_the_next_run_reads_the_new_stream(
    any_ledger: Ledger,
) -> None:
    """Promise kept: the idle run is kept per pipeline, so after ``new-epoch`` its retry finds
    nothing on the new history either (it never reads further than its first attempt did), the
    same on both ledgers, and the next run reads the new stream from 0 with no overlap or gap."""
    pipe, src = _pipe(), SourceRef(BROKER, "s11-idle-epoch")
    first = any_ledger.claim(pipe, src, 3, _cli("e-data"), initial_start=0)
    any_ledger.commit(first.id, records=3, first_seen=0, last_seen=2, output=None)
    idle = any_ledger.claim(pipe, src, 3, _cli("e-idle"))
    assert idle.empty and not idle.recorded
    any_ledger.mark_replaced(pipe, src, "deleted and re-created")
    assert any_ledger.new_epoch(pipe, src, reason="re-created") == (0, 1)
    again = any_ledger.claim_many(pipe, [_request(src, 5)], _cli("e-idle", try_number=2))[0]
    assert (again.start, again.end, again.recorded) == (0, 0, False)
    nxt = any_ledger.claim_many(pipe, [_request(src, 5)], _cli("e-next"))[0]
    assert (nxt.start, nxt.end, nxt.status) == (0, 5, RangeStatus.CLAIMED)
    any_ledger.commit(nxt.id, records=5, first_seen=0, last_seen=4, output=None)
    report = any_ledger.audit(pipe)
    assert report.clean, report.to_text()


def _request(src: SourceRef, end_limit: int) -> ClaimRequest:
    return ClaimRequest(src, end_limit)


def test_an_idle_key_is_answered_alike_on_both_ledgers_behind_an_open_claim_and_when_pinned(
    any_ledger: Ledger,
) -> None:
    """Promise kept, SQLite and PostgreSQL alike: a retry of a key answered "nothing new" gets nothing
    at the tail even when the tail is another run's open claim (no overlap, no wait), while the same
    key's pinned claim (an interval) is claimed and stored as ever."""
    pipe, src = _pipe(), SourceRef(BROKER, "s11-idle-open")
    first = any_ledger.claim(pipe, src, 3, _cli("o-data"), initial_start=0)
    any_ledger.commit(first.id, records=3, first_seen=0, last_seen=2, output=None)
    assert not any_ledger.claim(pipe, src, 3, _cli("o-idle")).recorded
    held = any_ledger.claim(pipe, src, 8, _cli("o-other"))
    assert (held.start, held.end, held.status) == (3, 8, RangeStatus.CLAIMED)
    again = any_ledger.claim_many(pipe, [_request(src, 12)], _cli("o-idle", try_number=2),
                                  abandon_after=timedelta(0))[0]
    assert (again.start, again.end, again.recorded) == (8, 8, False)
    assert any_ledger.get(held.id).status == RangeStatus.CLAIMED  # not abandoned by the idle retry
    when = datetime(2026, 11, 27, tzinfo=UTC)
    pinned = any_ledger.claim(pipe, src, 12, _cli("o-idle", try_number=3), span=(8, 12),
                              interval=(when, when + timedelta(hours=1)))
    assert (pinned.start, pinned.end, pinned.status, pinned.recorded) == (8, 12, RangeStatus.CLAIMED, True)
