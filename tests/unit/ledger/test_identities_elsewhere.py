"""``SourcePosition.elsewhere`` on both ledgers: what the batch and the streaming recorder ask a broker
before they claim (is it the broker another identity's history of the stream read?) and nothing more:
the newest print of each other live identity's history of the same pipeline and stream."""

from __future__ import annotations

from streamledger.ledger import Ledger, RunIdentity, SourceRef
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
