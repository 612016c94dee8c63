"""The try a command-line retry is numbered by (migration 0015,
``Ledger.last_try``, ``streamledger batch run --run-id``), on both ledgers, through the ledger's one
claim rule: an idle run's tries, out of order, per map index, and a retry of a committed run."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from streamledger.cli.batch import DAG, TASK, _try_number
from streamledger.ledger import ClaimRequest, Ledger, RunIdentity, SourceRef

pytestmark = pytest.mark.timeout(120)

BROKER = "rabbitmq-stream://127.0.0.1:5552/%2F"


def _pipe() -> str:
    return f"p-s12-try-{uuid.uuid4().hex[:8]}"


def _cli(run_id: str, try_number: int = 1, map_index: int = -1) -> RunIdentity:
    return RunIdentity(DAG, run_id, TASK, map_index, try_number)


def _with_data(ledger: Ledger, pipe: str, src: SourceRef) -> None:
    first = ledger.claim(pipe, src, 3, _cli("data"), initial_start=0)
    ledger.commit(first.id, records=3, first_seen=0, last_seen=2, output=None)


def test_an_idle_run_keeps_its_highest_try_when_tries_are_answered_out_of_order(any_ledger: Ledger) -> None:
    """Promise kept on SQLite and PostgreSQL (the server-side claim of 0015) alike: a later try
    answered idle raises the recorded try, an older one answered after it lowers nothing."""
    pipe, src = _pipe(), SourceRef(BROKER, "s12-idle-order")
    _with_data(any_ledger, pipe, src)
    assert not any_ledger.claim(pipe, src, 3, _cli("idle")).recorded
    assert not any_ledger.claim(pipe, src, 3, _cli("idle", 4)).recorded
    assert not any_ledger.claim(pipe, src, 3, _cli("idle", 2)).recorded  # a zombie try answered late
    assert any_ledger.last_try(pipe, _cli("idle")) == 4
    assert _try_number(any_ledger, pipe, "idle") == 5


def test_an_idle_key_then_data_at_the_tail_then_idle_numbers_past_every_try(any_ledger: Ledger) -> None:
    """Promise kept: once answered idle a key stays idle at the tail (no range is ever stored for it,
    even after new offsets arrive), and every try it was answered with is counted."""
    pipe, src = _pipe(), SourceRef(BROKER, "s12-idle-data")
    _with_data(any_ledger, pipe, src)
    assert not any_ledger.claim(pipe, src, 3, _cli("k")).recorded
    again = any_ledger.claim(pipe, src, 9, _cli("k", 2))  # offsets 3..8 arrived meanwhile
    assert (again.start, again.end, again.recorded) == (3, 3, False)
    nxt = any_ledger.claim(pipe, src, 9, _cli("other"))
    assert (nxt.start, nxt.end) == (3, 9)
    assert not any_ledger.claim(pipe, src, 9, _cli("k", 3)).recorded
    assert _try_number(any_ledger, pipe, "k") == 4


def test_an_idle_try_counts_for_its_map_index_only(any_ledger: Ledger) -> None:
    """Promise kept: the tries are kept per map index (an idle mapped instance does not number the
    unmapped command-line run of the same run id, nor a sibling instance)."""
    pipe, src = _pipe(), SourceRef(BROKER, "s12-idle-map")
    _with_data(any_ledger, pipe, src)
    assert not any_ledger.claim(pipe, src, 3, _cli("m", 3, map_index=0)).recorded
    assert any_ledger.last_try(pipe, _cli("m", map_index=0)) == 3
    assert any_ledger.last_try(pipe, _cli("m", map_index=1)) == 0
    assert _try_number(any_ledger, pipe, "m") == 1


def test_a_retry_of_a_committed_run_is_numbered_past_every_earlier_try(any_ledger: Ledger) -> None:
    pipe, src = _pipe(), SourceRef(BROKER, "s12-committed-retry")
    assert _try_number(any_ledger, pipe, "c") == 1
    first = any_ledger.claim(pipe, src, 3, _cli("c", 1), initial_start=0)
    any_ledger.commit(first.id, records=3, first_seen=0, last_seen=2, output=None)  # then killed
    assert _try_number(any_ledger, pipe, "c") == 2
    second = any_ledger.claim(pipe, src, 9, _cli("c", 2))  # its retry gets the committed range back
    if (second.id, second.start, second.end) != (first.id, 0, 3):
        raise RuntimeError(f"scenario broken: {second}")
    # try 2 was killed while publishing; the next attempt must be try 3
    assert _try_number(any_ledger, pipe, "c") == 3


def _pinned(src: SourceRef, span: tuple[int, int], end_limit: int = 20) -> ClaimRequest:
    day = datetime(2026, 11, 1, tzinfo=UTC)
    return ClaimRequest(src, end_limit, span=span, interval=(day, day + timedelta(days=1)))


def test_a_pinned_run_s_retry_while_its_claim_is_open_is_numbered_past_it(any_ledger: Ledger) -> None:
    """Promise kept on both ledgers: a run pinned to an interval with offsets, retried while its
    claim is open, gets its range back with the new try, and the next is numbered past it."""
    pipe, src = _pipe(), SourceRef(BROKER, "s12-pinned")
    _with_data(any_ledger, pipe, src)
    full = any_ledger.claim_many(pipe, [_pinned(src, (3, 6))], _cli("pf"))[0]
    assert (full.start, full.end, full.run.run_id) == (3, 6, "pf")
    retry = any_ledger.claim_many(pipe, [_pinned(src, (3, 6))], _cli("pf", 2))[0]
    assert retry.id == full.id
    assert _try_number(any_ledger, pipe, "pf") == 3


def test_a_pinned_run_whose_interval_held_no_offsets_is_numbered_past_every_try(any_ledger: Ledger) -> None:
    pipe, src = _pipe(), SourceRef(BROKER, "s12-pinned-empty")
    _with_data(any_ledger, pipe, src)
    empty = any_ledger.claim_many(pipe, [_pinned(src, (3, 3))], _cli("pe"))[0]
    again = any_ledger.claim_many(pipe, [_pinned(src, (3, 3))], _cli("pe", 2))[0]
    if (empty.start, empty.end, again.id) != (3, 3, empty.id):
        raise RuntimeError(f"scenario broken: {empty} {again}")
    assert _try_number(any_ledger, pipe, "pe") == 3
