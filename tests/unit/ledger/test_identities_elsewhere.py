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


def test_a_distinct_verdict_is_recorded_for_both_names_and_wins_over_later_findings(
        any_ledger: Ledger) -> None:
    """The operator's verdict that two names are two brokers (mirrors a chunk print cannot tell
    apart) replaces a one-broker record, is read by both names' positions as such, and a later
    finding of the pair records nothing."""
    led = any_ledger
    commit(led, "p", SourceRef(EAST, "s"), 10, 1, ChunkPrint(0, 1000, 7))
    assert led.record_same_broker("p", "s", [EAST, WEST], "found") == 2
    assert len(led.record_distinct_brokers(WEST, EAST, pipeline="p", why="mirrors")) == 1  # one stream judged
    assert led.record_same_broker("p", "s", [EAST, WEST], "found again") == 0
    west, east = led.positions("p", [SourceRef(WEST, "s"), SourceRef(EAST, "s")])
    assert [(r.other, r.distinct, r.why, r.other_end) for r in west.same_broker] == [
        (EAST, True, "mirrors", 10)]
    assert [(r.other, r.distinct) for r in east.same_broker] == [(WEST, True)]
    assert sorted((r.source.broker, r.other, r.distinct) for r in led.same_broker()) == [
        (EAST, WEST, True), (WEST, EAST, True)]
    # three names found one broker: the pairs not judged distinct are recorded, the judged one is not
    assert led.record_same_broker("p", "s", [EAST, WEST, NORTH], "three") == 4
    assert sorted((r.source.broker, r.other, r.distinct) for r in led.same_broker("p")) == [
        (EAST, NORTH, False), (EAST, WEST, True), (NORTH, EAST, False), (NORTH, WEST, False),
        (WEST, EAST, True), (WEST, NORTH, False)]


def test_a_distinct_verdict_needs_two_live_names_and_something_to_judge(any_ledger: Ledger) -> None:
    led = any_ledger
    with pytest.raises(LedgerError, match="two live identities"):
        led.record_distinct_brokers(EAST, EAST, pipeline="p", stream="s")
    with pytest.raises(LedgerError, match="nothing to judge"):
        led.record_distinct_brokers(EAST, WEST, pipeline="p")  # no history, no record, no stream named
    assert len(led.record_distinct_brokers(EAST, WEST, pipeline="p", stream="s")) == 1  # named: judged ahead
    assert len(led.record_distinct_brokers(EAST, WEST, pipeline="p", stream="s")) == 1  # again: kept
    commit(led, "q", SourceRef(WEST, "t"), 4, 2, ChunkPrint(0, 1000, 7))
    commit(led, "q", SourceRef(EAST, "u"), 4, 3, ChunkPrint(0, 1000, 7))
    assert len(led.record_distinct_brokers(EAST, WEST)) == 3  # every pipeline's streams either name read
    assert sorted((r.pipeline, r.source.stream) for r in led.same_broker() if r.source.broker == EAST) == [
        ("p", "s"), ("q", "t"), ("q", "u")]


def test_the_batch_rule_and_the_audit_respect_a_distinct_verdict(any_ledger: Ledger) -> None:
    """``named_twice_because`` refuses nothing for a pair judged distinct (neither by the record nor
    by a chunk: the judged name's print is not even asked about, so no broker is needed here), and
    the audit neither reports nor records them as one (a note names the verdict it relied on); before
    the verdict it names both cures."""
    from streamledger.batch.identity import named_twice_because
    from streamledger.batch.proof import check_identities

    led = any_ledger
    commit(led, "p", SourceRef(EAST, "s"), 10, 1, ChunkPrint(0, 1000, 7))
    commit(led, "p", SourceRef(WEST, "s"), 10, 2, ChunkPrint(0, 1000, 7))
    led.record_same_broker("p", "s", [EAST, WEST], "found")
    found, _notes = check_identities(led, led.ranges("p"), None)
    assert found and "distinct-brokers" in found[0].detail and "rename-broker" in found[0].detail
    led.record_distinct_brokers(EAST, WEST, pipeline="p", stream="s")
    west = led.position("p", SourceRef(WEST, "s"))
    assert [(r.other, r.distinct) for r in west.same_broker] == [(EAST, True)]
    assert named_twice_because(None, "s", "p", WEST, west) is None
    found, notes = check_identities(led, led.ranges("p"), None)
    assert found == []  # no violation: each broker's copy read once, as judged; but said aloud
    assert [(n.start, n.end) for n in notes] == [(0, 10)] and "judged them two brokers" in notes[0].detail
    assert all(r.distinct for r in led.same_broker("p"))


def test_rename_broker_carries_a_distinct_verdict_and_clears_it_with_the_pair(any_ledger: Ledger) -> None:
    """The verdict follows the name as a record does; a rename that makes the pair one name drops
    it; a verdict meeting a one-broker record of the renamed pair wins (the operator's word)."""
    led = any_ledger
    commit(led, "p", SourceRef(EAST, "s"), 10, 1, ChunkPrint(0, 1000, 7))
    led.record_distinct_brokers(EAST, WEST, pipeline="p", stream="s")
    assert led.rename_broker(WEST, NORTH) == 0
    assert sorted((r.source.broker, r.other, r.distinct) for r in led.same_broker("p")) == [
        (EAST, NORTH, True), (NORTH, EAST, True)]
    led.record_same_broker("p", "s", [EAST, WEST], "found")
    assert led.rename_broker(NORTH, WEST) == 0  # the verdict meets the record of the same pair
    assert sorted((r.source.broker, r.other, r.distinct) for r in led.same_broker("p")) == [
        (EAST, WEST, True), (WEST, EAST, True)]
    assert led.rename_broker(WEST, EAST) == 0  # one name now: the verdict goes with the pair
    assert led.same_broker() == []
