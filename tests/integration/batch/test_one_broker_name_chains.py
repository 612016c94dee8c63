"""The one-broker records (migration 0016, ``Ledger.record_same_broker``)
composed with three names of one broker, ``new-epoch``, ``rename-broker --pipeline`` and the audit.
Ledger-only (both ledgers), claims through the ledger's one claim rule, the claim-time decision by
``named_twice_because`` as the batch makes it; each test takes seconds."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from streamledger.batch.identity import named_twice_because
from streamledger.batch.proof import audit
from streamledger.ledger import Ledger, RunIdentity, SourceRef

pytestmark = pytest.mark.timeout(120)

A, B, C = "rabbitmq://a/%2F", "rabbitmq://b/%2F", "rabbitmq://c/%2F"
S = "s12-names"


def _pipe() -> str:
    return f"p-s12-names-{uuid.uuid4().hex[:8]}"


def _read(ledger: Ledger, pipe: str, broker: str, end: int, run: str) -> None:
    """A committed range [start, end) of S under ``broker`` (from 0 for a new history)."""
    rng = ledger.claim(pipe, SourceRef(broker, S), end, RunIdentity("d", run, "t"), initial_start=0)
    assert rng.end > rng.start, rng
    ledger.commit(rng.id, records=rng.end - rng.start, first_seen=rng.start, last_seen=rng.end - 1,
                  output=None)


def _refused(ledger: Ledger, pipe: str, own: str) -> bool:
    """Whether a batch under ``own`` would be refused before it claims (no chunk prints here: the
    ledger's records decide, as once retention rolled the fingerprinted chunks out)."""
    (pos,) = ledger.positions(pipe, [SourceRef(own, S)])
    return named_twice_because(None, S, pipe, own, pos) is not None


def test_three_names_chained_by_two_records_are_one_broker_to_the_audit(any_ledger: Ledger) -> None:
    """Promise kept: records A-B, then C-A; histories under B and C read the same offsets. The audit
    joins the records (one_broker_groups) and reports the overlap with no broker given."""
    pipe = _pipe()
    _read(any_ledger, pipe, B, 5, "b1")
    _read(any_ledger, pipe, C, 5, "c1")
    any_ledger.record_same_broker(pipe, S, [A, B], "found by a chunk")
    any_ledger.record_same_broker(pipe, S, [C, A], "found by a chunk")
    report = audit(any_ledger, pipe, outputs_too=False)
    assert not report.clean, report.to_text()
    assert "overlap" in [v.kind.value for v in report.violations], report.to_text()


def test_a_name_recorded_with_a_retired_name_stays_refused_while_a_third_name_has_the_history(
    any_ledger: Ledger,
) -> None:
    """Promise kept: A and B raced (both histories, recorded A-B), C was refused by A's chunk alone
    (recorded A-C), then A's history was retired by ``new-epoch``. C is recorded only with A, yet
    stays refused: ``new_epoch`` begins A's new history at once, so A still has one."""
    pipe = _pipe()
    _read(any_ledger, pipe, A, 5, "a1")
    _read(any_ledger, pipe, B, 5, "b1")
    any_ledger.record_same_broker(pipe, S, [A, B], "the audit found them one broker")
    any_ledger.record_same_broker(pipe, S, [A, C], "a batch under C refused by A's chunk")
    if not (_refused(any_ledger, pipe, C) and _refused(any_ledger, pipe, B)):
        raise RuntimeError("scenario broken: C or B not refused while A has a history")
    any_ledger.mark_replaced(pipe, SourceRef(A, S), "retired by hand")
    any_ledger.new_epoch(pipe, SourceRef(A, S), reason="retire the doubled history")
    assert _refused(any_ledger, pipe, C), "a batch under C would read again [0, 5) B committed"


def test_after_new_epoch_on_the_first_name_the_refused_name_stays_refused_once_the_first_reads(
    any_ledger: Ledger,
) -> None:
    """Promise kept (both ledgers): A read, B refused and recorded; A's stream re-created and A given
    a new epoch. Until A reads again nothing holds B back (no history under a name of this broker),
    once A's new history has a range B is refused again by the record."""
    pipe = _pipe()
    _read(any_ledger, pipe, A, 5, "a1")
    any_ledger.record_same_broker(pipe, S, [A, B], "B refused by A's chunk")
    assert _refused(any_ledger, pipe, B)
    any_ledger.mark_replaced(pipe, SourceRef(A, S), "deleted and re-created")
    any_ledger.new_epoch(pipe, SourceRef(A, S), reason="re-created")
    _read(any_ledger, pipe, A, 3, "a2")
    assert _refused(any_ledger, pipe, B)
    assert not _refused(any_ledger, pipe, A)
    report = audit(any_ledger, pipe, outputs_too=False)
    assert report.clean, report.to_text()


def test_rename_broker_scoped_to_one_pipeline_leaves_the_other_pipeline_s_records(any_ledger: Ledger) -> None:
    """Promise kept: ``rename-broker --pipeline P1 A B`` moves P1's history and clears P1's pair; P2,
    still reading under A, keeps B refused by its own record."""
    p1, p2 = _pipe(), _pipe()
    for p in (p1, p2):
        _read(any_ledger, p, A, 5, "a1")
        any_ledger.record_same_broker(p, S, [A, B], "B refused by A's chunk")
    assert any_ledger.rename_broker(A, B, pipeline=p1) == 1
    assert any_ledger.same_broker(p1) == []
    assert not _refused(any_ledger, p1, B)
    assert _refused(any_ledger, p2, B)
    assert {(r.source.broker, r.other) for r in any_ledger.same_broker(p2)} == {(A, B), (B, A)}
    _read(any_ledger, p1, B, 8, "b2")  # P1 reads on under B from 5
    assert [(r.start, r.end) for r in any_ledger.ranges(p1) if r.source.broker == B] == [(0, 5), (5, 8)]
    for p in (p1, p2):
        report = audit(any_ledger, p, outputs_too=False)
        assert not [v for v in report.violations], report.to_text()


def test_a_rename_into_the_third_name_of_a_chain_keeps_one_record_per_pair(any_ledger: Ledger) -> None:
    """Promise kept: records A-B and A-C; ``rename-broker C B`` (C never read) leaves exactly A-B, and a
    batch under B stays refused while A has its history."""
    pipe = _pipe()
    _read(any_ledger, pipe, A, 5, "a1")
    any_ledger.record_same_broker(pipe, S, [A, B], "B refused")
    any_ledger.record_same_broker(pipe, S, [A, C], "C refused")
    any_ledger.rename_broker(C, B)
    assert sorted((r.source.broker, r.other) for r in any_ledger.same_broker(pipe)) == [(A, B), (B, A)]
    assert _refused(any_ledger, pipe, B)


def _delete_history(ledger: Ledger, pipe: str, broker: str) -> None:
    """What an operator does by hand: delete one name's ranges and source rows of S."""
    with ledger.engine.begin() as conn:
        sid = conn.execute(text(
            "SELECT s.id FROM streamledger_source s JOIN streamledger_pipeline p ON p.id = s.pipeline_id "
            "WHERE p.name = :p AND s.broker = :b AND s.stream = :s"),
            {"p": pipe, "b": broker, "s": S}).scalar_one()
        conn.execute(text("DELETE FROM streamledger_range WHERE source_id = :i"), {"i": sid})
        conn.execute(text("DELETE FROM streamledger_source WHERE id = :i"), {"i": sid})


def test_after_one_name_s_rows_are_deleted_by_hand_the_audit_still_joins_the_other_two(
    any_ledger: Ledger,
) -> None:
    """A and B raced (recorded A-B), C refused by A's chunk alone (recorded A-C); the operator deletes
    A's rows by hand to keep B. Whether or not a batch under C is refused then, the audit must not
    say CLEAN once C has read B's offsets again: it joins C to B through A's records."""
    pipe = _pipe()
    _read(any_ledger, pipe, A, 5, "a1")
    _read(any_ledger, pipe, B, 5, "b1")
    any_ledger.record_same_broker(pipe, S, [A, B], "the audit found them one broker")
    any_ledger.record_same_broker(pipe, S, [A, C], "a batch under C refused by A's chunk")
    _delete_history(any_ledger, pipe, A)
    refused = _refused(any_ledger, pipe, C)  # it is not (next test)
    if not refused:
        _read(any_ledger, pipe, C, 5, "c1")
    report = audit(any_ledger, pipe, outputs_too=False)
    assert refused or not report.clean, report.to_text()


def test_a_name_joined_to_a_history_through_a_third_name_is_refused_before_it_claims(
    any_ledger: Ledger,
) -> None:
    pipe = _pipe()
    _read(any_ledger, pipe, A, 5, "a1")
    _read(any_ledger, pipe, B, 5, "b1")
    any_ledger.record_same_broker(pipe, S, [A, B], "the audit found them one broker")
    any_ledger.record_same_broker(pipe, S, [A, C], "a batch under C refused by A's chunk")
    _delete_history(any_ledger, pipe, A)
    assert _refused(any_ledger, pipe, C), "a batch under C would read again [0, 5) that B committed"
