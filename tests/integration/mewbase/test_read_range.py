"""Exact bounded reads ``[start, end)`` over positions with gaps (emulated server, TEST DOUBLE)."""

from __future__ import annotations

import itertools
import random
import threading
import time

import pytest

from streamledger.protocol.mewbase import (
    ChannelNotFound,
    InvalidRequest,
    MewbaseClient,
    OffsetOutOfRange,
)
from tests.support.mewbase_emulator import MewbaseServerEmulator

SEEDED = [10, 20, 30, 45, 46, 100]


def read(client: MewbaseClient, channel: str, start: int, end: int, **kw: object) -> list[int]:
    return [pos for batch in client.read_range(channel, start, end, **kw) for pos in batch.positions]


@pytest.fixture
def gaps(emulator: MewbaseServerEmulator) -> str:
    for pos in SEEDED:
        emulator.append("gaps", {"at": pos}, pos=pos, timestamp=1_000 + pos)
    return "gaps"


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 101, SEEDED),
        (10, 46, [10, 20, 30, 45]),
        (11, 45, [20, 30]),
        (21, 30, []),  # nothing inside, but the event at 30 >= end closes the range
        (46, 47, [46]),  # an event at end - 1 is the last the range can hold: no wait for more
        (31, 101, [45, 46, 100]),
        (100, 101, [100]),
    ],
)
def test_exact_ranges_over_gaps(
    client: MewbaseClient, gaps: str, start: int, end: int, expected: list[int]
) -> None:
    started = time.monotonic()
    assert read(client, gaps, start, end, timeout=10) == expected
    assert time.monotonic() - started < 5  # none of these waits for the timeout


def test_an_end_beyond_what_the_server_holds_fails_after_the_timeout(
    client: MewbaseClient, gaps: str
) -> None:
    started = time.monotonic()
    with pytest.raises(OffsetOutOfRange) as info:
        read(client, gaps, 46, 102, timeout=0.5)
    elapsed = time.monotonic() - started
    assert 0.45 <= elapsed < 3
    text = str(info.value)
    assert "end 102 lies beyond what the server holds" in text
    assert "no event at or after position 101 within 0.5s (the last was at position 100)" in text
    with pytest.raises(OffsetOutOfRange, match="no event at all"):
        read(client, gaps, 101, 200, timeout=0.3)
    # The failed read unsubscribed; the connection is still in step.
    assert read(client, gaps, 0, 21) == [10, 20]


def test_a_read_completes_when_its_end_is_published_meanwhile(
    emulator: MewbaseServerEmulator, client: MewbaseClient, gaps: str
) -> None:
    timer = threading.Timer(0.3, lambda: emulator.append(gaps, {"late": 1}, pos=500))
    timer.start()
    assert read(client, gaps, 40, 200, timeout=5) == [45, 46, 100]
    timer.join()


def test_batches_are_columnar_and_carry_the_events(
    emulator: MewbaseServerEmulator, client: MewbaseClient
) -> None:
    client.publish_many("cols", ({"n": i, "tag": "x" * (i % 7)} for i in range(50)))
    truth = emulator.events("cols")
    tail = truth[-1][0] + 1
    batches = list(client.read_range("cols", 0, tail, batch_events=7))
    assert [len(b) for b in batches] == [7] * 7 + [1]
    assert [p for b in batches for p in b.positions] == [p for p, _, _ in truth]
    assert [t for b in batches for t in b.timestamps] == [t for _, t, _ in truth]
    assert [d for b in batches for d in b.documents()] == [d for _, _, d in truth]
    first = batches[0]
    assert first.channel == "cols" and first.offsets is first.positions and first.bodies is first.events


def test_random_ranges_match_the_servers_log(emulator: MewbaseServerEmulator, client: MewbaseClient) -> None:
    rng = random.Random(15)
    client.publish_many("rand", ({"pad": "p" * rng.randrange(0, 300)} for _ in range(400)))
    positions = emulator.positions("rand")
    assert len(set(b - a for a, b in itertools.pairwise(positions))) > 50  # real gaps
    tail = positions[-1] + 1
    for _ in range(40):
        a, b = sorted(rng.randrange(0, tail + 1) for _ in range(2))
        assert read(client, "rand", a, b, batch_events=rng.randrange(1, 64)) == [
            p for p in positions if a <= p < b
        ]


def test_empty_and_invalid_ranges_are_decided_at_call_time(
    emulator: MewbaseServerEmulator, client: MewbaseClient, gaps: str
) -> None:
    before = len(emulator.frames)
    assert list(client.read_range(gaps, 30, 30)) == []
    assert len(emulator.frames) == before  # no network for an empty range
    with pytest.raises(InvalidRequest, match="start 31 is after its end 30"):
        client.read_range(gaps, 31, 30)
    with pytest.raises(InvalidRequest, match="outside"):
        client.read_range(gaps, -1, 30)
    with pytest.raises(InvalidRequest, match="batch_events"):
        client.read_range(gaps, 0, 30, batch_events=0)
    with pytest.raises(ChannelNotFound):
        read(client, "missing", 0, 10)


def test_an_abandoned_read_unsubscribes(emulator: MewbaseServerEmulator, client: MewbaseClient) -> None:
    client.publish_many("big", ({"n": i} for i in range(300)))
    tail = emulator.positions("big")[-1] + 1
    batches = client.read_range("big", 0, tail, batch_events=10)
    assert len(next(batches)) == 10
    batches.close()  # type: ignore[attr-defined]
    assert len(emulator.frames_of("UNSUBSCRIBE")) == 1
    assert read(client, "big", 0, tail) == emulator.positions("big")
