"""The mewbase client against the emulated server (TEST DOUBLE, not a real mewbase server)."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable

import bson
import pytest

from streamledger.protocol.mewbase import (
    AuthenticationFailed,
    BinderNotFound,
    ChannelNotFound,
    ConnectionClosed,
    EventTooLarge,
    FrameLengthError,
    InvalidRequest,
    MewbaseClient,
    MewbaseConnectionError,
    MewbaseTimeout,
    ServerError,
    TransactionError,
    UnsupportedVersion,
)
from tests.support.mewbase_emulator import MewbaseServerEmulator

Make = Callable[..., MewbaseServerEmulator]


# -- CONNECT ----------------------------------------------------------------------------------------


def test_connect_with_credentials(make_emulator: Make) -> None:
    emu = make_emulator(users={"alice": "s3cret"})
    with MewbaseClient.connect(emu.url("alice", "s3cret"), timeout=2) as client:
        client.publish("orders", {"id": 1})
    connect = emu.frames_of("CONNECT")[0]
    assert connect == {"version": "1.0", "username": "alice", "password": "s3cret"}  # no rID (draft)


@pytest.mark.parametrize("url_auth", [("alice", "wrong-pass"), ("mallory", "s3cret"), (None, None)])
def test_refused_credentials_raise_without_the_password(make_emulator: Make, url_auth: tuple) -> None:
    emu = make_emulator(users={"alice": "s3cret"})
    with pytest.raises(AuthenticationFailed) as info:
        MewbaseClient.connect(emu.url(*url_auth), timeout=2)
    text = str(info.value)
    assert info.value.err_code == "AUTHENTICATION_FAILED" and "\n" not in text
    assert "wrong-pass" not in text and "s3cret" not in text
    assert f"127.0.0.1:{emu.port}" in text


def test_unsupported_version_is_refused(make_emulator: Make) -> None:
    emu = make_emulator(versions=("2.0",))
    with pytest.raises(UnsupportedVersion, match="UNSUPPORTED_VERSION"):
        MewbaseClient.connect(emu.url(), timeout=2)
    with MewbaseClient.connect(emu.url(), timeout=2, version="2.0") as client:
        client.publish("c", {})


def test_connect_response_with_any_rid_is_accepted(make_emulator: Make) -> None:
    emu = make_emulator(connect_rid=4711)
    with MewbaseClient.connect(emu.url(), timeout=2) as client:
        client.publish("c", {"x": 1})  # its rID 1 is not confused with the CONNECT answer
    assert len(emu.events("c")) == 1


def test_connection_refused_and_unanswered_connect(make_emulator: Make, closed_port: int) -> None:
    with pytest.raises(MewbaseConnectionError, match=f"127.0.0.1:{closed_port}"):
        MewbaseClient.connect(f"mewbase://u:pw@127.0.0.1:{closed_port}", timeout=1)
    emu = make_emulator()
    emu.ignore_next("CONNECT")
    started = time.monotonic()
    with pytest.raises(MewbaseTimeout, match=r"did not answer CONNECT within 0\.5s"):
        MewbaseClient.connect(emu.url(), timeout=0.5)
    assert 0.4 < time.monotonic() - started < 3


# -- PUBLISH ----------------------------------------------------------------------------------------


def test_publish_returns_once_persisted(emulator: MewbaseServerEmulator, client: MewbaseClient) -> None:
    client.publish("orders", {"id": 1, "item": "tea"})
    # The RESPONSE is the confirm: the event is stored when publish returns.
    assert [doc for _, _, doc in emulator.events("orders")] == [{"id": 1, "item": "tea"}]
    client.publish("orders", bson.encode({"id": 2}))
    positions = emulator.positions("orders")
    assert len(positions) == 2 and positions[0] < positions[1]


def test_publish_many_pipelines_and_keeps_order(
    emulator: MewbaseServerEmulator, client: MewbaseClient
) -> None:
    assert client.publish_many("orders", ({"n": i} for i in range(1000)), window=64) == 1000
    assert [doc["n"] for _, _, doc in emulator.events("orders")] == list(range(1000))
    publishes = emulator.frames_of("PUBLISH")
    assert len({p["rID"] for p in publishes}) == 1000  # distinct rIDs per connection


def test_refused_publishes_raise_and_leave_the_connection_usable(
    emulator: MewbaseServerEmulator, client: MewbaseClient
) -> None:
    emulator.fail_next_publishes(1)
    with pytest.raises(ServerError, match="STORAGE_FAILED") as info:
        client.publish("orders", {"id": 1})
    assert info.value.err_msg == "failed to persist"
    client.publish("orders", {"id": 2})
    emulator.fail_next_publishes(1)
    with pytest.raises(ServerError, match="STORAGE_FAILED"):
        client.publish_many("orders", ({"n": i} for i in range(10)), window=4)
    # Stopped sending after the refusal; the ones in flight were confirmed, the connection stays in sync.
    stored = [doc.get("n") for _, _, doc in emulator.events("orders")][1:]
    assert stored == list(range(1, len(stored) + 1)) and len(stored) < 10
    client.publish("orders", {"id": 3})


def test_oversized_event_is_refused(make_emulator: Make) -> None:
    emu = make_emulator(max_event_size=100)
    with MewbaseClient.connect(emu.url(), timeout=2) as client, pytest.raises(EventTooLarge):
        client.publish("c", {"pad": "x" * 200})


def test_unanswered_publish_times_out_and_a_late_answer_is_dropped(
    emulator: MewbaseServerEmulator, client: MewbaseClient
) -> None:
    emulator.ignore_next("PUBLISH")
    started = time.monotonic()
    with pytest.raises(MewbaseTimeout, match=r"PUBLISH to channel 'orders': no response .* within 0.3s"):
        client.publish("orders", {"id": 1}, timeout=0.3)
    assert time.monotonic() - started < 2
    client.publish("orders", {"id": 2})
    assert [doc for _, _, doc in emulator.events("orders")] == [{"id": 2}]


def test_unknown_channel_when_channels_are_not_created_on_demand(make_emulator: Make) -> None:
    emu = make_emulator(auto_create_channels=False)
    with MewbaseClient.connect(emu.url(), timeout=2) as client:
        with pytest.raises(ChannelNotFound):
            client.publish("nope", {})
        with pytest.raises(ChannelNotFound):
            client.subscribe("nope", start_pos=0)


# -- transactions -----------------------------------------------------------------------------------


def test_transaction_commit_makes_events_visible_together(
    emulator: MewbaseServerEmulator, client: MewbaseClient
) -> None:
    emulator.create_channel("a")
    with MewbaseClient.connect(emulator.url(), timeout=2) as watcher:
        sub = watcher.subscribe("a")  # only new events
        with client.transaction() as tx:
            tx.publish("a", {"n": 1})
            tx.publish("b", {"n": 2})
            tx.publish("a", {"n": 3})
            assert emulator.events("a") == [] and sub.poll(0.2) is None  # staged, not visible
        assert [d["n"] for _, _, d in emulator.events("a")] == [1, 3]
        assert [d["n"] for _, _, d in emulator.events("b")] == [2]
        assert [sub.receive(2).document()["n"] for _ in range(2)] == [1, 3]
    starts = emulator.frames_of("STARTTX")
    commits = emulator.frames_of("COMMITTX")
    assert len(starts) == len(commits) == 1 and starts[0]["sessID"] == commits[0]["sessID"]
    assert all(p["sessID"] == starts[0]["sessID"] for p in emulator.frames_of("PUBLISH"))


def test_transaction_abort_and_errors(emulator: MewbaseServerEmulator, client: MewbaseClient) -> None:
    with pytest.raises(RuntimeError), client.transaction() as tx:
        tx.publish("a", {"n": 1})
        raise RuntimeError("boom")
    assert emulator.events("a") == [] and len(emulator.frames_of("ABORTTX")) == 1
    sess = client.start_tx()
    with pytest.raises(TransactionError, match="TX_IN_PROGRESS"):
        client.start_tx(sess)
    client.abort_tx(sess)
    with pytest.raises(TransactionError, match="NO_TX"):
        client.commit_tx(sess)
    with pytest.raises(TransactionError, match="NO_TX"):
        client.abort_tx(12345)


# -- subscriptions ----------------------------------------------------------------------------------


def test_subscribe_by_position_over_gaps(emulator: MewbaseServerEmulator, client: MewbaseClient) -> None:
    for pos in (10, 20, 30, 45):
        emulator.append("g", {"at": pos}, pos=pos)
    with client.subscribe("g", start_pos=11) as sub:  # 11 is in a gap: delivery starts at 20
        got = [sub.receive(2) for _ in range(3)]
        assert [e.pos for e in got] == [20, 30, 45]
        assert [e.document()["at"] for e in got] == [20, 30, 45]
        assert sub.poll(0.1) is None


def test_subscribe_by_timestamp_matcher_and_live_events(
    emulator: MewbaseServerEmulator, client: MewbaseClient
) -> None:
    for i, stamp in enumerate((1000, 2000, 3000)):
        emulator.append("t", {"i": i, "kind": "even" if i % 2 == 0 else "odd"}, timestamp=stamp)
    with client.subscribe("t", start_timestamp=1500) as sub:
        assert [sub.receive(2).timestamp for _ in range(2)] == [2000, 3000]
    with client.subscribe("t", start_pos=0, matcher={"kind": "even"}) as sub:
        assert [sub.receive(2).document()["i"] for _ in range(2)] == [0, 2]
        assert sub.poll(0.1) is None
    with client.subscribe("t") as sub:  # without a start: only what is published from now on
        assert sub.poll(0.2) is None
        client.publish("t", {"i": 3, "kind": "odd"})
        assert sub.receive(2).document()["i"] == 3


def test_events_and_responses_interleave_on_one_connection(
    emulator: MewbaseServerEmulator, client: MewbaseClient
) -> None:
    emulator.create_channel("live")
    sub = client.subscribe("live")
    # Publishing while our own subscription streams the same events back: no deadlock, no loss.
    assert client.publish_many("live", ({"n": i} for i in range(2000)), window=128) == 2000
    assert [sub.receive(2).document()["n"] for _ in range(2000)] == list(range(2000))
    sub.close()
    assert [f["subID"] for f in emulator.frames_of("SUBCLOSE")] == [sub.sub_id]


def test_durable_subscription_resumes_after_the_acknowledged_position(
    emulator: MewbaseServerEmulator, client: MewbaseClient
) -> None:
    positions = [emulator.append("d", {"n": i}) for i in range(5)]
    sub = client.subscribe("d", start_pos=0, durable_id="d/reader")
    assert [sub.receive(2).pos for _ in range(3)] == positions[:3]
    sub.ack(positions[1])
    sub.close()
    assert emulator.durable["d/reader"]["lastAcked"] == positions[1]
    # Resubscribing resumes after the acknowledged event; startPos is ignored for a known durableID.
    sub = client.subscribe("d", start_pos=0, durable_id="d/reader")
    assert sub.receive(2).pos == positions[2]
    sub.ack()  # default: the last event received
    sub.unsubscribe()  # deletes the durable state
    assert "d/reader" not in emulator.durable
    acks = emulator.frames_of("ACKEV")
    assert acks == [{"subID": 0, "pos": positions[1]}, {"subID": 1, "pos": positions[2]}]


# -- queries ----------------------------------------------------------------------------------------


def test_query_acknowledges_every_result_within_the_window(make_emulator: Make) -> None:
    emu = make_emulator(query_window=3)
    for i in range(25):
        emu.put_document("customers", f"c{i:02d}", {"tier": "gold" if i % 5 == 0 else "basic", "n": i})
    with MewbaseClient.connect(emu.url(), timeout=2) as client:
        everything = client.query("customers")
        assert [d["n"] for d in everything] == list(range(25))
        gold = client.query("customers", {"tier": "gold"})
        assert [d["id"] for d in gold] == ["c00", "c05", "c10", "c15", "c20"]
        assert client.query("customers", {"tier": "platinum"}) == []
        with pytest.raises(BinderNotFound, match="NO_SUCH_BINDER"):
            client.query("nope")
    assert 1 <= emu.max_unacked_seen <= 3
    assert len(emu.frames_of("QUERYACK")) == 30
    assert len({q["queryID"] for q in emu.frames_of("QUERY")}) == 4


def test_unanswered_query_times_out(emulator: MewbaseServerEmulator, client: MewbaseClient) -> None:
    emulator.put_document("b", "x", {})
    emulator.ignore_next("QUERY")
    with pytest.raises(MewbaseTimeout, match=r"no QUERYRESPONSE within 0\.3s"):
        client.query("b", timeout=0.3)
    assert client.query("b") == [{"id": "x"}]


# -- broken peers -----------------------------------------------------------------------------------


def test_a_frame_length_over_the_limit_is_refused_before_reading_on(
    emulator: MewbaseServerEmulator,
) -> None:
    client = MewbaseClient.connect(emulator.url(), timeout=2, max_frame_size=1 << 20)
    emulator.create_channel("c")
    sub = client.subscribe("c")
    emulator.send_raw(struct.pack("<i", (1 << 20) + 1))  # announces one byte more than allowed
    with pytest.raises(FrameLengthError, match=r"outside the accepted 5\.\.1048576"):
        sub.poll(2)
    with pytest.raises(ConnectionClosed, match="unusable after an earlier error"):
        client.publish("c", {})


def test_server_closing_the_connection(emulator: MewbaseServerEmulator, client: MewbaseClient) -> None:
    emulator.ignore_next("PUBLISH")
    timer = threading.Timer(0.2, emulator.close_all_connections)
    timer.start()
    with pytest.raises(ConnectionClosed, match="closed the connection"):
        client.publish("c", {}, timeout=5)
    timer.join()


def test_events_that_overtake_their_subresponse_are_kept(make_emulator: Make) -> None:
    emu = make_emulator(events_before_subresponse=True)
    positions = [emu.append("early", {"n": i}) for i in range(5)]
    with MewbaseClient.connect(emu.url(), timeout=2) as client:
        with client.subscribe("early", start_pos=0) as sub:
            assert [sub.receive(2).pos for _ in range(5)] == positions
        assert client.connection.dropped_events == 0
        assert [p for b in client.read_range("early", 0, positions[-1] + 1) for p in b.positions] == positions


def test_acknowledging_beyond_what_was_received_is_refused_locally(
    emulator: MewbaseServerEmulator, client: MewbaseClient
) -> None:
    positions = [emulator.append("acks", {"n": i}) for i in range(3)]
    with client.subscribe("acks", start_pos=0, durable_id="acks/r") as sub:
        with pytest.raises(InvalidRequest, match="has received no event"):
            sub.ack()
        first = sub.receive(2)
        with pytest.raises(InvalidRequest, match=f"cannot acknowledge position {positions[2]} beyond"):
            sub.ack(positions[2])
        sub.ack(first.pos)
    assert emulator.violations == []
