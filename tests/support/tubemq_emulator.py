"""TEST DOUBLE — an emulated TubeMQ master, *not* Apache InLong TubeMQ.

There is no TubeMQ server on this machine, so the client's integration tests talk to this small
master written from ``specs/tubemq.md``: real TCP sockets on 127.0.0.1 (ephemeral ports),
one thread per connection, the same packet framing and protobuf messages as the Java master for
methods 1-6 (producer/consumer register, heartbeat, close). On purpose it does its own framing
and varint handling (it shares only the generated protobuf classes with the client), so a bug in
the client's codec is not mirrored here.

What it can be told to do, per test:

* ``role = "standby"`` — answer every master call with the RPC-level StandbyException.
* ``users = {name: password}`` — check the signed AuthenticateInfo / issued tokens; reject with 415.
* ``forget_clients()`` — the next heartbeats get 411 (HB_NO_NODE) so clients must re-register.
* ``drop_next_responses(n)`` — send only half of the next n response packets, then close the
  connection (a drop in the middle of a frame).
* ``ignore_next_requests(n)`` — never answer the next n requests (client timeouts).
* ``inject_error(method, code, msg, times)`` — answer a method with ``success=false``.
* ``revoke_partitions(group)`` — the next heartbeat carries a DISCONNECT rebalance event.
* ``brokers`` / ``topics`` — the broker table (port ``None`` = default port, sent as a blank)
  and topic layouts (``[(broker_id, partitions, stores)]``).

What it does not do: real rebalancing across several consumers of a group (the first consumer
takes every partition), flow control, TLS, broker-side calls, session expiry by time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError, Message

from streamledger.protocol.tubemq._pb import tubemq_master_pb2 as mpb
from streamledger.protocol.tubemq._pb import tubemq_rpc_pb2 as rpb

BEGIN_TOKEN = 0xFF7FF4FE
STANDBY_EXCEPTION = "org.apache.inlong.tubemq.corerpc.exception.StandbyException"
AUTH_WINDOW_MS = 20_000

_REQUEST_TYPES: dict[int, type[Message]] = {
    1: mpb.RegisterRequestP2M,
    2: mpb.HeartRequestP2M,
    3: mpb.CloseRequestP2M,
    4: mpb.RegisterRequestC2M,
    5: mpb.HeartRequestC2M,
    6: mpb.CloseRequestC2M,
}


@dataclass
class _Consumer:
    client_id: str
    group: str
    topics: list[str]
    held: set[str] = field(default_factory=set)
    pending_event: mpb.EventProto | None = None


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _delimited(msg: Message) -> bytes:
    raw = msg.SerializeToString()
    return _varint(len(raw)) + raw


def emulator_signature(user: str, password: str, timestamp: int, nonce: int) -> str:
    """The master-side signature check, written independently of the client's ``sign``."""
    mac = hmac.new(password.encode("utf-8"), (user + str(timestamp) + str(nonce)).encode("utf-8"), "sha1")
    assert mac.digest_size == hashlib.sha1().digest_size
    return urllib.parse.quote(base64.b64encode(mac.digest()).decode(), safe="")


