"""One TCP connection to one TubeMQ master, with requests correlated by serial number.

A connection carries many concurrent requests and the master may answer them in any order, so a
reader thread decodes packets and hands each payload to the caller waiting on that serial number.
When the socket breaks (including in the middle of a frame) every waiting caller gets a
:class:`TubeMQConnectionError` at once instead of waiting for its timeout.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading

from streamledger.protocol.tubemq.errors import (
    FrameError,
    TubeMQConnectionError,
    TubeMQError,
    TubeMQTimeout,
)
from streamledger.protocol.tubemq.framing import MAX_PAYLOAD, FrameDecoder, encode_packet
from streamledger.protocol.tubemq.rpc import RpcResponse, decode_response, encode_request

__all__ = ["RpcConnection"]

log = logging.getLogger(__name__)
_RECV_SIZE = 65536


class _Pending:
    __slots__ = ("done", "error", "payload")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.payload: bytes | None = None
        self.error: TubeMQError | None = None


class RpcConnection:
    """A connected socket plus the reader thread that routes responses by serial number."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout: float = 5.0,
        max_payload: int = MAX_PAYLOAD,
    ) -> None:
        self.address = f"{host}:{port}"
        try:
            self._sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as exc:
            raise TubeMQConnectionError(f"cannot connect to master {self.address}: {exc}") from exc
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._decoder = FrameDecoder(max_payload=max_payload)
        self._serials = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._closed_error: TubeMQError | None = None
        self._reader = threading.Thread(
            target=self._read_loop, name=f"tubemq-rpc-{self.address}", daemon=True
        )
        self._reader.start()

    @property
    def closed(self) -> bool:
        """True once the socket failed or :meth:`close` was called."""
        return self._closed_error is not None

    def call(self, method: int, body: bytes, *, timeout: float, service_type: int = 1) -> RpcResponse:
        """Send one request and wait up to ``timeout`` seconds for its response."""
        timeout_ms = max(1, int(timeout * 1000))
        with self._lock:
            if self._closed_error is not None:
                raise TubeMQConnectionError(f"connection to master {self.address} is closed")
            serial = self._next_serial()
            pending = _Pending()
            self._pending[serial] = pending
        packet = encode_packet(
            serial, encode_request(method, body, timeout_ms=timeout_ms, service_type=service_type)
        )
        try:
            with self._send_lock:
                self._sock.sendall(packet)
        except OSError as exc:
            self._fail(
                TubeMQConnectionError(f"lost connection to master {self.address} while sending: {exc}")
            )
        if not pending.done.wait(timeout):
            with self._lock:
                self._pending.pop(serial, None)
            raise TubeMQTimeout(
                f"master {self.address} did not answer method {method} (serial {serial}) within {timeout:g} s"
            )
        if pending.error is not None:
            raise pending.error
        assert pending.payload is not None
        return decode_response(pending.payload)

    def _next_serial(self) -> int:
        # Java-compatible int32 wrap; skip serials still in flight.
        while True:
            serial = next(self._serials) & 0xFFFFFFFF
            if serial >= 2**31:
                serial -= 2**32
            if serial not in self._pending:
                return serial

    def _read_loop(self) -> None:
        while True:
            try:
                data = self._sock.recv(_RECV_SIZE)
            except OSError as exc:
                self._fail(TubeMQConnectionError(f"lost connection to master {self.address}: {exc}"))
                return
            if not data:
                partial = self._decoder.buffered
                where = f" in the middle of a frame ({partial} bytes buffered)" if partial else ""
                self._fail(TubeMQConnectionError(f"master {self.address} closed the connection{where}"))
                return
            try:
                packets = self._decoder.feed(data)
            except FrameError as exc:
                self._fail(FrameError(f"bad frame from master {self.address}: {exc}"))
                return
            for packet in packets:
                with self._lock:
                    pending = self._pending.pop(packet.serial, None)
                if pending is None:
                    log.debug("dropping response for unknown serial %d from %s", packet.serial, self.address)
                    continue
                pending.payload = packet.payload
                pending.done.set()

    def _fail(self, error: TubeMQError) -> None:
        with self._lock:
            if self._closed_error is None:
                self._closed_error = error
            waiting = list(self._pending.values())
            self._pending.clear()
        for pending in waiting:
            pending.error = error
            pending.done.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def close(self) -> None:
        """Close the socket; waiting callers fail with :class:`TubeMQConnectionError`."""
        self._fail(TubeMQConnectionError(f"connection to master {self.address} closed by the client"))
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=2.0)

    def __enter__(self) -> RpcConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
