"""One synchronous AMQP 1.0 connection with one session and the ``/management`` link pair.

Sequence (part 2 and part 5 of the spec): SASL header and mechanisms, ``sasl-init`` (PLAIN, ANONYMOUS or
EXTERNAL), outcome; AMQP header; ``open`` with hostname ``vhost:<name>`` (RabbitMQ's way of naming the
virtual host); ``begin``; then, on demand, a sender and a receiver link of the same name on the
``/management`` node (link-pair extension: ``paired`` = true). A request is a transfer on the sender;
the answer is the transfer on the receiver whose ``correlation-id`` is the request's ``message-id``.

Every wait has a deadline (``timeout``); every frame's size is checked against our max-frame-size
before its body is read, and a delivery spanning several transfers is capped at ``max_message_size``.
Requests are single-frame transfers, sent pre-settled (what RabbitMQ's management node accepts; a
larger request is refused unsent), and the receiver is granted credit in blocks, so no disposition
traffic is needed. A small thread sends an empty frame when
the connection has been quiet for half the broker's idle-time-out, so a client held open between
requests is not dropped.
"""

from __future__ import annotations

import itertools
import logging
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from streamledger.protocol.amqp10 import frames as fr
from streamledger.protocol.amqp10.codec.decoder import decode_message
from streamledger.protocol.amqp10.codec.encoder import encode_value_message
from streamledger.protocol.amqp10.codec.errors import AmqpDecodeError
from streamledger.protocol.amqp10.codec.types import Symbol
from streamledger.protocol.amqp10.errors import (
    Amqp10ConnectionError,
    Amqp10ProtocolError,
    Amqp10Timeout,
    Amqp10TlsError,
    AuthenticationFailed,
    NotAmqp10Broker,
    RemoteClosed,
    RequestTooLarge,
)
from streamledger.protocol.amqp10.url import Amqp10Params, to_params

log = logging.getLogger("streamledger.amqp10")

MANAGEMENT_NODE: Final = "/management"
_LINK_NAME: Final = "streamledger-management-link-pair"
_SENDER: Final = 0  # handles of the link pair on our side
_RECEIVER: Final = 1
_CREDIT: Final = 64
_WINDOW: Final = 1 << 16
_TRANSFER_OVERHEAD: Final = 32  # 8-byte header + transfer performative with a 4-byte tag, rounded up
_PRE_OPEN_MAX: Final = 1 << 16  # frames before open is agreed (spec: 512; a little slack for big opens)


def _seq(n: int) -> int:
    """A sequence number (transfer ids, delivery counts) modulo 2**32, as the spec's serial numbers wrap.

    RabbitMQ starts its delivery counts just below 2**32, so the wrap happens within a few requests.
    """
    return n & 0xFFFFFFFF


def _serial_diff(a: int, b: int) -> int:
    """``a - b`` in RFC 1982 serial arithmetic over 32 bits (negative when ``a`` is behind ``b``)."""
    d = (a - b) & 0xFFFFFFFF
    return d - (1 << 32) if d >= 1 << 31 else d


@dataclass(frozen=True, slots=True)
class Response:
    """A ``/management`` answer: the status code and the decoded amqp-value body."""

    status: int
    body: Any