class TubeMQMasterEmulator:
    """An in-process fake TubeMQ master on 127.0.0.1 (test double; see the module docstring)."""

    def __init__(
        self,
        *,
        role: str = "active",
        brokers: dict[int, tuple[str, int | None]] | None = None,
        topics: dict[str, list[tuple[int, int, int]]] | None = None,
        max_msg_size: int | None = 1048576,
        users: dict[str, str] | None = None,
        broker_checksum: int = 1700000000000,
        host: str = "127.0.0.1",
    ) -> None:
        self.role = role
        self.brokers = brokers if brokers is not None else {1: ("127.0.0.1", 8130), 2: ("127.0.0.2", None)}
        self.topics = topics if topics is not None else {"demo": [(1, 3, 1), (2, 2, 1)]}
        self.max_msg_size = max_msg_size
        self.users = users
        self.broker_checksum = broker_checksum
        self.host = host
        self.producers: dict[str, list[str]] = {}
        self.consumers: dict[str, _Consumer] = {}
        self.calls: list[tuple[int, Message]] = []
        self.reports: list[mpb.EventProto] = []
        self.tokens: set[str] = set()
        self.auth_rejections = 0
        self.connections_accepted = 0
        self.require_auth_next = False
        self._drop = 0
        self._ignore = 0
        self._injected: dict[int, list[tuple[int, str]]] = {}
        self._rebalance = 0
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> TubeMQMasterEmulator:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((self.host, 0))
        server.listen(16)
        # accept() does not wake up when another thread closes the socket: poll instead.
        server.settimeout(0.05)
        self._server = server
        thread = threading.Thread(target=self._accept_loop, name="tubemq-emulator-accept", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopped.set()
        for thread in self._threads[:1]:
            thread.join(timeout=2)  # the accept loop notices the flag within one poll
        if self._server is not None:
            self._server.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            self._kill(conn)
        for thread in self._threads:
            thread.join(timeout=2)

    def __enter__(self) -> TubeMQMasterEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "emulator not started"
        return int(self._server.getsockname()[1])

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def address_str(self) -> str:
        return f"{self.host}:{self.port}"

    # ------------------------------------------------------------------ test controls

    def forget_clients(self) -> None:
        """Lose every registration, as after an expiry or a master failover (heartbeats get 411)."""
        with self._lock:
            self.producers.clear()
            self.consumers.clear()
            self.tokens.clear()

    def drop_next_responses(self, count: int = 1) -> None:
        with self._lock:
            self._drop += count

    def ignore_next_requests(self, count: int = 1) -> None:
        with self._lock:
            self._ignore += count

    def inject_error(self, method: int, code: int, message: str, times: int = 1) -> None:
        with self._lock:
            self._injected.setdefault(method, []).extend([(code, message)] * times)

    def revoke_partitions(self, group: str) -> int:
        """Queue a DISCONNECT rebalance event taking every held partition from ``group``'s consumers."""
        with self._lock:
            count = 0
            for consumer in self.consumers.values():
                if consumer.group != group or not consumer.held:
                    continue
                self._rebalance += 1
                consumer.pending_event = mpb.EventProto(
                    rebalanceId=self._rebalance, opType=2, status=0, subscribeInfo=sorted(consumer.held)
                )
                count += 1
            return count

    def close_all_connections(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            self._kill(conn)

    def calls_of(self, method: int) -> list[Any]:
        with self._lock:
            return [msg for m, msg in self.calls if m == method]

    # ------------------------------------------------------------------ sockets

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._stopped.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._stopped.is_set():
                self._kill(conn)
                return
            conn.settimeout(None)
            with self._lock:
                self._conns.append(conn)
                self.connections_accepted += 1
            thread = threading.Thread(
                target=self._serve, args=(conn,), name="tubemq-emulator-conn", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    @staticmethod
    def _kill(conn: socket.socket) -> None:
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()

    @staticmethod
    def _recv_exact(conn: socket.socket, size: int) -> bytes | None:
        chunks = []
        while size:
            chunk = conn.recv(min(size, 65536))
            if not chunk:
                return None
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                header = self._recv_exact(conn, 12)
                if header is None:
                    return
                token, serial, count = struct.unpack(">Iii", header)
                if token != BEGIN_TOKEN or not 0 <= count <= 3584:
                    return  # the Java master closes the connection on a bad frame
                parts = []
                for _ in range(count):
                    raw_len = self._recv_exact(conn, 4)
                    if raw_len is None:
                        return
                    (length,) = struct.unpack(">i", raw_len)
                    if length < 0:
                        return
                    block = self._recv_exact(conn, length)
                    if block is None:
                        return
                    parts.append(block)
                answer = self._handle(b"".join(parts))
                if answer is None:
                    continue
                packet = self._packet(serial, answer)
                with self._lock:
                    drop = self._drop > 0
                    if drop:
                        self._drop -= 1
                if drop:
                    conn.sendall(packet[: len(packet) // 2])
                    self._kill(conn)
                    return
                conn.sendall(packet)
        except OSError:
            return
        finally:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            conn.close()

    @staticmethod
    def _packet(serial: int, payload: bytes) -> bytes:
        blocks = [payload[i : i + 8192] for i in range(0, len(payload), 8192)] or []
        out = [struct.pack(">Iii", BEGIN_TOKEN, serial, len(blocks))]
        for block in blocks:
            out.append(struct.pack(">i", len(block)) + block)
        return b"".join(out)

    # ------------------------------------------------------------------ RPC

    def _handle(self, payload: bytes) -> bytes | None:
        try:
            conn_header, header, body = rpb.RpcConnHeader(), rpb.RequestHeader(), rpb.RequestBody()
            pos = 0
            for msg in (conn_header, header, body):
                length, pos = _read_varint(payload, pos)
                msg.ParseFromString(payload[pos : pos + length])
                pos += length
        except (DecodeError, IndexError, ValueError) as exc:
            return self._exception(
                2, "java.io.IOException", f"IPC server unable to read call parameters: {exc}"
            )
        with self._lock:
            if self._ignore > 0:
                self._ignore -= 1
                return None
        if body.timeout <= 0:
            return None  # the real master never answers a request without a timeout
        request_type = _REQUEST_TYPES.get(body.method)
        if request_type is None:
            return self._exception(
                2,
                "java.lang.Exception",
                f"IPC server handle request error :Unsupported method ID {body.method}",
            )
        request = request_type()
        try:
            request.ParseFromString(body.request)
        except DecodeError as exc:
            return self._exception(
                2, "java.io.IOException", f"IPC server unable to read call parameters: {exc}"
            )
        with self._lock:
            self.calls.append((body.method, request))
            if self.role != "active":
                client_id = getattr(request, "clientId", "")
                return self._exception(
                    1,
                    STANDBY_EXCEPTION,
                    f"{self.address_str} is not master now. the connecting client id is {client_id}",
                )
            injected = self._injected.get(body.method)
            if injected:
                code, msg = injected.pop(0)
                return self._ok(body.method, self._failure(body.method, code, msg))
            handler = getattr(self, f"_method_{body.method}")
            response: Message = handler(request)
        return self._ok(body.method, response)

    def _ok(self, method: int, response: Message) -> bytes:
        return (
            _delimited(rpb.RpcConnHeader(flag=1))
            + _delimited(rpb.ResponseHeader(status=rpb.ResponseHeader.SUCCESS, protocolVer=3))
            + _delimited(rpb.RspResponseBody(method=method, data=response.SerializeToString()))
        )

    @staticmethod
    def _exception(status: int, name: str, message: str) -> bytes:
        header = rpb.ResponseHeader(status=status)  # type: ignore[arg-type]
        if status == 1:
            header.protocolVer = 3
        return (
            _delimited(rpb.RpcConnHeader(flag=1))
            + _delimited(header)
            + _delimited(rpb.RspExceptionBody(exceptionName=name, stackTrace=message))
        )

    @staticmethod
    def _failure(method: int, code: int, msg: str) -> Message:
        if method == 1:
            return mpb.RegisterResponseM2P(success=False, errCode=code, errMsg=msg, brokerCheckSum=-1)
        if method == 2:
            return mpb.HeartResponseM2P(success=False, errCode=code, errMsg=msg, brokerCheckSum=-1)
        cls = {
            3: mpb.CloseResponseM2P,
            4: mpb.RegisterResponseM2C,
            5: mpb.HeartResponseM2C,
            6: mpb.CloseResponseM2C,
        }
        return cls[method](success=False, errCode=code, errMsg=msg)

    # ------------------------------------------------------------------ auth

    def _auth_error(self, cert: mpb.MasterCertificateInfo | None) -> str | None:
        """None when the certificate is acceptable, else the 415 message."""
        if self.users is None:
            return None
        if cert is None:
            return "Illegal parameter: authInfo required"
        if cert.HasField("authorizedToken") and not cert.HasField("authInfo"):
            return None if cert.authorizedToken in self.tokens else "Illegal authorized token"
        if not cert.HasField("authInfo"):
            return "Illegal parameter: authInfo required"
        info = cert.authInfo
        password = self.users.get(info.userName)
        if password is None:
            return f"user {info.userName} not found"
        if abs(int(time.time() * 1000) - info.timestamp) > AUTH_WINDOW_MS:
            return "timestamp out of the allowed window"
        if not hmac.compare_digest(
            info.signature, emulator_signature(info.userName, password, info.timestamp, info.nonce)
        ):
            return "signature mismatch"
        return None

    def _authorize(self, request: Message, response: Message) -> bool:
        cert = request.authInfo if request.HasField("authInfo") else None  # type: ignore[attr-defined]
        err = self._auth_error(cert)
        if err is not None:
            self.auth_rejections += 1
            response.success, response.errCode, response.errMsg = False, 415, err  # type: ignore[attr-defined]
            return False
        if self.users is not None and cert is not None and cert.HasField("authInfo"):
            token = secrets.token_hex(8)
            self.tokens.add(token)
            response.authorizedInfo.visitAuthorizedToken = 1  # type: ignore[attr-defined]
            response.authorizedInfo.authAuthorizedToken = token  # type: ignore[attr-defined]
        return True

    # ------------------------------------------------------------------ producer methods

    def _broker_infos(self) -> list[str]:
        return [
            f"{bid}:{host}:{' ' if port is None else port}"
            for bid, (host, port) in sorted(self.brokers.items())
        ]

    def _method_1(self, req: mpb.RegisterRequestP2M) -> Message:
        resp = mpb.RegisterResponseM2P(success=True, errCode=200, errMsg="OK!", brokerCheckSum=-1)
        if not req.clientId.strip() or not req.hostName.strip():
            resp.success, resp.errCode, resp.errMsg = (
                False,
                400,
                "Request miss necessary clientId or hostName",
            )
            return resp
        if not self._authorize(req, resp):
            return resp
        self.producers[req.clientId] = list(req.topicList)
        resp.brokerCheckSum = self.broker_checksum
        resp.brokerInfos.extend(self._broker_infos())
        if self.max_msg_size is not None:
            resp.appdConfig.configId = 1
            resp.appdConfig.maxMsgSize = self.max_msg_size
        return resp

    def _method_2(self, req: mpb.HeartRequestP2M) -> Message:
        resp = mpb.HeartResponseM2P(
            success=True, errCode=200, errMsg="OK!", brokerCheckSum=self.broker_checksum
        )
        if req.clientId not in self.producers:
            resp.success, resp.errCode, resp.errMsg = False, 411, f"Producer node {req.clientId} not found"
            resp.brokerCheckSum = -1
            return resp
        if not self._authorize(req, resp):
            return resp
        self.producers[req.clientId] = list(req.topicList)
        if req.brokerCheckSum != self.broker_checksum:
            resp.brokerInfos.extend(self._broker_infos())
        for topic in req.topicList:
            layouts = self.topics.get(topic)
            if layouts is None:
                continue
            spec = ",".join(f"{b}:{p}:{s}" for b, p, s in layouts)
            size = "" if self.max_msg_size is None else str(self.max_msg_size)
            resp.topicInfos.append(f"{topic}#{spec}#{size}")
        if self.require_auth_next:
            self.require_auth_next = False
            resp.requireAuth = True
        return resp

    def _method_3(self, req: mpb.CloseRequestP2M) -> Message:
        resp = mpb.CloseResponseM2P(success=True, errCode=200, errMsg="OK!")
        if not self._authorize(req, resp):
            return resp
        self.producers.pop(req.clientId, None)
        return resp

    # ------------------------------------------------------------------ consumer methods

    def _partitions_of(self, topic: str) -> list[str]:
        out = []
        for broker_id, parts, stores in self.topics.get(topic, []):
            host, port = self.brokers[broker_id]
            for store in range(stores):
                for index in range(parts):
                    out.append(f"{broker_id}:{host}:{port or 8123}#{topic}:{store * 10000 + index}")
        return out

    def _method_4(self, req: mpb.RegisterRequestC2M) -> Message:
        resp = mpb.RegisterResponseM2C(success=True, errCode=200, errMsg="OK!")
        if not req.clientId.strip() or not req.groupName.strip() or not req.hostName.strip():
            resp.success, resp.errCode, resp.errMsg = (
                False,
                400,
                "Request miss necessary clientId/groupName/hostName",
            )
            return resp
        missing = [t for t in req.topicList if t not in self.topics]
        if not req.topicList or missing:
            resp.success, resp.errCode = False, 431
            resp.errMsg = f"Topic {missing or '[]'} not deployed"
            return resp
        if not self._authorize(req, resp):
            return resp
        consumer = _Consumer(req.clientId, req.groupName, list(req.topicList), set(req.subscribeInfo))
        self.consumers[req.clientId] = consumer
        taken = {
            s.split("#", 1)[1] for c in self.consumers.values() if c.group == req.groupName for s in c.held
        }
        free = [p for t in req.topicList for p in self._partitions_of(t) if p not in taken]
        if free:
            self._rebalance += 1
            consumer.pending_event = mpb.EventProto(
                rebalanceId=self._rebalance,
                opType=1,
                status=0,
                subscribeInfo=[f"{req.clientId}@{req.groupName}#{p}" for p in free],
            )
        return resp

    def _method_5(self, req: mpb.HeartRequestC2M) -> Message:
        resp = mpb.HeartResponseM2C(success=True, errCode=200, errMsg="OK!")
        consumer = self.consumers.get(req.clientId)
        if consumer is None or consumer.group != req.groupName:
            resp.success, resp.errCode, resp.errMsg = False, 411, f"Consumer node {req.clientId} not found"
            return resp
        if not self._authorize(req, resp):
            return resp
        if req.HasField("event"):
            self.reports.append(req.event)
            if req.event.status == 2 and req.event.opType in (1, 10):
                consumer.held.update(req.event.subscribeInfo)
            elif req.event.status == 2 and req.event.opType in (2, 20):
                consumer.held.difference_update(req.event.subscribeInfo)
        if req.reportSubscribeInfo:
            consumer.held = set(req.subscribeInfo)
        if consumer.pending_event is not None:
            resp.event.CopyFrom(consumer.pending_event)
            consumer.pending_event = None
        if self.require_auth_next:
            self.require_auth_next = False
            resp.requireAuth = True
        return resp

    def _method_6(self, req: mpb.CloseRequestC2M) -> Message:
        resp = mpb.CloseResponseM2C(success=True, errCode=200, errMsg="OK!")
        if not self._authorize(req, resp):
            return resp
        self.consumers.pop(req.clientId, None)
        return resp
