"""The TubeMQ master client: register, heartbeat and close producers and consumers.

Behaviour follows the Java SDK where the spec documents it:

* **Failover.** Only one master of the configured list is active; the others answer every call
  with a StandbyException. A call goes to the current master; on a connection error (refused,
  reset, closed mid-frame, bad frame), a timeout, or a StandbyException / IOException-type remote
  exception, the client closes that connection, rotates to the next address and resends. One
  *round* tries every master once; :class:`NoMasterAvailable` means the whole round failed.
* **Retries** (tenacity). Register and close retry whole rounds and transient master answers
  ``max_register_retries`` times, ``register_retry_wait`` apart (Java: 5 times, 1 s). Business
  refusals such as 400/415/431 are not retried: they would fail the same way.
* **Heartbeats.** A background thread heartbeats every registration, first after
  ``first_heartbeat_delay`` (5 s), then every ``heartbeat_period`` (13 s). After more than
  ``max_heartbeat_retries`` (5) consecutive failures it slows down to
  ``heartbeat_period_after_fail`` (60 s) until a heartbeat succeeds. The master forgets a client
  after 30 s without heartbeat.
* **Re-registration.** A heartbeat answered with 411 (HB_NO_NODE: expired, never registered, or
  the master failed over) registers the client again — a consumer re-announces the partitions it
  holds — and heartbeats once more.
* **Authentication.** With :class:`Credentials`, register sends the signed AuthenticateInfo;
  later calls send the authorized token the master returned, until it answers
  ``requireAuth = true`` or 415 (then the next call signs again; a 415 on signed credentials is a
  :class:`CertificateFailure`).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import tenacity
from google.protobuf.message import DecodeError, Message

from streamledger import __version__
from streamledger.protocol.tubemq._pb import tubemq_master_pb2 as master_pb
from streamledger.protocol.tubemq.auth import AuthState, Credentials
from streamledger.protocol.tubemq.connection import RpcConnection
from streamledger.protocol.tubemq.errors import (
    ERR_CERTIFICATE_FAILURE,
    ERR_HB_NO_NODE,
    ERR_NOT_READY,
    FrameError,
    InvalidArgument,
    MasterResponseError,
    NoMasterAvailable,
    RemoteException,
    StandbyMasterError,
    TubeMQConnectionError,
    TubeMQError,
    TubeMQProtocolError,
    TubeMQTimeout,
    response_error,
)
from streamledger.protocol.tubemq.model import (
    DEFAULT_BROKER_PORT,
    BrokerInfo,
    ConsumerRegistration,
    Partition,
    ProducerRegistration,
    TopicInfo,
    parse_broker_info,
    parse_subscribe_info,
    parse_topic_info,
)
from streamledger.protocol.tubemq.rpc import Method, Status

__all__ = ["MasterClient", "parse_masters"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
T = TypeVar("T")

CLIENT_VERSION = f"streamledger-py-{__version__}"
_STANDBY_SUFFIX = "corerpc.exception.StandbyException"
_SYSTEM_TOPIC = "__offset_history__"
_GROUP_RE = re.compile(r"^[a-zA-Z][\w-]+$")
_MAX_NAME = 1024
_MAX_TOPICS = 1024
# Master answers worth another attempt (not ready, overloaded, internal error).
_TRANSIENT_CODES = frozenset({ERR_NOT_READY, 419, 421, 500, 503, 599})
# EventProto op types / statuses (spec 7.1).
_EV_CONNECT, _EV_DISCONNECT, _EV_ONLY_CONNECT, _EV_ONLY_DISCONNECT = 1, 2, 10, 20
_EV_STATUS_DONE = 2
# The Java consumer re-reports its full subscription every 6th heartbeat.
_REPORT_EVERY = 6


def parse_masters(text: str) -> list[tuple[str, int]]:
    """Parse ``host1:port1,host2:port2`` into ``[(host, port), ...]`` with clear errors."""
    masters: list[tuple[str, int]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        host, sep, port_text = item.rpartition(":")
        if not sep or not host:
            raise InvalidArgument(f"master address {item!r} is not host:port")
        try:
            port = int(port_text)
        except ValueError:
            raise InvalidArgument(f"master address {item!r} has a non-numeric port") from None
        if not 0 < port < 65536:
            raise InvalidArgument(f"master address {item!r} has port {port} out of range")
        masters.append((host.strip("[]"), port))
    if not masters:
        raise InvalidArgument(f"no master address in {text!r} (expected host:port[,host:port...])")
    return masters


def _local_ip(target: tuple[str, int]) -> str:
    """The local address that routes to ``target`` (a UDP connect sends no packet)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(target)
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def _check_topics(topics: Sequence[str], *, allow_empty: bool) -> tuple[str, ...]:
    if isinstance(topics, str):
        topics = [topics]
    cleaned = tuple(dict.fromkeys(t.strip() for t in topics))
    if not cleaned and not allow_empty:
        raise InvalidArgument("at least one topic is required")
    if len(cleaned) > _MAX_TOPICS:
        raise InvalidArgument(f"{len(cleaned)} topics given, the master accepts at most {_MAX_TOPICS}")
    for topic in cleaned:
        if not topic:
            raise InvalidArgument("topic names must not be blank")
        if topic == _SYSTEM_TOPIC:
            raise InvalidArgument(f"topic {topic!r} is a system topic and cannot be registered")
    return cleaned


