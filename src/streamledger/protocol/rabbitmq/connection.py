"""One synchronous connection to a RabbitMQ stream broker.

Does the mandatory opening sequence (PeerProperties, SASL PLAIN/EXTERNAL, Tune, Open, then
ExchangeCommandVersions only on brokers >= 3.11, because older ones close the connection on
an unknown key), correlates requests with responses, answers a server Close, and keeps the
connection alive with a small heartbeat thread (the server drops a connection that stays silent
for 2-3 heartbeat intervals, which an idle Airflow worker easily does).

Threading: requests and reads happen on the caller's thread only; the heartbeat thread only
writes, under the same lock as every other write. Frames that arrive while waiting for a
response (heartbeats, confirms, Deliver, MetadataUpdate) are dispatched to the hooks below.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.errors import (
    AccessRefused,
    AuthenticationError,
    ConnectionClosed,
    ConnectionFailed,
    FrameTooLarge,
    InvalidRequest,
    PreconditionFailed,
    ProtocolError,
    ResponseError,
    StreamAlreadyExists,
    StreamNotAvailable,
    StreamNotFound,
    StreamTimeout,
    TlsError,
    UnsupportedByBroker,
)
from streamledger.protocol.rabbitmq.url import ConnectionParams, host_port
from streamledger.protocol.rabbitmq.wire import (
    FrameReader,
    Reader,
    Writer,
    close_frame,
    exchange_command_versions_frame,
    heartbeat_frame,
    open_frame,
    peer_properties_frame,
    sasl_authenticate_frame,
    sasl_handshake_frame,
    tune_frame,
)

log = logging.getLogger("streamledger.rabbitmq")
T = TypeVar("T")

_HEARTBEAT_FRAME: Final = heartbeat_frame()
_PRE_OPEN_INBOUND_MAX: Final = 1 << 20
_CLIENT_VERSION: Final = "0.1.0"

# Hooks receive (version, buffer, body_pos, frame_end); the buffer is only valid during the call.
FrameHook = Callable[[int, bytearray, int, int], None]


def parse_version(version: str | None) -> tuple[int, ...] | None:
    """``"4.3.6"`` -> ``(4, 3, 6)``; suffixes such as ``-rc.1`` or ``+deb`` are ignored."""
    if not version:
        return None
    numbers: list[int] = []
    for part in version.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(numbers) if numbers else None


#: The backoff between attempts of a transient failure: 0.2 s, doubling, at most 2 s.
BACKOFF_FIRST, BACKOFF_MAX = 0.2, 2.0


def with_backoff(fn: Callable[[], T], *, transient: Callable[[Exception], bool], attempts: int) -> T:
    """``fn()``, called again after a growing pause while it raises what ``transient`` accepts, at
    most ``attempts`` times in all; the last failure is raised as it is.

    Why not tenacity: it imports tornado and asyncio with it (~0.1 s in a fresh process), paid by every
    job process and every fresh Spark worker, for a loop of a few lines."""
    for attempt in range(max(1, attempts)):
        try:
            return fn()
        except Exception as exc:
            if attempt + 1 >= max(1, attempts) or not transient(exc):
                raise
        time.sleep(min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** attempt))
    raise AssertionError("unreachable")  # the loop returns or raises


class Connection:
    """An open, authenticated connection (use :meth:`open`)."""

    def __init__(self, params: ConnectionParams, sock: socket.socket, *, timeout: float) -> None:
        self.params = params
        self.timeout = timeout
        self._sock = sock
        self._reader = FrameReader(sock.recv_into, max_frame=_PRE_OPEN_INBOUND_MAX)
        self._write_lock = threading.Lock()
        self._corr = 0
        self._opened = False
        self._closed = False
        self._last_write = time.monotonic()
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self.server_properties: dict[str, str] = {}
        self.connection_properties: dict[str, str] = {}
        self.frame_max = c.DEFAULT_FRAME_MAX
        self.heartbeat = 0
        self.server_commands: dict[int, tuple[int, int]] | None = None
        self.deliver_version = 1
        self.max_inbound_frame = c.DEFAULT_MAX_INBOUND_FRAME
        # hooks for frames that are not responses
        self.on_deliver: FrameHook | None = None
        self.on_publish_confirm: FrameHook | None = None
        self.on_publish_error: FrameHook | None = None
        self.on_credit_error: Callable[[int, int], None] | None = None
        self.metadata_updates: list[tuple[int, str]] = []
        self.closed_by_server: ConnectionClosed | None = None

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    def open(cls, params: ConnectionParams, *, timeout: float = 10.0, attempts: int = 3) -> Connection:
        """Connect and authenticate, retrying only transient connect failures with backoff."""

        def transient(exc: Exception) -> bool:
            return isinstance(exc, ConnectionFailed) and not isinstance(exc, TlsError | ConnectionClosed)

        return with_backoff(lambda: cls._open_once(params, timeout), transient=transient, attempts=attempts)

    @classmethod
    def _open_once(cls, params: ConnectionParams, timeout: float) -> Connection:
        raw, params = cls._first_answering(params, timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock: socket.socket = raw
        if params.tls:
            sock = cls._wrap_tls(raw, params)
        conn = cls(params, sock, timeout=timeout)
        try:
            conn._handshake()
        except BaseException:
            conn._shutdown_socket()
            raise
        return conn

    @staticmethod
    def _first_answering(params: ConnectionParams, timeout: float) -> tuple[socket.socket, ConnectionParams]:
        """A socket to the first of ``params.addresses`` that accepts one, and the params naming
        it (its host is what TLS verifies); when none does, one error naming every address tried."""
        tried = params.addresses
        for i, (host, port) in enumerate(tried):
            try:
                raw = socket.create_connection((host, port), timeout=timeout)
            except OSError as exc:
                if i + 1 < len(tried):
                    continue
                where = ", ".join(host_port(h, p) for h, p in tried)
                if isinstance(exc, TimeoutError):
                    raise ConnectionFailed(f"connecting to {where} timed out after {timeout:g}s") from None
                raise ConnectionFailed(f"cannot connect to {where}: {exc.strerror or exc}") from None
            if i == 0:
                return raw, params
            # the node that answered first from now on; the others (the URL's own too) stay fallbacks
            rest = tuple(a for a in tried if a != (host, port))
            return raw, params.replace(host=host, port=port, fallbacks=rest)
        raise AssertionError("unreachable: addresses is never empty")

    @staticmethod
    def _wrap_tls(raw: socket.socket, params: ConnectionParams) -> socket.socket:
        for what, path in (("ca_file", params.ca_file), ("cert_file", params.cert_file),
                           ("key_file", params.key_file)):
            if path and not os.path.isfile(path):
                raw.close()
                raise InvalidRequest(f"TLS file not found: {what}={path}")
        try:
            ctx = ssl.create_default_context(cafile=params.ca_file)
            if not params.verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if params.cert_file:
                ctx.load_cert_chain(params.cert_file, params.key_file)
        except FileNotFoundError as exc:
            raw.close()
            raise InvalidRequest(f"TLS file not found: {exc.filename}") from None
        except ssl.SSLError as exc:
            raw.close()
            raise InvalidRequest(f"TLS files could not be loaded: {exc.reason or exc}") from None
        try:
            return ctx.wrap_socket(raw, server_hostname=params.server_hostname or params.host)
        except ssl.SSLCertVerificationError as exc:
            raw.close()
            raise TlsError(
                f"TLS handshake with {params.address} failed: the broker's certificate was not "
                f"accepted ({exc.verify_message or exc.reason}); check ca_file / server_hostname"
            ) from None
        except (ssl.SSLError, OSError) as exc:
            raw.close()
            reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
            raise TlsError(f"TLS handshake with {params.address} failed: {reason}") from None

    def _handshake(self) -> None:
        p = self.params
        props = {
            "product": "streamledger",
            "version": _CLIENT_VERSION,
            "platform": f"Python {platform.python_version()}",
            "information": "streamledger RabbitMQ Streams client",
        }
        if p.connection_name:
            props["connection_name"] = p.connection_name
        corr = self.next_corr()
        code, r = self.request(c.PEER_PROPERTIES, corr, peer_properties_frame(corr, props))
        self._check_handshake(c.PEER_PROPERTIES, code)
        self.server_properties = r.string_map()

        corr = self.next_corr()
        code, r = self.request(c.SASL_HANDSHAKE, corr, sasl_handshake_frame(corr))
        self._check_handshake(c.SASL_HANDSHAKE, code)
        mechanisms = r.string_array()
        mechanism = "EXTERNAL" if p.auth == "external" else "PLAIN"
        if mechanism not in mechanisms:
            raise AuthenticationError("SaslHandshake", c.SASL_MECHANISM_NOT_SUPPORTED,
                                      f"{c.code_name(c.SASL_MECHANISM_NOT_SUPPORTED)}: broker offers "
                                      f"{', '.join(sorted(mechanisms)) or 'nothing'}, not {mechanism}")
        if mechanism == "PLAIN":
            payload = b"\0" + p.username.encode("utf-8") + b"\0" + p.password.encode("utf-8")
        else:
            payload = b""
        corr = self.next_corr()
        frame = sasl_authenticate_frame(corr, mechanism, payload)
        # A wrong password is answered only after ~3 s (spec 5.3), so allow for that.
        code, r = self.request(c.SASL_AUTHENTICATE, corr, frame, timeout=max(self.timeout, 6.0))
        if code != c.OK:
            raise AuthenticationError("SaslAuthenticate", code, c.code_name(code))

        key, _version, pos, end = self._read_frame(time.monotonic() + self.timeout, "Tune")
        if key & 0x7FFF != c.TUNE:
            raise ProtocolError(f"expected Tune after authentication, got {c.command_name(key)}")
        tr = Reader(self._reader.buf, pos, end, "Tune")
        server_frame_max, server_heartbeat = tr.u32(), tr.u32()
        self.frame_max = _negotiate(p.frame_max, server_frame_max)
        self.heartbeat = _negotiate(p.heartbeat, server_heartbeat)
        self.send(tune_frame(self.frame_max, self.heartbeat))

        corr = self.next_corr()
        code, r = self.request(c.OPEN, corr, open_frame(corr, p.vhost))
        if code != c.OK:
            raise AuthenticationError(f"Open (virtual host {p.vhost!r})", code, c.code_name(code))
        if not r.at_end():
            self.connection_properties = r.string_map()
        self._opened = True
        self._reader.max_frame = self.max_inbound_frame
        if self.heartbeat > 0:
            self._hb_thread = threading.Thread(
                target=self._heartbeat_loop, name=f"rabbitmq-stream-heartbeat-{p.address}", daemon=True
            )
            self._hb_thread.start()
        version = self.version_tuple
        if version is not None and version >= c.COMMAND_SINCE[c.EXCHANGE_COMMAND_VERSIONS]:
            self._exchange_command_versions()
        log.info("connected to %s (RabbitMQ %s, frame_max %d, heartbeat %ds, deliver v%d)",
                 p.redacted(), self.server_version, self.frame_max, self.heartbeat, self.deliver_version)

    def _check_handshake(self, key: int, code: int) -> None:
        if code != c.OK:
            raise ConnectionFailed(
                f"{c.command_name(key)} refused by {self.params.address}: {c.code_name(code)}"
            )

    def _exchange_command_versions(self) -> None:
        corr = self.next_corr()
        # Max version exactly 2 for Deliver switches the connection to Deliver v2 (spec 5.6).
        frame = exchange_command_versions_frame(corr, [(c.DELIVER, 1, 2)])
        code, r = self.request(c.EXCHANGE_COMMAND_VERSIONS, corr, frame)
        if code != c.OK:
            self.server_commands = {}
            return
        commands: dict[int, tuple[int, int]] = {}
        for _ in range(r.count(6)):
            key, low, high = r.u16(), r.u16(), r.u16()
            commands[key] = (low, high)
        self.server_commands = commands
        self.deliver_version = 2

    # -- properties ---------------------------------------------------------------------------

    @property
    def server_version(self) -> str | None:
        return self.server_properties.get("version")

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        return parse_version(self.server_version)

    @property
    def advertised_address(self) -> tuple[str, int] | None:
        host = self.connection_properties.get("advertised_host")
        port = self.connection_properties.get("advertised_port")
        if not host or not port or not port.isdigit():
            return None
        return host, int(port)

    @property
    def closed(self) -> bool:
        return self._closed

    def supports(self, key: int) -> bool:
        """Whether the broker accepts a client command (from ExchangeCommandVersions, else its version)."""
        if self.server_commands is not None and key in self.server_commands:
            return True
        if key in (c.STREAM_STATS, c.CREATE_SUPER_STREAM, c.DELETE_SUPER_STREAM, c.RESOLVE_OFFSET_SPEC):
            return False  # only ever known through ExchangeCommandVersions
        since = c.COMMAND_SINCE.get(key)
        version = self.version_tuple
        return since is not None and version is not None and version >= since

    def require(self, key: int, detail: str = "") -> None:
        """Raise :class:`UnsupportedByBroker` instead of sending a command the broker would choke on."""
        if not self.supports(key):
            raise UnsupportedByBroker(c.command_name(key), self.server_version, detail)

    # -- I/O ----------------------------------------------------------------------------------

    def next_corr(self) -> int:
        self._corr = (self._corr + 1) & 0x7FFFFFFF
        return self._corr

    def send(self, frame: bytes | bytearray | memoryview) -> None:
        """Write one or more complete frames; each must respect the negotiated frame max."""
        size = len(frame) - 4
        limit = self.frame_max if self._opened else c.PRE_OPEN_FRAME_MAX
        if limit and size > limit:
            # Concatenated frames are checked by their producer; a single big one is refused here.
            first = int.from_bytes(bytes(frame[:4]), "big")
            if first > limit:
                raise FrameTooLarge(
                    f"outgoing frame of {first} bytes exceeds the negotiated frame max {limit}"
                )
        self._ensure_open()
        with self._write_lock:
            try:
                self._sock.sendall(frame)
            except TimeoutError:
                self._fail()
                raise StreamTimeout(f"writing to {self.params.address} timed out") from None
            except OSError as exc:
                self._fail()
                raise ConnectionFailed(f"connection to {self.params.address} broke while writing: "
                                       f"{exc.strerror or type(exc).__name__}") from None
            self._last_write = time.monotonic()

    def _ensure_open(self) -> None:
        if self._closed:
            if self.closed_by_server is not None:
                raise self.closed_by_server
            raise ConnectionFailed(f"connection to {self.params.address} is closed")

    def _fail(self) -> None:
        self._hb_stop.set()
        self._closed = True
        self._shutdown_socket()

    def _read_frame(self, deadline: float | None, waiting_for: str) -> tuple[int, int, int, int]:
        """Next frame, with the socket timeout set from ``deadline``; errors name what we waited for."""
        self._ensure_open()
        reader = self._reader
        if reader.buffered() < 8 or deadline is not None:
            if deadline is None:
                self._sock.settimeout(None)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StreamTimeout(f"no {waiting_for} from {self.params.address} within the time limit")
                self._sock.settimeout(remaining)
        try:
            return reader.next_frame()
        except TimeoutError:
            raise StreamTimeout(
                f"no {waiting_for} from {self.params.address} within {self._limit_text(deadline)}"
            ) from None
        except ConnectionClosed:
            self._fail()
            raise ConnectionClosed(
                f"the broker at {self.params.address} closed the connection while we waited for "
                f"{waiting_for} (a broker closes on commands it cannot parse)"
            ) from None
        except ssl.SSLError as exc:
            self._fail()
            raise ConnectionFailed(f"TLS error from {self.params.address}: {exc.reason or exc}") from None
        except OSError as exc:
            self._fail()
            raise ConnectionFailed(f"connection to {self.params.address} broke while waiting for "
                                   f"{waiting_for}: {exc.strerror or type(exc).__name__}") from None

    def _limit_text(self, deadline: float | None) -> str:
        return "the time limit" if deadline is None else f"{self.timeout:g}s"

    def read_frame(self, deadline: float | None, waiting_for: str) -> tuple[int, int, int, int]:
        """Public frame read for the range reader's loop (server-initiated frames are NOT dispatched)."""
        return self._read_frame(deadline, waiting_for)

    @property
    def buffer(self) -> bytearray:
        """The read buffer the positions returned by :meth:`read_frame` point into."""
        return self._reader.buf

    @property
    def view(self) -> memoryview:
        """A memoryview of :attr:`buffer` (replaced when the buffer grows; fetch it per frame)."""
        return self._reader.view

    def request(
        self, key: int, corr: int, frame: bytes, *, timeout: float | None = None, stream: str | None = None
    ) -> tuple[int, Reader]:
        """Send a request and wait for its response; returns ``(response code, payload reader)``.

        The reader is positioned after the response code and is valid until the next read.
        """
        r = self.call(key, corr, frame, timeout=timeout)
        return r.u16(), r

    def call(self, key: int, corr: int, frame: bytes, *, timeout: float | None = None) -> Reader:
        """Send a request and return its response payload, positioned after the correlation id
        (for Metadata, whose response has no response code)."""
        self.send(frame)
        name = c.command_name(key)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            fkey, version, pos, end = self._read_frame(deadline, f"the {name} response")
            base = fkey & 0x7FFF
            # Route/Partitions responses come without the response bit on 3.9.0-3.10.25 (spec 2).
            if base == key and (fkey & c.RESPONSE_BIT or key in (c.ROUTE, c.PARTITIONS)):
                r = Reader(self._reader.buf, pos, end, f"{name} response")
                if r.u32() != corr:
                    continue  # a late answer to an earlier, timed-out request
                return r
            self.dispatch(fkey, version, pos, end, waiting_for=name)

    def pipeline(self, requests: Sequence[tuple[int, int, bytes]], parse: Callable[[int, Reader], T], *,
                 window: int = 256, timeout: float | None = None) -> list[T]:
        """Several requests in flight at once: ``requests`` are ``(key, correlation id, frame)``;
        ``parse(i, reader)`` turns the answer of request ``i`` (positioned after the correlation
        id, valid during the call only) into its result. Answers are matched by correlation id, so
        their order does not matter; at most ``window`` wait at a time, so neither side's socket
        buffer fills up. The broker answers each request on its own, as it does one at a time: a
        batch of N answers costs one round trip instead of N. ``timeout`` bounds each wait."""
        out: list[T | None] = [None] * len(requests)
        waiting: dict[int, tuple[int, int]] = {}  # corr -> (index, key)
        limit = self.timeout if timeout is None else timeout
        sent = 0
        while sent < len(requests) or waiting:
            if sent < len(requests) and len(waiting) < window // 2 + 1:
                batch = requests[sent:sent + window - len(waiting)]
                for i, (key, corr, _frame) in enumerate(batch, start=sent):
                    waiting[corr] = (i, key)
                self.send(b"".join(frame for _key, _corr, frame in batch))
                sent += len(batch)
                continue
            fkey, version, pos, end = self._read_frame(time.monotonic() + limit, "pipelined responses")
            base = fkey & 0x7FFF
            if fkey & c.RESPONSE_BIT or base in (c.ROUTE, c.PARTITIONS):
                r = Reader(self._reader.buf, pos, end, f"{c.command_name(base)} response")
                corr = r.u32() if end - pos >= 4 else -1
                mine = waiting.get(corr)
                if mine is not None and mine[1] == base:
                    del waiting[corr]
                    out[mine[0]] = parse(mine[0], r)
                    continue
            self.dispatch(fkey, version, pos, end, waiting_for="pipelined responses")
        return out  # type: ignore[return-value]

    def dispatch(self, key: int, version: int, pos: int, end: int, *, waiting_for: str = "a frame") -> None:
        """Handle a frame that is not the awaited response."""
        buf = self._reader.buf
        base = key & 0x7FFF
        if base == c.HEARTBEAT:
            return
        if base == c.DELIVER:
            if self.on_deliver is not None:
                self.on_deliver(version, buf, pos, end)
            return
        if base == c.PUBLISH_CONFIRM:
            if self.on_publish_confirm is not None:
                self.on_publish_confirm(version, buf, pos, end)
            return
        if base == c.PUBLISH_ERROR:
            if self.on_publish_error is not None:
                self.on_publish_error(version, buf, pos, end)
            return
        if base == c.METADATA_UPDATE:
            r = Reader(buf, pos, end, "MetadataUpdate")
            code = r.u16()
            self.metadata_updates.append((code, r.string()))
            return
        if key == c.CREDIT | c.RESPONSE_BIT:
            r = Reader(buf, pos, end, "Credit error")
            code, sub = r.u16(), r.u8()
            if self.on_credit_error is not None:
                self.on_credit_error(sub, code)
            return
        if key == c.CLOSE:
            self._server_close(buf, pos, end, waiting_for)
        if key == c.CONSUMER_UPDATE:
            r = Reader(buf, pos, end, "ConsumerUpdate")
            corr = r.u32()
            # We never ask for single-active-consumer; answer "use the Subscribe spec" to be safe.
            self.send(Writer(c.CONSUMER_UPDATE | c.RESPONSE_BIT).u32(corr).u16(c.OK).u16(0).frame())
            return
        if key & c.RESPONSE_BIT:
            return  # a late response to a request that already timed out
        log.debug("ignoring unexpected frame %s", c.command_name(key))

    def _server_close(self, buf: bytearray, pos: int, end: int, waiting_for: str) -> None:
        r = Reader(buf, pos, end, "Close")
        corr = r.u32()
        code = r.u16()
        reason = r.string() if not r.at_end() else ""
        try:
            self.send(Writer(c.CLOSE | c.RESPONSE_BIT).u32(corr).u16(c.OK).frame())
        except Exception:
            pass
        err = ConnectionClosed(
            f"the broker at {self.params.address} (RabbitMQ {self.server_version or '?'}) closed the "
            f"connection while we waited for {waiting_for}: {c.code_name(code)}"
            + (f" ({reason})" if reason else ""),
            code=code,
            code_name=c.code_name(code),
        )
        self.closed_by_server = err
        self._fail()
        raise err

    def _heartbeat_loop(self) -> None:
        interval = max(1.0, self.heartbeat / 2)
        while not self._hb_stop.wait(min(interval, 5.0)):
            if time.monotonic() - self._last_write >= interval:
                try:
                    self.send(_HEARTBEAT_FRAME)
                except Exception:
                    return

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Polite Close (wait briefly for the answer), then drop the socket. Idempotent."""
        if self._closed:
            return
        self._hb_stop.set()
        try:
            corr = self.next_corr()
            frame = close_frame(corr, c.OK, "OK")
            self.request(c.CLOSE, corr, frame, timeout=min(self.timeout, 2.0))
        except Exception:
            pass
        self._closed = True
        self._shutdown_socket()

    def _shutdown_socket(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


def _negotiate(client: int, server: int) -> int:
    """Tune rule: if either side is 0 use the other, else the minimum (spec 5.4)."""
    if client == 0:
        return server
    if server == 0:
        return client
    return min(client, server)


def raise_for_code(code: int, command: int | str, stream: str | None = None) -> None:
    """Turn a non-OK response code into the matching typed error (no-op for OK)."""
    if code == c.OK:
        return
    name = command if isinstance(command, str) else c.command_name(command)
    cls = _CODE_ERRORS.get(code, ResponseError)
    raise cls(name, code, c.code_name(code), stream)


_CODE_ERRORS: Final[dict[int, type[ResponseError]]] = {
    c.STREAM_DOES_NOT_EXIST: StreamNotFound,
    c.STREAM_ALREADY_EXISTS: StreamAlreadyExists,
    c.STREAM_NOT_AVAILABLE: StreamNotAvailable,
    c.ACCESS_REFUSED: AccessRefused,
    c.PRECONDITION_FAILED: PreconditionFailed,
    c.AUTHENTICATION_FAILURE: AuthenticationError,
    c.VIRTUAL_HOST_ACCESS_FAILURE: AuthenticationError,
}
