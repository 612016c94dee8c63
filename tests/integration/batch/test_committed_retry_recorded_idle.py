"""Migration 0017's side effect. A later try handed back a range its run key
committed is recorded with the run in ``streamledger_idle_run``, so rule 1 answers that key "nothing
new" (at the tail, unstored) on every source with a history it never claimed. Attacked: a super
stream gaining a partition between attempts, a stream added to the batch between attempts, the
answer's order dependence, Airflow map indices, a pinned claim by a key recorded so, a streaming
micro-batch replayed. The question each time: is a range left unread for good while the audit is
CLEAN? Ledger level, SQLite and PostgreSQL (the server-side claim 0017 replaced)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from streamledger.batch.microbatch import MicroBatchRecorder
from streamledger.ledger import ClaimRequest, Ledger, OffsetRange, RangeStatus, RunIdentity, SourceRef

pytestmark = pytest.mark.timeout(120)

BROKER = "rabbitmq-stream://127.0.0.1:5552/%2F"


def _pipe() -> str:
    return f"p-s12b-{uuid.uuid4().hex[:8]}"


def _run(run_id: str, try_number: int = 1, map_index: int = -1) -> RunIdentity:
    return RunIdentity("dag", run_id, "t", map_index, try_number)


def _done(led: Ledger, rng: OffsetRange) -> None:
    if rng.recorded and rng.status == RangeStatus.CLAIMED:
        led.commit(rng.id, records=rng.end - rng.start, first_seen=rng.start, last_seen=rng.end - 1,
                   output=None)


def _covered(led: Ledger, pipe: str, src: SourceRef, end: int) -> None:
    """Every offset of [0, end) committed exactly once, and the ledger's audit CLEAN."""
    spans = sorted((r.start, r.end) for r in led.ranges(pipe) if r.source == src
                   and r.status == RangeStatus.COMMITTED and r.end > r.start)
    at = 0
    for start, stop in spans:
        assert start == at, (src.stream, spans)
        at = stop
    assert at == end, (src.stream, spans)
    report = led.audit(pipe)
    assert report.clean, report.to_text()


def test_a_partition_added_between_attempts_is_read_by_the_retry_or_the_next_run(any_ledger: Ledger) -> None:
    """Held: a partition without a history is never answered "nothing new" (rule 1 needs a tail);
    the retry claims it from its first offset, whatever order the batch asks in, and a partition the
    retry could not read is the next run's."""
    led, pipe = any_ledger, _pipe()
    p0, p1, p2 = (SourceRef(BROKER, f"s-{i}", "s") for i in range(3))
    _done(led, led.claim(pipe, p0, 5, _run("r"), initial_start=0))
    for try_number, asked in ((2, [p1, p0]), (3, [p0, p1, p2])):
        asks = [ClaimRequest(s, 5, initial_start=0) for s in asked]
        for rng in led.claim_many(pipe, asks, _run("r", try_number)):
            _done(led, rng)
    assert led.last_try(pipe, _run("r")) == 3
    nxt = led.claim_many(pipe, [ClaimRequest(s, 8, initial_start=0) for s in (p0, p1, p2)], _run("next"))
    assert [(r.start, r.end) for r in nxt] == [(5, 8), (5, 8), (5, 8)]
    for rng in nxt:
        _done(led, rng)
    for s in (p0, p1, p2):
        _covered(led, pipe, s, 8)


def test_a_stream_added_to_the_batch_between_attempts_is_deferred_not_skipped(any_ledger: Ledger) -> None:
    """Held: a stream with a history the key never claimed answers the retry "nothing new" at its
    tail (unstored), and the next run key reads from there: no offset left behind."""
    led, pipe = any_ledger, _pipe()
    a, b = SourceRef(BROKER, "a"), SourceRef(BROKER, "b")
    _done(led, led.claim(pipe, b, 4, _run("earlier"), initial_start=0))
    _done(led, led.claim(pipe, a, 5, _run("r"), initial_start=0))
    _done(led, led.claim(pipe, a, 5, _run("r", 2)))  # handed back: the run is recorded
    got = led.claim_many(pipe, [ClaimRequest(a, 7), ClaimRequest(b, 9)], _run("r", 3))
    assert [(r.start, r.end, r.recorded) for r in got] == [(0, 5, True), (4, 4, False)]
    nxt = led.claim_many(pipe, [ClaimRequest(a, 7), ClaimRequest(b, 9)], _run("next"))
    assert [(r.start, r.end) for r in nxt] == [(5, 7), (4, 9)]
    for rng in nxt:
        _done(led, rng)
    _covered(led, pipe, a, 7)
    _covered(led, pipe, b, 9)


