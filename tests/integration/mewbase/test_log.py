"""MewbaseLog: a channel as an offset-addressed log, the calls a bounded batch makes (TEST DOUBLE server)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from streamledger.protocol.mewbase import (
    ChannelNotFound,
    InvalidRequest,
    MewbaseClient,
    MewbaseLog,
    OffsetOutOfRange,
    StoreNotVerified,
)
from streamledger.protocol.rabbitmq import OffsetSpec
from tests.support.mewbase_emulator import MewbaseServerEmulator

Make = Callable[..., MewbaseServerEmulator]


@pytest.fixture(params=[True, False], ids=["stats", "scan"])
def emu(request: pytest.FixtureRequest, make_emulator: Make) -> MewbaseServerEmulator:
    """With channel statistics in ``_mb.channels``, and without (the client scans instead)."""
    return make_emulator(channel_stats=request.param)


@pytest.fixture
def log(emu: MewbaseServerEmulator) -> Iterator[MewbaseLog]:
    with MewbaseLog.connect(emu.url(), timeout=3, probe_timeout=0.3) as opened:
        yield opened


def test_empty_channel(emu: MewbaseServerEmulator, log: MewbaseLog) -> None:
    emu.create_channel("empty")
    assert log.committed_tail("empty") == 0
    assert log.first_offset("empty") == 0  # == tail on an empty channel
    assert log.resolve_offset("empty", "last") == 0
    assert log.resolve_offset("empty", OffsetSpec.timestamp(5)) == 0
    assert list(log.read_range("empty", 0, 0)) == []


def test_first_and_tail_follow_the_log(emu: MewbaseServerEmulator, log: MewbaseLog) -> None:
    for pos in (40, 90, 91, 300):
        emu.append("c", {"at": pos}, pos=pos)
    info = log.channel_info("c")
    assert (info.first_pos, info.last_pos) == (40, 300) and info.exact == emu.channel_stats
    assert log.first_offset("c") == 40
    assert log.committed_tail("c") == 301
    emu.append("c", {"at": 777}, pos=777)
    assert log.committed_tail("c") == 778  # a scan resumes from the last position it saw
    assert log.first_offset("c") == 40
    got = [
        p for b in log.read_range("c", log.first_offset("c"), log.committed_tail("c")) for p in b.positions
    ]
    assert got == [40, 90, 91, 300, 777]


def test_unknown_channel(log: MewbaseLog) -> None:
    with pytest.raises(ChannelNotFound) as info:
        log.committed_tail("nope")
    assert "'nope'" in str(info.value) and "\n" not in str(info.value)


def test_resolve_offset(emu: MewbaseServerEmulator, log: MewbaseLog) -> None:
    for pos, stamp in ((10, 1000), (20, 2000), (35, 2000), (50, 3000)):
        emu.append("t", {"at": pos}, pos=pos, timestamp=stamp)
    assert log.resolve_offset("t", OffsetSpec.timestamp(0)) == 10
    assert log.resolve_offset("t", OffsetSpec.timestamp(1500)) == 20
    assert log.resolve_offset("t", OffsetSpec.timestamp(2000)) == 20
    assert log.resolve_offset("t", "timestamp:3000") == 50
    assert log.resolve_offset("t", OffsetSpec.timestamp(3001)) == 51  # none at or after: the tail
    assert log.resolve_offset("t", OffsetSpec.first()) == 10
    assert log.resolve_offset("t", OffsetSpec.last()) == 50
    assert log.resolve_offset("t", OffsetSpec.next()) == 51
    assert log.resolve_offset("t", "tail") == 51
    assert log.resolve_offset("t", OffsetSpec.offset(33)) == 33
    with pytest.raises(InvalidRequest):
        log.resolve_offset("t", object())


def test_stored_position_round_trip(emu: MewbaseServerEmulator, log: MewbaseLog) -> None:
    positions = [emu.append("s", {"n": i}) for i in range(10)]
    assert log.query_offset("s", "pipe") is None
    log.store_offset_verified("s", "pipe", positions[4])
    assert log.query_offset("s", "pipe") == positions[4]
    assert emu.durable["s/pipe"]["lastAcked"] == positions[4]
    # A position in a gap can be stored too (everything up to it is processed).
    log.store_offset_verified("s", "pipe", positions[7] - 1)
    assert log.query_offset("s", "pipe") == positions[7] - 1
    # Moving backwards works (the durable subscription is re-created).
    log.store_offset_verified("s", "pipe", positions[1])
    assert log.query_offset("s", "pipe") == positions[1]
    # Storing the current value again sends no subscription at all.
    subscribes = len(emu.frames_of("SUBSCRIBE"))
    log.store_offset_verified("s", "pipe", positions[1])
    assert len(emu.frames_of("SUBSCRIBE")) == subscribes
    # References are independent, and resume = stored + 1 on the server side.
    assert log.query_offset("s", "other") is None
    with MewbaseClient.connect(emu.url(), timeout=2) as reader:
        sub = reader.subscribe("s", durable_id="s/pipe")
        assert sub.receive(2).pos == positions[2]


def test_storing_beyond_the_last_event_or_with_a_bad_name(
    emu: MewbaseServerEmulator, log: MewbaseLog
) -> None:
    positions = [emu.append("s", {"n": i}) for i in range(3)]
    last = positions[-1]
    log.store_offset_verified("s", "pipe", positions[0])
    with pytest.raises(OffsetOutOfRange, match=f"cannot store position {last + 1} for 'pipe'"):
        log.store_offset_verified("s", "pipe", last + 1, timeout=0.3)
    assert log.query_offset("s", "pipe") == positions[0]  # the stored position was left alone
    emu.create_channel("empty")
    with pytest.raises(OffsetOutOfRange, match="the last event is at none"):
        log.store_offset_verified("empty", "pipe", 0)
    with pytest.raises(InvalidRequest, match="no '/'"):
        log.query_offset("a/b", "pipe")
    with pytest.raises(InvalidRequest, match="position >= 0"):
        log.store_offset_verified("s", "pipe", -1)


def test_a_server_that_ignores_the_ack_position_is_caught(make_emulator: Make) -> None:
    # The draft's ACKEV acknowledges "the last event received": storing a position in a gap cannot
    # work there, and the read-back says so instead of silently storing another position.
    emu = make_emulator(ackev_pos=False)
    positions = [emu.append("s", {"n": i}) for i in range(5)]
    with MewbaseLog.connect(emu.url(), timeout=2) as log:
        with pytest.raises(StoreNotVerified, match=f"stored position {positions[2] - 1} for 'pipe'"):
            log.store_offset_verified("s", "pipe", positions[2] - 1, timeout=0.5)
        assert log.query_offset("s", "pipe") not in (None, positions[2] - 1)


def test_read_range_in_the_batch_cores_call_shape(emu: MewbaseServerEmulator, log: MewbaseLog) -> None:
    for pos in (3, 8, 13):
        emu.append("r", {"at": pos}, pos=pos)
    batches = log.read_range("r", 4, 13, decode="raw")
    assert [p for b in batches for p in b.offsets] == [8]
    assert list(log.read_range("r", 9, 13, decode="raw")) == []  # only a gap inside: no batch at all
    with pytest.raises(InvalidRequest, match="use 'raw' or 'bson'"):
        log.read_range("r", 0, 13, decode="amqp")


def test_a_scan_of_a_channel_written_without_pause_still_ends(make_emulator: Make) -> None:
    import threading
    import time

    emu = make_emulator(channel_stats=False)
    emu.append("busy", {"n": -1})
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            emu.append("busy", {"n": n})
            n += 1
            time.sleep(0.01)  # far more often than the probe timeout

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        with MewbaseLog.connect(emu.url(), timeout=1.0, probe_timeout=0.5) as log:
            started = time.monotonic()
            tail = log.committed_tail("busy")
            assert time.monotonic() - started < 4
            assert tail - 1 in emu.positions("busy")  # a real, persisted position + 1
            assert log.committed_tail("busy") >= tail
    finally:
        stop.set()
        thread.join()