class Amqp10Connection:
    """An open AMQP 1.0 connection to one virtual host; use :meth:`open` and close it (context manager).

    Not thread-safe for requests (one caller at a time); the heartbeat thread only writes, under the
    write lock.
    """

    def __init__(
        self,
        params: Amqp10Params,
        sock: socket.socket,
        *,
        timeout: float,
        max_frame_size: int,
        max_message_size: int,
    ) -> None:
        self.params = params
        self.timeout = timeout
        self.max_frame_size = max_frame_size
        self.max_message_size = max_message_size
        self.peer_max_frame_size = fr.MIN_MAX_FRAME_SIZE
        self.server_properties: dict[str, Any] = {}
        self._sock = sock
        self._rbuf = bytearray()
        self._wlock = threading.Lock()
        self._last_write = time.monotonic()
        self._closed = False
        self._frame_limit = _PRE_OPEN_MAX
        # session state (one session on channel 0)
        self._next_outgoing_id = 0
        self._remote_incoming_window = 0
        self._next_incoming_id = 0
        self._incoming_window = _WINDOW
        self._remote_channel: int | None = None
        # link pair state
        self._pair_open = False
        self._sender_credit = 0
        self._sender_delivery_count = 0
        self._receiver_delivery_count = 0
        self._receiver_credit = 0
        self._partial: list[bytes] = []
        self._partial_size = 0
        self._responses: dict[Any, Response] = {}
        self._gone: RemoteClosed | None = None  # the broker ended the session or a link: no more requests
        self._ids = itertools.count(1)
        self._heartbeat: threading.Thread | None = None
        self._stop = threading.Event()

    # ---- opening

    @classmethod
    def open(
        cls,
        url: str | Amqp10Params,
        *,
        timeout: float = 10.0,
        max_frame_size: int = 1 << 20,
        max_message_size: int = 16 << 20,
    ) -> Amqp10Connection:
        """Connect, authenticate, open the connection and begin the session; close on any failure."""
        params = to_params(url)
        if not fr.MIN_MAX_FRAME_SIZE <= max_frame_size <= 0xFFFFFFFF:
            raise ValueError(f"max_frame_size must be in 512..4294967295, not {max_frame_size}")
        sock = _connect(params, timeout)
        conn = cls(
            params, sock, timeout=timeout, max_frame_size=max_frame_size, max_message_size=max_message_size
        )
        try:
            conn._handshake()
        except BaseException:
            conn._abort()
            raise
        return conn

    def _handshake(self) -> None:
        deadline = time.monotonic() + self.timeout
        self._send(fr.SASL_HEADER)
        self._expect_header(fr.SASL_HEADER, deadline)
        mechanisms = self._expect(fr.FRAME_SASL, "sasl-mechanisms", deadline)
        offered = fr.symbols(mechanisms.get("sasl-server-mechanisms"))
        mechanism = {"plain": "PLAIN", "anonymous": "ANONYMOUS", "external": "EXTERNAL"}[self.params.auth]
        if mechanism not in offered:
            raise AuthenticationFailed(
                f"{self.params.redacted()}: the broker does not offer SASL {mechanism} "
                f"(offered: {', '.join(offered) or 'none'})"
            )
        response: bytes | None = None
        if mechanism == "PLAIN":
            response = (
                b"\0" + (self.params.username or "").encode() + b"\0" + (self.params.password or "").encode()
            )
        elif mechanism == "ANONYMOUS":
            response = b"streamledger"
        elif mechanism == "EXTERNAL":
            response = b""
        self._send(fr.sasl_init(mechanism, response, self.params.host))
        outcome = self._expect(fr.FRAME_SASL, "sasl-outcome", deadline)
        code = outcome.get("code", 1)
        if code != 0:
            raise AuthenticationFailed(
                f"{self.params.redacted()}: SASL {mechanism} login refused "
                f"(outcome {fr.SASL_OUTCOMES.get(code, code)}; check user, password and vhost access)"
            )
        self._send(fr.AMQP_HEADER)
        self._expect_header(fr.AMQP_HEADER, deadline)
        vhost = self.params.vhost
        self._send(
            fr.open_frame(f"streamledger-{uuid.uuid4()}", f"vhost:{vhost}", self.max_frame_size, 0, None)
        )
        try:
            opened = self._expect(fr.FRAME_AMQP, "open", deadline)
        except (Amqp10ConnectionError, RemoteClosed) as exc:
            # RabbitMQ refuses an unknown or forbidden vhost here, often with a bare reset
            raise type(exc)(f"{exc} (does vhost {vhost!r} exist, and may this user access it?)") from None
        self.peer_max_frame_size = max(
            fr.MIN_MAX_FRAME_SIZE, min(int(opened.get("max-frame-size", 0xFFFFFFFF)), 0xFFFFFFFF)
        )
        self._frame_limit = self.max_frame_size
        props = opened.get("properties") or {}
        self.server_properties = {str(k): v for k, v in props.items()} if isinstance(props, dict) else {}
        idle_ms = opened.get("idle-time-out")
        self._send(fr.begin_frame(0, self._next_outgoing_id, self._incoming_window, _WINDOW))
        begun = self._expect(fr.FRAME_AMQP, "begin", deadline)
        self._next_incoming_id = int(begun.get("next-outgoing-id", 0))
        self._remote_incoming_window = int(begun.get("incoming-window", 0))
        if idle_ms:
            self._start_heartbeat(int(idle_ms) / 1000.0)

    @property
    def server_version(self) -> str | None:
        """The broker's ``version`` open property (RabbitMQ sends it), or ``None``."""
        v = self.server_properties.get("version")
        return str(v) if v is not None else None

    # ---- management requests

    def request(self, method: str, path: str, body: Any = None) -> Response:
        """Send one HTTP-over-AMQP request to ``/management`` and wait for its answer."""
        if self._gone is not None:
            raise RemoteClosed(
                str(self._gone), condition=self._gone.condition, description=self._gone.description
            )
        if not self._pair_open:
            self._attach_pair()
        deadline = time.monotonic() + self.timeout
        message_id = f"sl-{next(self._ids)}"
        message = encode_value_message(
            body, properties={"message-id": message_id, "to": path, "subject": method, "reply-to": "$me"}
        )
        what = f"{method} {path}"
        # RabbitMQ's management node takes a request in one transfer frame only (a multi-frame one ends the
        # session with an internal error), so a larger one is refused here, before anything is sent.
        room = self.peer_max_frame_size - _TRANSFER_OVERHEAD
        if len(message) > room:
            raise RequestTooLarge(
                f"{what}: request of {len(message)} bytes does not fit the broker's "
                f"max-frame-size of {self.peer_max_frame_size} bytes"
            )
        while self._sender_credit <= 0 or self._remote_incoming_window <= 0:
            self._dispatch(self._read_frame(deadline, f"link credit for {what}"))
        self._transfer(message)
        while message_id not in self._responses:
            self._dispatch(self._read_frame(deadline, f"the answer to {what}"))
        return self._responses.pop(message_id)

    def _attach_pair(self) -> None:
        deadline = time.monotonic() + self.timeout
        paired = {Symbol("paired"): True}
        self._send(
            fr.attach_frame(
                0,
                _LINK_NAME,
                _SENDER,
                receiver=False,
                source=fr.terminus(fr.SOURCE, MANAGEMENT_NODE),
                target=fr.terminus(fr.TARGET, MANAGEMENT_NODE),
                snd_settle_mode=1,
                properties=paired,
                initial_delivery_count=0,
            )
        )
        self._send(
            fr.attach_frame(
                0,
                _LINK_NAME,
                _RECEIVER,
                receiver=True,
                source=fr.terminus(fr.SOURCE, MANAGEMENT_NODE),
                target=fr.terminus(fr.TARGET, MANAGEMENT_NODE),
                snd_settle_mode=1,
                properties=paired,
            )
        )
        attached = 0
        while attached < 2:
            frame = self._read_frame(deadline, f"the {MANAGEMENT_NODE} link pair")
            p = frame.performative
            if p is not None and p.name == "attach":
                if (p.get("source") is None and p.get("role") is True) or (
                    p.get("target") is None and p.get("role") is False
                ):
                    # a null terminus in the answer means the node refused; its detach follows with why
                    continue
                if p.get("role") is False:  # the broker's sender = our receiver
                    self._receiver_delivery_count = int(p.get("initial-delivery-count", 0))
                attached += 1
                continue
            self._dispatch(frame)
        self._pair_open = True
        self._grant_credit()

    def _grant_credit(self) -> None:
        self._receiver_credit = _CREDIT
        self._send(
            fr.flow_frame(
                0,
                next_incoming_id=self._next_incoming_id,
                incoming_window=self._incoming_window,
                next_outgoing_id=self._next_outgoing_id,
                outgoing_window=_WINDOW,
                handle=_RECEIVER,
                delivery_count=self._receiver_delivery_count,
                link_credit=_CREDIT,
            )
        )

    def _transfer(self, message: bytes) -> None:
        delivery_id = self._next_outgoing_id
        self._send(
            fr.transfer_frame(
                0,
                _SENDER,
                delivery_id,
                delivery_id.to_bytes(4, "big"),
                settled=True,
                more=False,
                payload=message,
            )
        )
        self._next_outgoing_id = _seq(self._next_outgoing_id + 1)
        self._remote_incoming_window -= 1
        self._sender_credit -= 1
        self._sender_delivery_count = _seq(self._sender_delivery_count + 1)

    # ---- frame handling

    def _dispatch(self, frame: fr.Frame) -> None:
        p = frame.performative
        if p is None:
            return  # heartbeat
        name = p.name
        if name == "transfer":
            self._on_transfer(p, frame.payload)
        elif name == "flow":
            self._remote_incoming_window = _serial_diff(
                int(p.get("next-incoming-id", 0)) + int(p.get("incoming-window", 0)), self._next_outgoing_id
            )
            if p.get("handle") == _SENDER and p.get("link-credit") is not None:
                self._sender_credit = _serial_diff(
                    int(p.get("delivery-count", 0)) + int(p.get("link-credit")), self._sender_delivery_count
                )
        elif name in ("detach", "end", "close"):
            condition, description = fr.error_text(p.get("error"))
            what = {"detach": f"the {MANAGEMENT_NODE} link", "end": "the session", "close": "the connection"}[
                name
            ]
            if name == "close":
                self._closed = True
            detail = f": {condition}" if condition else ""
            detail += f" ({description})" if description else ""
            self._gone = RemoteClosed(
                f"{self.params.redacted()}: the broker closed {what}{detail}",
                condition=condition,
                description=description,
            )
            raise self._gone
        # disposition (our sends are pre-settled), attach/begin repeats: nothing to do

    def _on_transfer(self, p: fr.Performative, payload: bytes) -> None:
        # transfer ids are implicit: one per transfer frame, from the broker's begin (not the delivery-id,
        # a different numbering that RabbitMQ 4.0 advances on its own)
        self._next_incoming_id = _seq(self._next_incoming_id + 1)
        self._incoming_window -= 1
        self._partial_size += len(payload)
        if self._partial_size > self.max_message_size:
            raise Amqp10ProtocolError(f"a management answer exceeds {self.max_message_size} bytes")
        self._partial.append(payload)
        if p.get("more", False):
            return
        data = b"".join(self._partial)
        self._partial, self._partial_size = [], 0
        self._receiver_delivery_count = _seq(self._receiver_delivery_count + 1)
        self._receiver_credit -= 1
        if self._incoming_window < _WINDOW // 2 or self._receiver_credit < _CREDIT // 2:
            self._incoming_window = _WINDOW
            self._grant_credit()
        if p.get("aborted", False):
            return
        try:
            message = decode_message(data)
        except AmqpDecodeError as exc:
            raise Amqp10ProtocolError(f"undecodable management answer: {exc}") from None
        props = message.properties or {}
        subject = props.get("subject")
        try:
            status = int(str(subject))
        except ValueError:
            raise Amqp10ProtocolError(
                f"management answer without a status code (subject {subject!r})"
            ) from None
        self._responses[props.get("correlation-id")] = Response(status, message.value)

    # ---- I/O

    def _send(self, data: bytes) -> None:
        if self._closed:
            raise Amqp10ConnectionError(f"{self.params.redacted()}: connection is closed")
        try:
            with self._wlock:
                self._sock.sendall(data)
                self._last_write = time.monotonic()
        except TimeoutError:
            raise Amqp10Timeout(
                f"{self.params.redacted()}: sending timed out after {self.timeout:g}s"
            ) from None
        except OSError as exc:
            self._closed = True
            raise Amqp10ConnectionError(
                f"{self.params.redacted()}: connection broke while sending: "
                f"{exc.strerror or type(exc).__name__}"
            ) from None

    def _fill(self, n: int, deadline: float, waiting: str) -> None:
        while len(self._rbuf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Amqp10Timeout(
                    f"{self.params.redacted()}: no answer within {self.timeout:g}s "
                    f"while waiting for {waiting}"
                )
            self._sock.settimeout(left)
            try:
                data = self._sock.recv(max(65536, n - len(self._rbuf)))
            except TimeoutError:
                continue
            except ssl.SSLError as exc:
                raise Amqp10TlsError(f"{self.params.redacted()}: TLS error: {exc.reason or exc}") from None
            except OSError as exc:
                self._closed = True
                raise Amqp10ConnectionError(
                    f"{self.params.redacted()}: connection broke while waiting for "
                    f"{waiting}: {exc.strerror or type(exc).__name__}"
                ) from None
            if not data:
                self._closed = True
                raise Amqp10ConnectionError(
                    f"{self.params.redacted()}: the broker closed the connection "
                    f"while we were waiting for {waiting}"
                )
            self._rbuf += data

    def _take(self, n: int) -> bytes:
        data = bytes(self._rbuf[:n])
        del self._rbuf[:n]
        return data

    def _expect_header(self, header: bytes, deadline: float) -> None:
        self._fill(8, deadline, "the protocol header")
        got = self._take(8)
        if got == header:
            return
        if got[:4] == b"AMQP" and got[4:] in (b"\x00\x00\x09\x01", b"\x01\x01\x00\x09"):
            raise NotAmqp10Broker(
                f"{self.params.address} speaks AMQP 0-9-1 only, not AMQP 1.0 (RabbitMQ 3.x "
                "without AMQP 1.0; topology over AMQP 1.0 needs RabbitMQ 4.0 or later)"
            )
        if got[:4] == b"AMQP":
            raise NotAmqp10Broker(
                f"{self.params.address} refused protocol header {header[4:].hex()} "
                f"and offered {got[4:].hex()}"
            )
        raise NotAmqp10Broker(f"{self.params.address} did not answer with an AMQP protocol header")

    def _read_frame(self, deadline: float, waiting: str) -> fr.Frame:
        self._fill(8, deadline, waiting)
        size = fr.frame_size(bytes(self._rbuf[:8]), self._frame_limit)
        self._fill(size, deadline, waiting)
        return fr.parse_frame(self._take(size), self._frame_limit)

    def _expect(self, ftype: int, name: str, deadline: float) -> fr.Performative:
        while True:
            frame = self._read_frame(deadline, f"the broker's {name}")
            p = frame.performative
            if p is None:
                continue
            if p.name == name and frame.type == ftype:
                return p
            self._dispatch(frame)
            raise Amqp10ProtocolError(f"expected {name}, got {p.name}")

    # ---- heartbeat and closing

    def _start_heartbeat(self, idle_s: float) -> None:
        interval = max(0.5, idle_s / 2)

        def beat() -> None:
            empty = fr.encode_frame(fr.FRAME_AMQP, 0, None)
            while not self._stop.wait(interval / 2):
                if time.monotonic() - self._last_write >= interval:
                    try:
                        self._send(empty)
                    except Exception:
                        return

        self._heartbeat = threading.Thread(target=beat, name="amqp10-heartbeat", daemon=True)
        self._heartbeat.start()

    def close(self) -> None:
        """Close politely (close frame, wait briefly for the broker's close), then the socket."""
        self._stop.set()
        if self._closed:
            self._abort()
            return
        try:
            self._send(fr.close_frame())
            deadline = time.monotonic() + min(self.timeout, 2.0)
            while True:
                frame = self._read_frame(deadline, "the broker's close")
                if frame.performative is not None and frame.performative.name == "close":
                    break
        except Exception:
            pass
        self._abort()

    def _abort(self) -> None:
        self._stop.set()
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> Amqp10Connection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Amqp10Connection({self.params.redacted()!r})"


def _connect(params: Amqp10Params, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((params.host, params.port), timeout=timeout)
    except TimeoutError:
        raise Amqp10Timeout(f"{params.redacted()}: no TCP connection within {timeout:g}s") from None
    except OSError as exc:
        raise Amqp10ConnectionError(
            f"{params.redacted()}: cannot connect: {exc.strerror or type(exc).__name__}"
        ) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not params.tls:
        return sock
    try:
        ctx = ssl.create_default_context(cafile=params.ca_file)
        if not params.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if params.cert_file:
            ctx.load_cert_chain(params.cert_file, params.key_file)
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise Amqp10TlsError(f"{params.redacted()}: cannot load TLS files: {exc}") from None
    try:
        return ctx.wrap_socket(sock, server_hostname=params.server_hostname or params.host)
    except ssl.SSLError as exc:
        sock.close()
        raise Amqp10TlsError(f"{params.redacted()}: TLS handshake failed: {exc.reason or exc}") from None
    except OSError as exc:
        sock.close()
        raise Amqp10ConnectionError(
            f"{params.redacted()}: TLS handshake broke: {exc.strerror or type(exc).__name__}"
        ) from None


__all__ = ["MANAGEMENT_NODE", "Amqp10Connection", "Response"]
