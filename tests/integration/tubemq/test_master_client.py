"""MasterClient against the emulated master (TEST DOUBLE, not a real TubeMQ server)."""

from __future__ import annotations

import time

import pytest

from streamledger.protocol.tubemq import (
    CertificateFailure,
    Credentials,
    InvalidArgument,
    MasterClient,
    MasterResponseError,
    NoMasterAvailable,
    TubeMQConnectionError,
    TubeMQTimeout,
)
from streamledger.protocol.tubemq.connection import RpcConnection
from streamledger.protocol.tubemq.rpc import Method, Status
from tests.integration.tubemq.conftest import FAST
from tests.support.tubemq_emulator import TubeMQMasterEmulator


def _wait_until(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_producer_register_heartbeat_close(master: TubeMQMasterEmulator) -> None:
    with MasterClient([master.address], **FAST) as client:
        reg = client.register_producer(["demo", "unknown-topic"])
        assert reg.master == master.address_str
        assert reg.broker_checksum == master.broker_checksum
        # Broker 2 is announced with a blank port: the default 8123 applies.
        assert {b.broker_id: (b.host, b.port) for b in reg.brokers.values()} == {
            1: ("127.0.0.1", 8130),
            2: ("127.0.0.2", 8123),
        }
        assert reg.max_msg_size == 1048576
        assert [p.key for p in reg.partitions("demo")] == [
            "1:demo:0",
            "1:demo:1",
            "1:demo:2",
            "2:demo:0",
            "2:demo:1",
        ]
        assert reg.partitions("unknown-topic") == []
        register = master.calls_of(Method.PRODUCER_REGISTER)[0]
        assert register.brokerCheckSum == -1 and list(register.topicList) == ["demo", "unknown-topic"]
        assert register.clientId in master.producers
        client.heartbeat()
        beats = master.calls_of(Method.PRODUCER_HEARTBEAT)
        # Register is followed by a heartbeat at once; heartbeats echo the checksum register returned.
        assert [b.brokerCheckSum for b in beats] == [master.broker_checksum] * 2
        assert not register.HasField("authInfo")
    assert master.producers == {}
    assert [c.clientId for c in master.calls_of(Method.PRODUCER_CLOSE)] == [register.clientId]


def test_consumer_register_rebalance_heartbeat_close(master: TubeMQMasterEmulator) -> None:
    with MasterClient([master.address], **FAST) as client:
        reg = client.register_consumer("grp-1", ["demo"])
        assert reg.partitions == () and reg.client_id.startswith("grp-1_")
        reg = client.wait_for_partitions("grp-1", timeout=5)
        assert len(reg.partitions) == 5
        assert {p.key for p in reg.partitions} == {
            "1:demo:0",
            "1:demo:1",
            "1:demo:2",
            "2:demo:0",
            "2:demo:1",
        }
        assert reg.brokers[2].port == 8123
        # The rebalance was acknowledged with status DONE and the same id.
        assert [(r.rebalanceId, r.opType, r.status) for r in master.reports] == [(reg.rebalance_id, 1, 2)]
        consumer = master.consumers[reg.client_id]
        assert len(consumer.held) == 5
        client.heartbeat()
    assert master.consumers == {}
    assert len(master.calls_of(Method.CONSUMER_CLOSE)) == 1


def test_consumer_topic_not_deployed_is_a_typed_error(master: TubeMQMasterEmulator) -> None:
    with MasterClient([master.address], **FAST) as client, pytest.raises(MasterResponseError) as info:
        client.register_consumer("grp", ["nope"])
    assert info.value.err_code == 431
    assert "nope" in str(info.value) and "431" in str(info.value)
    # Not retried: the answer would not change.
    assert len(master.calls_of(Method.CONSUMER_REGISTER)) == 1


def test_failover_from_standby_to_active(
    master_pair: tuple[TubeMQMasterEmulator, TubeMQMasterEmulator], closed_port: int
) -> None:
    standby, active = master_pair
    masters = [("127.0.0.1", closed_port), standby.address, active.address]
    with MasterClient(masters, **FAST) as client:
        reg = client.register_producer(["demo"])
        assert reg.master == active.address_str
        assert client.current_master == active.address_str
        assert len(standby.calls_of(Method.PRODUCER_REGISTER)) == 1
        creg = client.register_consumer("grp", ["demo"])
        assert creg.master == active.address_str
    assert active.producers == {} and active.consumers == {}


def test_failover_when_the_leader_moves_then_re_register(
    master_pair: tuple[TubeMQMasterEmulator, TubeMQMasterEmulator],
) -> None:
    standby, active = master_pair
    with MasterClient([active.address, standby.address], **FAST) as client:
        client.register_producer(["demo"])
        client.register_consumer("grp", ["demo"])
        client.wait_for_partitions("grp", timeout=5)
        assert client.registrations_count() == 2
        # Leadership moves: the old active turns standby, the new one knows nobody (411).
        active.role, standby.role = "standby", "active"
        client.heartbeat()
        assert client.current_master == standby.address_str
        assert client.registrations_count() == 4
        producer = client.producer
        assert producer is not None and producer.master == standby.address_str
        # The consumer re-announced the partitions it holds when it registered again.
        reregister = standby.calls_of(Method.CONSUMER_REGISTER)[0]
        assert len(reregister.subscribeInfo) == 5
        assert len(client.consumer("grp").partitions) == 5


def test_re_register_when_master_forgets_the_client(master: TubeMQMasterEmulator) -> None:
    with MasterClient([master.address], **FAST) as client:
        client.register_producer(["demo"])
        client.register_consumer("grp", ["demo"])
        client.wait_for_partitions("grp", timeout=5)
        master.forget_clients()
        client.heartbeat()
        assert client.registrations_count() == 4
        assert len(master.calls_of(Method.PRODUCER_REGISTER)) == 2
        assert len(master.calls_of(Method.CONSUMER_REGISTER)) == 2
        assert len(master.producers) == 1 and len(master.consumers) == 1


def test_background_heartbeats_and_re_registration(master: TubeMQMasterEmulator) -> None:
    settings = {**FAST, "background_heartbeat": True, "first_heartbeat_delay": 0.05, "heartbeat_period": 0.05}
    with MasterClient([master.address], **settings) as client:
        client.register_producer(["demo"])
        assert _wait_until(lambda: len(master.calls_of(Method.PRODUCER_HEARTBEAT)) >= 4)
        master.forget_clients()
        assert _wait_until(lambda: len(master.calls_of(Method.PRODUCER_REGISTER)) >= 2)
        assert _wait_until(lambda: len(master.producers) == 1)
    assert master.producers == {}


def test_heartbeat_loop_backs_off_after_retry_limit() -> None:
    emulator = TubeMQMasterEmulator().start()
    settings = {
        **FAST,
        "background_heartbeat": True,
        "first_heartbeat_delay": 0.05,
        "heartbeat_period": 0.05,
        "heartbeat_period_after_fail": 60.0,
        "max_heartbeat_retries": 2,
        "max_register_retries": 1,
    }
    client = MasterClient([emulator.address], **settings)
    try:
        client.register_producer(["demo"])
        emulator.stop()
        assert _wait_until(lambda: client.consecutive_heartbeat_failures >= 3)
        time.sleep(0.5)
        # After more than max_heartbeat_retries failures the loop waits the long period.
        assert client.consecutive_heartbeat_failures == 3
        assert isinstance(client.last_heartbeat_error, NoMasterAvailable)
    finally:
        client.close()


def test_authentication_and_token_round_trip(auth_master: TubeMQMasterEmulator) -> None:
    with MasterClient([auth_master.address], credentials=Credentials("alice", "s3cret"), **FAST) as client:
        client.register_producer(["demo"])
        register = auth_master.calls_of(Method.PRODUCER_REGISTER)[0]
        assert register.authInfo.authInfo.userName == "alice"
        beats = auth_master.calls_of(Method.PRODUCER_HEARTBEAT)
        # After register, the token the master issued replaces the signature.
        assert beats[0].authInfo.authorizedToken in auth_master.tokens
        assert not beats[0].authInfo.HasField("authInfo")
        auth_master.require_auth_next = True
        client.heartbeat()
        client.heartbeat()
        beats = auth_master.calls_of(Method.PRODUCER_HEARTBEAT)
        assert beats[1].authInfo.HasField("authorizedToken")
        assert beats[2].authInfo.HasField("authInfo")  # requireAuth -> sign again
        # A token the master no longer knows: 415 on the token, then the client signs again.
        auth_master.tokens.clear()
        client.register_consumer("grp", ["demo"])
        auth_master.tokens.clear()
        client.heartbeat()
        assert auth_master.auth_rejections >= 1
    assert auth_master.producers == {} and auth_master.consumers == {}


def test_bad_credentials_are_rejected_with_415(auth_master: TubeMQMasterEmulator) -> None:
    creds = Credentials("alice", "wrong-pw")
    with (
        MasterClient([auth_master.address], credentials=creds, **FAST) as client,
        pytest.raises(CertificateFailure) as info,
    ):
        client.register_producer(["demo"])
    assert info.value.err_code == 415
    assert "wrong-pw" not in str(info.value)
    assert len(auth_master.calls_of(Method.PRODUCER_REGISTER)) == 1  # not retried
    with MasterClient([auth_master.address], **FAST) as client, pytest.raises(CertificateFailure):
        client.register_consumer("grp", ["demo"])


def test_dropped_connection_mid_frame_is_retried(master: TubeMQMasterEmulator) -> None:
    master.drop_next_responses(2)
    with MasterClient([master.address], **FAST) as client:
        reg = client.register_producer(["demo"])
        assert len(reg.partitions()) == 5
    assert master.connections_accepted >= 3
    assert len(master.calls_of(Method.PRODUCER_REGISTER)) == 3


def test_connection_reports_the_mid_frame_drop(master: TubeMQMasterEmulator) -> None:
    master.drop_next_responses(1)
    with RpcConnection(*master.address) as conn:
        with pytest.raises(TubeMQConnectionError, match="middle of a frame"):
            conn.call(Method.PRODUCER_CLOSE, b"\x0a\x01x", timeout=5)
        assert conn.closed
        with pytest.raises(TubeMQConnectionError, match="closed"):
            conn.call(Method.PRODUCER_CLOSE, b"\x0a\x01x", timeout=5)


def test_timeouts_and_unknown_methods(master: TubeMQMasterEmulator) -> None:
    master.ignore_next_requests(1)
    with RpcConnection(*master.address) as conn:
        with pytest.raises(TubeMQTimeout, match="did not answer"):
            conn.call(Method.PRODUCER_CLOSE, b"\x0a\x01x", timeout=0.3)
        # The connection stays usable and a late/other response does not confuse correlation.
        assert conn.call(Method.PRODUCER_CLOSE, b"\x0a\x01x", timeout=5).status is Status.SUCCESS
        fatal = conn.call(99, b"", timeout=5)
        assert fatal.status is Status.FATAL and "Unsupported method ID 99" in fatal.exception_message
    master.ignore_next_requests(1)
    with MasterClient([master.address], **{**FAST, "rpc_timeout": 0.3}) as client:
        assert len(client.register_producer(["demo"]).partitions()) == 5


def test_retry_limit_on_transient_master_errors(master: TubeMQMasterEmulator) -> None:
    master.inject_error(Method.PRODUCER_REGISTER, 500, "internal error", times=2)
    with MasterClient([master.address], **{**FAST, "max_register_retries": 3}) as client:
        client.register_producer(["demo"])
    master.inject_error(Method.CONSUMER_REGISTER, 503, "busy", times=5)
    client = MasterClient([master.address], **{**FAST, "max_register_retries": 3})
    with client, pytest.raises(MasterResponseError) as info:
        client.register_consumer("grp", ["demo"])
    assert info.value.err_code == 503 and info.value.err_msg == "busy"
    assert len(master.calls_of(Method.CONSUMER_REGISTER)) == 3


def test_no_master_available(closed_port: int) -> None:
    client = MasterClient([("127.0.0.1", closed_port)], **{**FAST, "max_register_retries": 2})
    with client, pytest.raises(NoMasterAvailable, match="no master of 1 answered"):
        client.register_producer(["demo"])


def test_concurrent_requests_on_one_connection(master: TubeMQMasterEmulator) -> None:
    import threading

    results: list[Status] = []
    with RpcConnection(*master.address) as conn:

        def worker() -> None:
            for _ in range(20):
                results.append(conn.call(Method.PRODUCER_CLOSE, b"\x0a\x01x", timeout=5).status)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [Status.SUCCESS] * 80


def test_disconnect_event_removes_partitions(master: TubeMQMasterEmulator) -> None:
    with MasterClient([master.address], **FAST) as client:
        client.register_consumer("grp", ["demo"])
        assert len(client.wait_for_partitions("grp", timeout=5).partitions) == 5
        assert master.revoke_partitions("grp") == 1
        client.heartbeat()
        reg = client.consumer("grp")
        assert reg.partitions == () and reg.brokers == {}
        client.heartbeat()  # acknowledges the DISCONNECT
        assert [(r.opType, r.status) for r in master.reports] == [(1, 2), (2, 2)]
        assert master.consumers[reg.client_id].held == set()


def test_bad_input_is_refused_before_any_network_call(master: TubeMQMasterEmulator) -> None:
    with MasterClient([master.address], **FAST) as client:
        with pytest.raises(InvalidArgument, match="system topic"):
            client.register_producer(["__offset_history__"])
        with pytest.raises(InvalidArgument, match="consumer group '1bad'"):
            client.register_consumer("1bad", ["demo"])
        with pytest.raises(InvalidArgument, match="at least one topic"):
            client.register_consumer("grp", [])
        client.register_consumer("grp", ["demo"])
        with pytest.raises(InvalidArgument, match="already registered"):
            client.register_consumer("grp", ["demo"])
        with pytest.raises(InvalidArgument, match="no consumer of group 'other'"):
            client.consumer("other")
    assert len(master.calls_of(Method.CONSUMER_REGISTER)) == 1
    assert master.calls_of(Method.PRODUCER_REGISTER) == []
