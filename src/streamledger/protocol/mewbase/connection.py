"""One TCP connection to a mewbase server: CONNECT, rID correlation, and a single-threaded frame pump.

There is no background thread. Whoever waits (for a RESPONSE, an event, a query result) pumps the
socket: it reads what arrived, decodes the frames and files each where its waiter will look (responses
by rID, RECEV by subID, query frames by queryID). So a slow consumer simply stops reading and TCP
back-pressure slows the server down, and nothing runs after :meth:`Connection.close`. Writes interleave
with reads (the socket is non-blocking), so a server that streams events while the client publishes
cannot deadlock the two. One connection belongs to one thread at a time.

Every wait has a deadline; a response that arrives after its request timed out is dropped.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from streamledger.protocol.mewbase import conventions as cv
from streamledger.protocol.mewbase import frames as fr
from streamledger.protocol.mewbase.errors import (
    ConnectionClosed,
    FrameError,
    InvalidRequest,
    MewbaseConnectionError,
    MewbaseError,
    MewbaseProtocolError,
    MewbaseTimeout,
    server_error,
)
from streamledger.protocol.mewbase.url import MewbaseParams

__all__ = ["Connection"]

log = logging.getLogger(__name__)

_RECV_SIZE = 256 * 1024


class Connection:
    """A connected, authenticated connection (see the module docstring for the threading model)."""

    def __init__(
        self,
        params: MewbaseParams,
        *,
        timeout: float = 10.0,
        max_frame_size: int = cv.DEFAULT_MAX_FRAME_SIZE,
        version: str = cv.PROTOCOL_VERSION,
    ) -> None:
        if not timeout > 0:
            raise InvalidRequest(f"timeout must be positive, got {timeout}")
        self.params = params
        self.timeout = float(timeout)
        self.max_frame_size = max_frame_size
        self._decoder = fr.FrameDecoder(max_frame_size=max_frame_size)
        self._responses: dict[int, fr.Frame] = {}
        self._pending: set[int] = set()
        self._abandoned: set[int] = set()
        self._subscribing = 0
        self._events: dict[int, deque[fr.Frame]] = {}
        self._early: dict[int, deque[fr.Frame]] = {}
        self._queries: dict[int, deque[fr.Frame]] = {}
        self._connect_response: fr.Frame | None = None
        self._connecting = True
        self._failure: MewbaseError | None = None
        self._counters = {"rID": 0, "sessID": 0, "queryID": 0}
        self.dropped_events = 0
        try:
            sock = socket.create_connection((params.host, params.port), timeout=self.timeout)
        except TimeoutError:
            raise MewbaseTimeout(
                f"connecting to mewbase at {params.address} timed out after {timeout:g}s"
            ) from None
        except OSError as exc:
            raise MewbaseConnectionError(
                f"cannot connect to mewbase at {params.address}: {exc.strerror or exc}"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self._sock: socket.socket | None = sock
        try:
            self._handshake(version)
        except BaseException:
            self.close()
            raise

    # -- lifecycle --------------------------------------------------------------------------------

    def _handshake(self, version: str) -> None:
        body: dict[str, Any] = {"version": version}
        if self.params.username is not None:
            body["username"] = self.params.username
        if self.params.password is not None:
            body["password"] = self.params.password
        self.send(fr.CONNECT, body)
        deadline = time.monotonic() + self.timeout
        while self._connect_response is None:
            if not self.pump(deadline):
                raise MewbaseTimeout(
                    f"mewbase at {self.params.address} did not answer CONNECT within {self.timeout:g}s"
                )
        self._connecting = False
        response = self._connect_response.body
        if not response["ok"]:
            raise server_error(
                f"CONNECT to {self.params.address}", response.get("errCode"), response.get("errMsg")
            )

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:  # pragma: no cover - closing never matters
                pass
        if self._failure is None:
            self._failure = ConnectionClosed(f"connection to mewbase at {self.params.address} is closed")

    def _fail(self, error: MewbaseError) -> MewbaseError:
        """Remember why the connection is unusable, close it, and return the error to raise."""
        if self._sock is not None:
            self.close()
            self._failure = error
        return error

    def _check_open(self) -> socket.socket:
        if self._sock is None:
            if isinstance(self._failure, ConnectionClosed):
                raise ConnectionClosed(str(self._failure))
            raise ConnectionClosed(
                f"connection to mewbase at {self.params.address} is unusable after an earlier error: "
                f"{self._failure}"
            )
        return self._sock

    # -- ids --------------------------------------------------------------------------------------

    def next_id(self, name: str) -> int:
        """The next rID / sessID / queryID of this connection (int32, never repeated)."""
        value = self._counters[name] + 1
        if value > cv.INT32_MAX:
            raise self._fail(MewbaseProtocolError(f"{name} space of this connection is exhausted"))
        self._counters[name] = value
        return value

    # -- writing ----------------------------------------------------------------------------------

    def send(self, frame_type: str, body: Mapping[str, Any], *, timeout: float | None = None) -> None:
        """Encode and write one frame, reading whatever arrives meanwhile (no write/read deadlock)."""
        data = fr.encode_frame(frame_type, body, max_size=self.max_frame_size)
        sock = self._check_open()
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(
                    MewbaseTimeout(
                        f"writing {frame_type} to {self.params.address} timed out (server not reading)"
                    )
                )
            try:
                readable, writable, _ = select.select([sock], [sock], [], remaining)
            except (OSError, ValueError) as exc:
                raise self._fail(
                    MewbaseConnectionError(f"connection to {self.params.address} failed: {exc}")
                ) from None
            if writable:
                try:
                    sent = sock.send(view)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    raise self._fail(
                        MewbaseConnectionError(
                            f"connection to {self.params.address} lost while writing {frame_type}: "
                            f"{exc.strerror or exc}"
                        )
                    ) from None
                view = view[sent:]
            if readable and view:
                self._read_available(sock)
            sock = self._check_open()

    # -- reading ----------------------------------------------------------------------------------

    def pump(self, deadline: float) -> bool:
        """Wait until data arrives (then dispatch it) or ``deadline`` passes; False on the deadline."""
        sock = self._check_open()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], remaining)
        except (OSError, ValueError) as exc:
            raise self._fail(
                MewbaseConnectionError(f"connection to {self.params.address} failed: {exc}")
            ) from None
        if not readable:
            return False
        self._read_available(sock)
        return True

    def _read_available(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(_RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            raise self._fail(
                MewbaseConnectionError(f"connection to {self.params.address} lost: {exc.strerror or exc}")
            ) from None
        if not data:
            raise self._fail(ConnectionClosed(f"mewbase at {self.params.address} closed the connection"))
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            raise self._fail(exc) from None
        for frame in frames:
            self._dispatch(frame)

    def _dispatch(self, frame: fr.Frame) -> None:
        body = frame.body
        kind = frame.type
        if kind in (fr.RESPONSE, fr.SUBRESPONSE):
            if self._connecting and kind == fr.RESPONSE:
                # The answer to CONNECT: any rID or none (conventions, choice 2).
                self._connect_response = frame
                return
            rid = body.get("rID")
            if rid is None:
                raise self._fail(MewbaseProtocolError(f"{kind} without rID from {self.params.address}"))
            if rid in self._pending:
                self._pending.discard(rid)
                self._responses[rid] = frame
            elif rid in self._abandoned:
                self._abandoned.discard(rid)
                log.debug("dropping late %s for rID %s", kind, rid)
            else:
                raise self._fail(
                    MewbaseProtocolError(f"{kind} for unknown rID {rid} from {self.params.address}")
                )
        elif kind == fr.RECEV:
            sub_id = body["subID"]
            queue = self._events.get(sub_id)
            if queue is not None:
                queue.append(frame)
            elif self._subscribing:
                # A RECEV overtaking its SUBRESPONSE: keep it until the subscription is registered.
                self._early.setdefault(sub_id, deque()).append(frame)
            else:
                self.dropped_events += 1
        else:  # QUERYRESPONSE, QUERYRESULT
            queue = self._queries.get(body["queryID"])
            if queue is not None:
                queue.append(frame)

    # -- requests ---------------------------------------------------------------------------------

    def send_request(self, frame_type: str, body: Mapping[str, Any], *, timeout: float | None = None) -> int:
        """Send a request under a fresh rID and return the rID (answer with :meth:`wait_response`)."""
        rid = self.next_id("rID")
        self._pending.add(rid)
        try:
            self.send(frame_type, {**body, "rID": rid}, timeout=timeout)
        except BaseException:
            self._pending.discard(rid)
            raise
        return rid

    def wait_response(self, rid: int, what: str, *, timeout: float | None = None) -> fr.Frame:
        """The RESPONSE/SUBRESPONSE for ``rid``; MewbaseTimeout after ``timeout`` seconds."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while rid not in self._responses:
            if not self.pump(deadline):
                if rid in self._responses:
                    break
                self._pending.discard(rid)
                self._abandoned.add(rid)
                raise MewbaseTimeout(f"{what}: no response from {self.params.address} within {limit:g}s")
        return self._responses.pop(rid)

    def request(
        self, frame_type: str, body: Mapping[str, Any], what: str, *, timeout: float | None = None
    ) -> fr.Frame:
        """Send a request and wait for its answer; a refusal raises the matching ServerError."""
        rid = self.send_request(frame_type, body, timeout=timeout)
        frame = self.wait_response(rid, what, timeout=timeout)
        if not frame.body["ok"]:
            raise server_error(what, frame.body.get("errCode"), frame.body.get("errMsg"))
        return frame

    # -- subscriptions and queries ----------------------------------------------------------------

    def begin_subscribe(self) -> None:
        self._subscribing += 1

    def end_subscribe(self, sub_id: int | None) -> None:
        self._subscribing -= 1
        if sub_id is not None:
            self._events[sub_id] = self._early.pop(sub_id, deque())
        if not self._subscribing:
            self.dropped_events += sum(len(q) for q in self._early.values())
            self._early.clear()

    def forget_subscription(self, sub_id: int) -> None:
        queue = self._events.pop(sub_id, None)
        if queue:
            self.dropped_events += len(queue)

    def next_event(self, sub_id: int, deadline: float) -> fr.Frame | None:
        """The next RECEV of ``sub_id``, or None if none arrived by ``deadline``."""
        queue = self._events.get(sub_id)
        if queue is None:
            raise InvalidRequest(f"subscription {sub_id} is not open on this connection")
        while not queue:
            if not self.pump(deadline):
                return None
        return queue.popleft()

    def open_query(self, query_id: int) -> None:
        self._queries[query_id] = deque()

    def close_query(self, query_id: int) -> None:
        self._queries.pop(query_id, None)

    def next_query_frame(self, query_id: int, deadline: float) -> fr.Frame | None:
        queue = self._queries[query_id]
        while not queue:
            if not self.pump(deadline):
                return None
        return queue.popleft()
