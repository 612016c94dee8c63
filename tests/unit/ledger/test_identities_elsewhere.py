"""``SourcePosition.elsewhere`` on both ledgers: what the batch and the streaming recorder ask a broker
before they claim (is it the broker another identity's history of the stream read?) and nothing more:
the newest print of each other live identity's history of the same pipeline and stream."""

from __future__ import annotations

import pytest

from streamledger.ledger import Ledger, LedgerError, RunIdentity, SourceRef
from streamledger.offsets import ChunkPrint

EAST, WEST, NORTH = "rabbitmq://east/%2F", "rabbitmq://west/%2F", "rabbitmq://north/%2F"


def run(n: int) -> RunIdentity:
    return RunIdentity("dag", f"r{n}", "t")


def commit(led: Ledger, pipeline: str, src: SourceRef, end: int, n: int, chunk: ChunkPrint | None) -> None:
    rng = led.claim(pipeline, src, end, run(n), initial_start=0)
    led.commit(rng.id, records=rng.end - rng.start, first_seen=rng.start, last_seen=rng.end - 1,
               output=f"/out/{n}", chunk=chunk)


def test_other_identities_prints_of_the_stream_only(any_ledger: Ledger) -> None:
    led = any_ledger
    commit(led, "p", SourceRef(EAST, "s"), 10, 1, ChunkPrint(0, 1000, 7))
    commit(led, "p", SourceRef(EAST, "s"), 20, 2, ChunkPrint(10, 2000, 8))  # the newest print wins
    commit(led, "p", SourceRef(NORTH, "s"), 5, 3, None)  # a history without a print: nothing to ask
    commit(led, "p", SourceRef(EAST, "other"), 5, 4, ChunkPrint(0, 3000, 9))  # another stream
    commit(led, "q", SourceRef(NORTH, "s"), 5, 5, ChunkPrint(0, 4000, 1))  # another pipeline
    west, east, fresh = led.positions("p", [SourceRef(WEST, "s"), SourceRef(EAST, "s"), SourceRef(WEST, "t")])
    assert west.end is None and west.elsewhere == ((EAST, ChunkPrint(10, 2000, 8)),)
    assert east.elsewhere == () and fresh.elsewhere == ()


def test_a_retired_epoch_is_not_elsewhere(any_ledger: Ledger) -> None:
    """A re-created stream's old history (``#epoch<N>``) read a stream no broker holds any more."""
    led = any_ledger
    commit(led, "p", SourceRef(EAST, "s"), 10, 1, ChunkPrint(0, 1000, 7))
    led.new_epoch("p", SourceRef(EAST, "s"), reason="re-created")
    assert led.position("p", SourceRef(WEST, "s")).elsewhere == ()
    commit(led, "p", SourceRef(EAST, "s"), 3, 2, ChunkPrint(0, 5000, 2))
    assert led.position("p", SourceRef(WEST, "s")).elsewhere == ((EAST, ChunkPrint(0, 5000, 2)),)


def test_a_one_broker_record_is_read_by_both_names_and_kept_first(any_ledger: Ledger) -> None:
    """Written for both names (the refused one has no history, so no source row yet), read back with
    where the other name's history ends; a second finding of the same pair keeps the first."""
    led = any_ledger
    commit(led, "p", SourceRef(EAST, "s"), 10, 1, ChunkPrint(0, 1000, 7))
    assert led.record_same_broker("p", "s", [WEST, EAST], "first") == 2
    assert led.record_same_broker("p", "s", [EAST, WEST], "second") == 0
    west, east, other = led.positions("p", [SourceRef(WEST, "s"), SourceRef(EAST, "s"), SourceRef(WEST, "t")])
    assert [(r.source.broker, r.other, r.why, r.other_end) for r in west.same_broker] == [
        (WEST, EAST, "first", 10)]
    assert [(r.other, r.other_end) for r in east.same_broker] == [(WEST, None)]  # west read nothing
    assert other.same_broker == () and led.position("q", SourceRef(WEST, "s")).same_broker == ()
    assert sorted((r.source.broker, r.other) for r in led.same_broker()) == [(EAST, WEST), (WEST, EAST)]


def test_rename_broker_moves_the_record_with_the_name_and_clears_a_pair_made_one(any_ledger: Ledger) -> None:
    led = any_ledger
    commit(led, "p", SourceRef(EAST, "s"), 10, 1, ChunkPrint(0, 1000, 7))
    led.record_same_broker("p", "s", [EAST, WEST], "found")
    assert led.rename_broker(WEST, NORTH) == 0  # west has no history: only the record moves
    assert sorted((r.source.broker, r.other) for r in led.same_broker("p")) == [(EAST, NORTH), (NORTH, EAST)]
    led.record_same_broker("p", "s", [EAST, WEST], "again")
    assert led.rename_broker(WEST, NORTH, pipeline="p") == 0  # merged with the pair already there
    assert sorted((r.source.broker, r.other, r.why) for r in led.same_broker("p")) == [
        (EAST, NORTH, "found"), (NORTH, EAST, "found")]
    assert led.rename_broker(NORTH, EAST) == 0  # one name now: nothing left to refuse
    assert led.same_broker() == [] and led.position("p", SourceRef(EAST, "s")).same_broker == ()


def test_a_record_needs_two_live_names(any_ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="two live identities"):
        any_ledger.record_same_broker("p", "s", [EAST, EAST], "one name")
    with pytest.raises(LedgerError, match="two live identities"):
        any_ledger.record_same_broker("p", "s", [EAST, EAST + "#epoch0"], "retired")


def test_the_audit_reports_recorded_names_without_a_broker(any_ledger: Ledger) -> None:
    """The record alone makes the offsets both names committed a finding (no broker given, or the
    chunk gone); a recorded name without a history is a note; nothing recorded: nothing found."""
    from streamledger.batch.proof import check_identities

    led = any_ledger
    commit(led, "p", SourceRef(EAST, "s"), 10, 1, ChunkPrint(0, 1000, 7))
    commit(led, "p", SourceRef(WEST, "s"), 70, 2, ChunkPrint(0, 1000, 7))
    assert check_identities(led, led.ranges("p"), None) == ([], [])
    led.record_same_broker("p", "s", [EAST, WEST], "found")
    found, notes = check_identities(led, led.ranges("p"), None)
    assert [(v.kind.value, v.broker, v.start, v.end) for v in found] == [("overlap", WEST, 0, 10)], found
    assert "recorded" in found[0].detail and notes == []
    commit(led, "p", SourceRef(EAST, "t"), 5, 3, ChunkPrint(0, 2000, 8))
    led.record_same_broker("p", "t", [EAST, NORTH], "refused")  # north was refused: no history of its own
    found, notes = check_identities(led, led.ranges("p"), None)
    assert len(found) == 1 and [(v.kind.value, v.stream, v.broker) for v in notes] == [
        ("named_twice", "t", EAST)], notes
    assert NORTH in notes[0].detail