@dataclass
class _ProducerState:
    client_id: str
    topics: tuple[str, ...]
    master: str = ""
    checksum: int = -1
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topic_infos: dict[str, TopicInfo] = field(default_factory=dict)
    max_msg_size: int | None = None
    failures: int = 0
    registrations: int = 0

    def snapshot(self) -> ProducerRegistration:
        return ProducerRegistration(
            client_id=self.client_id,
            master=self.master,
            topics=self.topics,
            broker_checksum=self.checksum,
            brokers=dict(self.brokers),
            topic_infos=dict(self.topic_infos),
            max_msg_size=self.max_msg_size,
        )


@dataclass
class _ConsumerState:
    client_id: str
    group: str
    topics: tuple[str, ...]
    master: str = ""
    held: dict[str, tuple[str, Partition]] = field(default_factory=dict)  # key -> (raw string, partition)
    rebalance_id: int | None = None
    pending_report: master_pb.EventProto | None = None
    heartbeats: int = 0
    failures: int = 0
    registrations: int = 0

    def snapshot(self) -> ConsumerRegistration:
        parts = tuple(
            sorted(
                (p for _, p in self.held.values()),
                key=lambda p: (p.topic, p.broker.broker_id, p.partition_id),
            )
        )
        return ConsumerRegistration(
            client_id=self.client_id,
            group=self.group,
            master=self.master,
            topics=self.topics,
            partitions=parts,
            rebalance_id=self.rebalance_id,
        )