def test_the_retry_of_a_committed_run_answers_a_new_stream_alike_in_one_claim_and_in_two(
        any_ledger: Ledger) -> None:
    """Held (both ledgers alike): the batch's one claim asks "was the run idle" before its first
    source records it, so a stream with a history asked beside the committed one is read by the
    first retry; asked alone after it (a second claim of the same try) it is deferred to the next run."""
    led, pipe = any_ledger, _pipe()
    a, b, c = SourceRef(BROKER, "a"), SourceRef(BROKER, "b"), SourceRef(BROKER, "c")
    for s in (b, c):
        _done(led, led.claim(pipe, s, 4, _run("earlier"), initial_start=0))
    _done(led, led.claim(pipe, a, 5, _run("r"), initial_start=0))
    got = led.claim_many(pipe, [ClaimRequest(a, 7), ClaimRequest(b, 9)], _run("r", 2))
    assert [(r.start, r.end, r.recorded) for r in got] == [(0, 5, True), (4, 9, True)]
    _done(led, got[1])
    alone = led.claim(pipe, c, 9, _run("r", 2))
    assert (alone.start, alone.end, alone.recorded) == (4, 4, False)
    _done(led, led.claim(pipe, c, 9, _run("next")))
    for s, end in ((a, 5), (b, 9), (c, 9)):
        _covered(led, pipe, s, end)


def test_a_retried_map_index_makes_no_other_index_idle(any_ledger: Ledger) -> None:
    led, pipe = any_ledger, _pipe()
    a, b = SourceRef(BROKER, "a"), SourceRef(BROKER, "b")
    _done(led, led.claim(pipe, b, 4, _run("earlier"), initial_start=0))
    _done(led, led.claim(pipe, a, 5, _run("r", map_index=0), initial_start=0))
    _done(led, led.claim(pipe, a, 5, _run("r", 2, map_index=0)))
    assert led.last_try(pipe, _run("r", map_index=0)) == 2 and led.last_try(pipe, _run("r", map_index=1)) == 0
    other = led.claim(pipe, b, 9, _run("r", 1, map_index=1))
    assert (other.start, other.end, other.recorded) == (4, 9, True)
    _done(led, other)
    _covered(led, pipe, b, 9)


def test_a_pinned_claim_by_a_key_recorded_idle_claims_its_interval(any_ledger: Ledger) -> None:
    """Held: rule 1's "nothing again" is for unpinned claims; a pinned interval of a key whose
    committed range was handed back to a retry is claimed and read."""
    led, pipe = any_ledger, _pipe()
    a, b = SourceRef(BROKER, "a"), SourceRef(BROKER, "b")
    _done(led, led.claim(pipe, b, 4, _run("earlier"), initial_start=0))
    t0 = datetime(2026, 11, 27, tzinfo=UTC)
    when = (t0, t0 + timedelta(hours=1))
    _done(led, led.claim(pipe, a, 5, _run("pin"), initial_start=0, span=(0, 5), interval=when))
    back = led.claim(pipe, a, 5, _run("pin", 2), span=(0, 5), interval=when)
    assert (back.start, back.end) == (0, 5) and led.last_try(pipe, _run("pin")) == 2
    pinned = led.claim(pipe, b, 9, _run("pin", 3), span=(4, 9), interval=when)
    assert (pinned.start, pinned.end, pinned.recorded) == (4, 9, True)
    _done(led, pinned)
    _covered(led, pipe, a, 5)
    _covered(led, pipe, b, 9)


def test_a_replayed_micro_batch_is_not_recorded_idle(any_ledger: Ledger) -> None:
    """Held: a streaming micro-batch's key carries no try (always 1), so a replay handed back its
    committed range records nothing and its stream is never answered "nothing new" by it."""
    led, pipe = any_ledger, _pipe()
    src = SourceRef(BROKER, "m")
    key = MicroBatchRecorder.run("q", 7, "m")
    _done(led, led.claim(pipe, src, 5, key, initial_start=0))
    back = led.claim(pipe, src, 9, key)
    assert (back.start, back.end) == (0, 5) and led.last_try(pipe, key) == 1
    _done(led, led.claim(pipe, src, 9, MicroBatchRecorder.run("q", 8, "m")))
    _covered(led, pipe, src, 9)