class MasterClient:
    """Registers producers and consumers with a TubeMQ master cluster and keeps them alive.

    ``masters`` is the list of master addresses (one active, the others standby). The client is
    synchronous and thread-safe; a daemon thread sends heartbeats. Use it as a context manager so
    that :meth:`close` unregisters everything.
    """

    def __init__(
        self,
        masters: Sequence[tuple[str, int]] | str,
        *,
        credentials: Credentials | None = None,
        rpc_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        heartbeat_period: float = 13.0,
        first_heartbeat_delay: float = 5.0,
        heartbeat_period_after_fail: float = 60.0,
        max_heartbeat_retries: int = 5,
        max_register_retries: int = 5,
        register_retry_wait: float = 1.0,
        default_broker_port: int = DEFAULT_BROKER_PORT,
        host_name: str | None = None,
        background_heartbeat: bool = True,
    ) -> None:
        self._masters = parse_masters(masters) if isinstance(masters, str) else list(masters)
        if not self._masters:
            raise InvalidArgument("at least one master address is required")
        if rpc_timeout <= 0 or heartbeat_period <= 0:
            raise InvalidArgument("rpc_timeout and heartbeat_period must be positive")
        self._auth = AuthState(credentials)
        self._rpc_timeout = rpc_timeout
        self._connect_timeout = connect_timeout
        self._heartbeat_period = heartbeat_period
        self._first_heartbeat_delay = first_heartbeat_delay
        self._period_after_fail = heartbeat_period_after_fail
        self._max_hb_retries = max_heartbeat_retries
        self._max_register_retries = max(1, max_register_retries)
        self._register_retry_wait = register_retry_wait
        self._default_broker_port = default_broker_port
        self._host = host_name or _local_ip(self._masters[0])
        self._background = background_heartbeat
        self._current = 0
        self._conn: RpcConnection | None = None
        self._lock = threading.RLock()
        self._producer: _ProducerState | None = None
        self._consumers: dict[str, _ConsumerState] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.last_heartbeat_error: TubeMQError | None = None

    # ------------------------------------------------------------------ public API

    @property
    def masters(self) -> list[tuple[str, int]]:
        return list(self._masters)

    @property
    def current_master(self) -> str:
        """The address calls currently go to."""
        host, port = self._masters[self._current]
        return f"{host}:{port}"

    @property
    def host_name(self) -> str:
        return self._host

    def register_producer(self, topics: Sequence[str]) -> ProducerRegistration:
        """Register a producer for ``topics``; returns the brokers and partitions it may publish to.

        As the Java producer does after adding topics, a heartbeat follows the register call at
        once, because only heartbeat responses carry the topics' partition layout.
        """
        cleaned = _check_topics(topics, allow_empty=True)
        with self._lock:
            self._ensure_open()
            if self._producer is not None:
                raise InvalidArgument(f"a producer is already registered as {self._producer.client_id}")
            state = _ProducerState(self._producer_client_id(), cleaned)
            self._retrying(self._producer_register, state)
            self._producer = state
            self._producer_heartbeat(state)
            self._start_heartbeats()
            return state.snapshot()

    def register_consumer(self, group: str, topics: Sequence[str]) -> ConsumerRegistration:
        """Register a consumer of ``topics`` in ``group``.

        Partitions arrive later, in rebalance events on heartbeats; see :meth:`wait_for_partitions`.
        """
        group = group.strip()
        if len(group) > _MAX_NAME or not _GROUP_RE.match(group):
            raise InvalidArgument(
                f"consumer group {group!r} must match ^[a-zA-Z][\\w-]+$ and be at most {_MAX_NAME} chars"
            )
        cleaned = _check_topics(topics, allow_empty=False)
        with self._lock:
            self._ensure_open()
            if group in self._consumers:
                raise InvalidArgument(f"a consumer of group {group!r} is already registered")
            state = _ConsumerState(self._consumer_client_id(group), group, cleaned)
            self._retrying(self._consumer_register, state)
            self._consumers[group] = state
            self._start_heartbeats()
            return state.snapshot()

    def wait_for_partitions(self, group: str, timeout: float, *, poll: float = 1.0) -> ConsumerRegistration:
        """Heartbeat ``group``'s consumer until it holds partitions or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                state = self._consumer_state(group)
                self._consumer_heartbeat(state)
                if state.held or time.monotonic() >= deadline:
                    # Acknowledge the rebalance at once rather than on the next periodic beat.
                    if state.pending_report is not None:
                        self._consumer_heartbeat(state)
                    return state.snapshot()
            if self._stop.wait(min(poll, max(0.0, deadline - time.monotonic()))):
                raise TubeMQError("client closed while waiting for partitions")

    @property
    def producer(self) -> ProducerRegistration | None:
        """The producer registration as of the last register/heartbeat, or None."""
        with self._lock:
            return self._producer.snapshot() if self._producer else None

    def consumer(self, group: str) -> ConsumerRegistration:
        """The consumer registration of ``group`` as of the last register/heartbeat."""
        with self._lock:
            return self._consumer_state(group).snapshot()

    def registrations_count(self) -> int:
        """How many register calls succeeded so far (re-registrations included)."""
        with self._lock:
            total = self._producer.registrations if self._producer else 0
            return total + sum(c.registrations for c in self._consumers.values())

    @property
    def consecutive_heartbeat_failures(self) -> int:
        """Failed background heartbeats in a row (worst registration); 0 when all is well."""
        with self._lock:
            states: list[_ProducerState | _ConsumerState] = [*self._consumers.values()]
            if self._producer is not None:
                states.append(self._producer)
            return max((s.failures for s in states), default=0)

    def heartbeat(self) -> None:
        """Heartbeat every registration once now (re-registering on 411); raises on failure."""
        with self._lock:
            self._ensure_open()
            if self._producer is not None:
                self._producer_heartbeat(self._producer)
            for state in list(self._consumers.values()):
                self._consumer_heartbeat(state)

    def close_producer(self) -> None:
        """Unregister the producer (CloseRequestP2M)."""
        with self._lock:
            state, self._producer = self._producer, None
            if state is None:
                return
            req = master_pb.CloseRequestP2M(clientId=state.client_id)
            self._attach_cert(req)
            resp, addr = self._retrying(
                self._invoke, Method.PRODUCER_CLOSE, req, master_pb.CloseResponseM2P, "producer close"
            )
            if not resp.success and resp.errCode != ERR_HB_NO_NODE:
                raise response_error("producer close", addr, resp.errCode, resp.errMsg)

    def close_consumer(self, group: str) -> None:
        """Unregister the consumer of ``group`` (CloseRequestC2M)."""
        with self._lock:
            state = self._consumers.pop(group, None)
            if state is None:
                return
            req = master_pb.CloseRequestC2M(clientId=state.client_id, groupName=state.group)
            self._attach_cert(req)
            resp, addr = self._retrying(
                self._invoke, Method.CONSUMER_CLOSE, req, master_pb.CloseResponseM2C, "consumer close"
            )
            if not resp.success and resp.errCode != ERR_HB_NO_NODE:
                raise response_error("consumer close", addr, resp.errCode, resp.errMsg)

    def close(self) -> None:
        """Stop heartbeats, unregister everything (best effort, failures logged), drop the connection."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._rpc_timeout + 1)
        with self._lock:
            if self._closed:
                return
            closers: list[Callable[[], None]] = []
            if self._producer is not None:
                closers.append(self.close_producer)
            closers.extend(functools.partial(self.close_consumer, g) for g in list(self._consumers))
            for closer in closers:
                try:
                    closer()
                except TubeMQError as exc:
                    log.warning("TubeMQ close failed: %s", exc)
            self._closed = True
            self._drop_connection()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ RPC + failover

    def _ensure_open(self) -> None:
        if self._closed:
            raise TubeMQError("the TubeMQ master client is closed")

    def _connection(self) -> RpcConnection:
        if self._conn is None or self._conn.closed:
            host, port = self._masters[self._current]
            self._conn = RpcConnection(host, port, connect_timeout=self._connect_timeout)
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _rotate(self) -> None:
        self._drop_connection()
        self._current = (self._current + 1) % len(self._masters)
        # A token is only known to the master that issued it.
        self._auth.reset()

    def _invoke(
        self, method: Method, request: Message, response_type: type[M], operation: str
    ) -> tuple[M, str]:
        """One failover round: try each master once, starting with the current one."""
        errors: list[str] = []
        for _ in range(len(self._masters)):
            address = self.current_master
            try:
                conn = self._connection()
                response = conn.call(int(method), request.SerializeToString(), timeout=self._rpc_timeout)
            except (TubeMQConnectionError, FrameError, TubeMQTimeout) as exc:
                log.info("%s: master %s failed (%s); trying the next master", operation, address, exc)
                errors.append(str(exc))
                self._rotate()
                continue
            if response.status != Status.SUCCESS:
                cls = (
                    StandbyMasterError
                    if response.exception_name.endswith(_STANDBY_SUFFIX)
                    else RemoteException
                )
                remote = cls(
                    address, int(response.status), response.exception_name, response.exception_message
                )
                if remote.fails_over:
                    log.info("%s: %s; trying the next master", operation, remote)
                    errors.append(str(remote))
                    self._rotate()
                    continue
                raise remote
            if response.method is not None and response.method != int(method):
                raise TubeMQProtocolError(
                    f"master {address} answered method {response.method} to a method {int(method)} request"
                )
            message = response_type()
            try:
                message.ParseFromString(response.data)
            except DecodeError as exc:
                raise TubeMQProtocolError(
                    f"cannot decode {response_type.__name__} from {address}: {exc}"
                ) from exc
            return message, address
        raise NoMasterAvailable(
            f"{operation}: no master of {len(self._masters)} answered: " + "; ".join(errors)
        )

    def _retrying(self, fn: Callable[..., T], *args: object) -> T:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self._max_register_retries),
            wait=tenacity.wait_fixed(self._register_retry_wait),
            retry=tenacity.retry_if_exception(_is_transient),
            reraise=True,
            before_sleep=lambda rs: log.info(
                "retrying after: %s", rs.outcome.exception() if rs.outcome else "?"
            ),
        )
        return retrying(fn, *args)

    def _attach_cert(self, request: Message, *, force_full: bool = False) -> bool:
        """Set ``authInfo`` on ``request`` when auth is on; True when full credentials were sent."""
        cert = self._auth.certificate(force_full=force_full)
        if cert is None:
            return False
        request.authInfo.CopyFrom(cert)  # type: ignore[attr-defined]
        return cert.HasField("authInfo")

    # ------------------------------------------------------------------ producer

    def _producer_client_id(self) -> str:
        return f"{self._host}-{os.getpid()}-{time.monotonic_ns()}-{secrets.randbelow(2**31)}-{CLIENT_VERSION}"

    def _producer_register(self, state: _ProducerState) -> None:
        req = master_pb.RegisterRequestP2M(
            clientId=state.client_id, topicList=list(state.topics), brokerCheckSum=-1, hostName=self._host
        )
        self._attach_cert(req, force_full=True)
        resp, addr = self._invoke(
            Method.PRODUCER_REGISTER, req, master_pb.RegisterResponseM2P, "producer register"
        )
        if not resp.success:
            raise response_error("producer register", addr, resp.errCode, resp.errMsg)
        state.master = addr
        state.checksum = resp.brokerCheckSum
        state.brokers = self._parse_brokers(resp.brokerInfos)
        state.registrations += 1
        if resp.HasField("appdConfig") and resp.appdConfig.HasField("maxMsgSize"):
            state.max_msg_size = resp.appdConfig.maxMsgSize
        self._auth.update(resp.authorizedInfo if resp.HasField("authorizedInfo") else None)

    def _producer_heartbeat(self, state: _ProducerState, *, _retry: bool = True) -> None:
        req = master_pb.HeartRequestP2M(
            clientId=state.client_id,
            brokerCheckSum=state.checksum,
            hostName=self._host,
            topicList=list(state.topics),
        )
        sent_full = self._attach_cert(req)
        resp, addr = self._invoke(
            Method.PRODUCER_HEARTBEAT, req, master_pb.HeartResponseM2P, "producer heartbeat"
        )
        if not resp.success:
            if resp.errCode == ERR_NOT_READY:
                return  # Java: nothing to update
            if _retry and resp.errCode == ERR_HB_NO_NODE:
                log.info("master %s no longer knows producer %s: re-registering", addr, state.client_id)
                self._retrying(self._producer_register, state)
                self._producer_heartbeat(state, _retry=False)
                return
            if _retry and resp.errCode == ERR_CERTIFICATE_FAILURE and not sent_full:
                self._auth.reset()
                self._producer_heartbeat(state, _retry=False)
                return
            raise response_error("producer heartbeat", addr, resp.errCode, resp.errMsg)
        state.master = addr
        state.checksum = resp.brokerCheckSum
        if resp.brokerInfos:
            state.brokers = self._parse_brokers(resp.brokerInfos)
        infos = [parse_topic_info(raw) for raw in resp.topicInfos]
        state.topic_infos = {info.topic: info for info in infos}
        if resp.HasField("appdConfig") and resp.appdConfig.HasField("maxMsgSize"):
            state.max_msg_size = resp.appdConfig.maxMsgSize
        self._auth.update(
            resp.authorizedInfo if resp.HasField("authorizedInfo") else None, require_auth=resp.requireAuth
        )

    def _parse_brokers(self, raw: Sequence[str]) -> dict[int, BrokerInfo]:
        brokers = [parse_broker_info(item, default_port=self._default_broker_port) for item in raw]
        return {b.broker_id: b for b in brokers}

    # ------------------------------------------------------------------ consumer

    def _consumer_client_id(self, group: str) -> str:
        return (
            f"{group}_{self._host}-{os.getpid()}-{time.monotonic_ns()}-{secrets.randbelow(2**31)}"
            f"-Pull-{CLIENT_VERSION}"
        )

    def _consumer_state(self, group: str) -> _ConsumerState:
        state = self._consumers.get(group)
        if state is None:
            raise InvalidArgument(f"no consumer of group {group!r} is registered")
        return state

    def _consumer_register(self, state: _ConsumerState) -> None:
        req = master_pb.RegisterRequestC2M(
            clientId=state.client_id,
            groupName=state.group,
            hostName=self._host,
            topicList=list(state.topics),
            subscribeInfo=[raw for raw, _ in state.held.values()],
            requireBound=False,
        )
        self._attach_cert(req, force_full=True)
        resp, addr = self._invoke(
            Method.CONSUMER_REGISTER, req, master_pb.RegisterResponseM2C, "consumer register"
        )
        if not resp.success:
            raise response_error(f"consumer register (group {state.group})", addr, resp.errCode, resp.errMsg)
        state.master = addr
        state.registrations += 1
        self._auth.update(resp.authorizedInfo if resp.HasField("authorizedInfo") else None)

    def _consumer_heartbeat(self, state: _ConsumerState, *, _retry: bool = True) -> None:
        state.heartbeats += 1
        report = state.pending_report is not None or state.heartbeats % _REPORT_EVERY == 0
        req = master_pb.HeartRequestC2M(
            clientId=state.client_id,
            groupName=state.group,
            subscribeInfo=[raw for raw, _ in state.held.values()] if report else [],
            reportSubscribeInfo=report,
        )
        if state.pending_report is not None:
            req.event.CopyFrom(state.pending_report)
        sent_full = self._attach_cert(req)
        resp, addr = self._invoke(
            Method.CONSUMER_HEARTBEAT, req, master_pb.HeartResponseM2C, "consumer heartbeat"
        )
        if not resp.success:
            if _retry and resp.errCode == ERR_HB_NO_NODE:
                log.info("master %s no longer knows consumer %s: re-registering", addr, state.client_id)
                self._retrying(self._consumer_register, state)
                self._consumer_heartbeat(state, _retry=False)
                return
            if _retry and resp.errCode == ERR_CERTIFICATE_FAILURE and not sent_full:
                self._auth.reset()
                self._consumer_heartbeat(state, _retry=False)
                return
            raise response_error(f"consumer heartbeat (group {state.group})", addr, resp.errCode, resp.errMsg)
        state.master = addr
        state.pending_report = None
        self._auth.update(
            resp.authorizedInfo if resp.HasField("authorizedInfo") else None, require_auth=resp.requireAuth
        )
        if resp.HasField("event"):
            self._apply_event(state, resp.event)

    def _apply_event(self, state: _ConsumerState, event: master_pb.EventProto) -> None:
        """Take on (or give up) the partitions of a rebalance event and queue its DONE report."""
        infos = [
            (raw, parse_subscribe_info(raw, default_port=self._default_broker_port))
            for raw in event.subscribeInfo
        ]
        if event.opType in (_EV_CONNECT, _EV_ONLY_CONNECT):
            for raw, info in infos:
                state.held[info.partition.key] = (raw, info.partition)
        elif event.opType in (_EV_DISCONNECT, _EV_ONLY_DISCONNECT):
            for _, info in infos:
                state.held.pop(info.partition.key, None)
        state.rebalance_id = event.rebalanceId
        state.pending_report = master_pb.EventProto(
            rebalanceId=event.rebalanceId,
            opType=event.opType,
            status=_EV_STATUS_DONE,
            subscribeInfo=list(event.subscribeInfo),
        )
        log.info(
            "consumer %s: rebalance %d op %d over %d partitions",
            state.client_id,
            event.rebalanceId,
            event.opType,
            len(infos),
        )

    # ------------------------------------------------------------------ heartbeat thread

    def _start_heartbeats(self) -> None:
        if not self._background or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._heartbeat_loop, name="tubemq-heartbeat", daemon=True)
        self._thread.start()

    def _heartbeat_loop(self) -> None:
        delay = self._first_heartbeat_delay
        while not self._stop.wait(delay):
            with self._lock:
                if self._closed:
                    return
                states: list[_ProducerState | _ConsumerState] = []
                if self._producer is not None:
                    states.append(self._producer)
                states.extend(self._consumers.values())
                worst = 0
                for state in states:
                    try:
                        if isinstance(state, _ProducerState):
                            self._producer_heartbeat(state)
                        else:
                            self._consumer_heartbeat(state)
                        state.failures = 0
                    except TubeMQError as exc:
                        state.failures += 1
                        self.last_heartbeat_error = exc
                        log.warning(
                            "TubeMQ heartbeat of %s failed (%d in a row): %s",
                            state.client_id,
                            state.failures,
                            exc,
                        )
                    except Exception:  # keep the loop alive: a dead heartbeat thread expires the client
                        state.failures += 1
                        log.exception("unexpected error in the TubeMQ heartbeat of %s", state.client_id)
                    worst = max(worst, state.failures)
            delay = self._period_after_fail if worst > self._max_hb_retries else self._heartbeat_period


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, NoMasterAvailable | TubeMQTimeout | TubeMQConnectionError):
        return True
    if isinstance(exc, MasterResponseError):
        return exc.err_code in _TRANSIENT_CODES
    return False
