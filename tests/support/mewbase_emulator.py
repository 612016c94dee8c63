"""TEST DOUBLE — an emulated mewbase event server, *not* mewbase.

mewbase (a Java event store) cannot be installed here, so the client's integration tests talk to this
small server written from ``specs/mewbase.md`` (the draft wire protocol): real TCP sockets on
127.0.0.1 (ephemeral ports), one thread per connection plus one per subscription and per query, BSON
frames ``{type, frame}``. On purpose it does its own framing and field handling (it shares only the
``bson`` library with the client, no client module), so a bug in the client's codec is not mirrored.
Where the draft is silent it follows the client's documented choices
(``streamledger.protocol.mewbase.conventions``), restated here in its own code.

What it models:

* **Channels** as position-addressed logs: a position is the byte offset of the event's record in an
  imaginary log file (the previous position + the record's size), so positions increase with gaps.
  ``append(channel, event, pos=..., timestamp=...)`` seeds events at chosen positions and times.
* **PUBLISH** answered after the event is appended (the confirm); events over ``max_event_size`` are
  refused (``EVENT_TOO_LARGE``); ``fail_next_publishes(n)`` refuses with ``STORAGE_FAILED``.
* **Transactions** per connection and sessID: staged PUBLISHes are answered at once, COMMITTX appends
  them together, ABORTTX drops them; STARTTX twice / COMMITTX without one are refused.
* **Subscriptions** by startPos, startTimestamp, durableID and matcher (top-level field equality), with
  RECEV streaming of stored and then live events. Durable subscriptions keep ``lastAcked`` in the
  system binder ``_mb.durableSubs`` and resume after it; UNSUBSCRIBE deletes that state, SUBCLOSE keeps
  it. ACKEV with ``pos`` acknowledges up to that position (it must not exceed what was delivered; a
  violation closes the connection, as the reference server does for a bad ACKEV); without ``pos`` (or
  with ``ackev_pos=False``) it acknowledges the last event sent, the draft's reading.
* **Queries** on binders (``put_document``) and on the system binders ``_mb.channels`` (with
  ``firstPos``/``lastPos``/``lastTimestamp``/``count`` unless ``channel_stats=False``) and
  ``_mb.durableSubs``; QUERYRESPONSE carries ``numResults``; at most ``query_window`` QUERYRESULT frames
  are unacknowledged at any time (``max_unacked_seen`` records the peak).
* **Auth and versions**: ``users = {name: password}`` (None: anyone), ``versions``; a refused CONNECT
  gets ``ok: false`` and the connection is closed; a frame before CONNECT likewise.

Test controls: ``events_before_subresponse`` (stored events overtake the SUBRESPONSE, as they may on
an asynchronous server), ``ignore_next(frame_type, n)`` (never answer: client timeouts),
``send_raw(data)`` (write arbitrary bytes to every connection), ``close_all_connections()``, ``frames``
(every frame received), ``violations`` (protocol violations seen). Not modelled: persistence across
restarts, retention, clustering, subscription flow control (the draft has none), binders' write side
over the wire.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.codec_options import CodecOptions
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

RAW = CodecOptions(document_class=RawBSONDocument)
DURABLE_SUBS = "_mb.durableSubs"
CHANNELS = "_mb.channels"
RECORD_OVERHEAD = 8  # bytes an imaginary log record adds around the event (length + checksum)


@dataclass
class _Record:
    pos: int
    timestamp: int
    raw: bytes
    doc: dict[str, Any]


@dataclass
class _Channel:
    name: str
    records: list[_Record] = field(default_factory=list)
    next_pos: int = 0
    last_timestamp: int = 0


@dataclass
class _Subscription:
    sub_id: int
    channel: str
    cursor: int
    matcher: dict[str, Any] | None
    durable_id: str | None
    delivered: int | None = None
    closed: bool = False


@dataclass
class _Query:
    query_id: int
    unacked: int = 0
    closed: bool = False


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.write_lock = threading.Lock()
        self.connected = False
        self.alive = True
        self.subs: dict[int, _Subscription] = {}
        self.queries: dict[int, _Query] = {}
        self.txs: dict[int, list[tuple[str, bytes]]] = {}
        self.next_sub = 0


def _matches(doc: dict[str, Any], matcher: dict[str, Any] | None) -> bool:
    if not matcher:
        return True
    return all(key in doc and doc[key] == value for key, value in matcher.items())


class MewbaseServerEmulator:
    """An in-process fake mewbase server on 127.0.0.1 (test double; see the module docstring)."""

    def __init__(
        self,
        *,
        users: dict[str, str] | None = None,
        versions: tuple[str, ...] = ("1.0",),
        max_frame_size: int = 16 * 1024 * 1024,
        max_event_size: int = 1024 * 1024,
        query_window: int = 4,
        auto_create_channels: bool = True,
        channel_stats: bool = True,
        ackev_pos: bool = True,
        connect_rid: int | None = None,
        events_before_subresponse: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        self.users = users
        self.versions = versions
        self.max_frame_size = max_frame_size
        self.max_event_size = max_event_size
        self.query_window = query_window
        self.auto_create_channels = auto_create_channels
        self.channel_stats = channel_stats
        self.ackev_pos = ackev_pos
        self.connect_rid = connect_rid
        self.events_before_subresponse = events_before_subresponse
        self.host = host
        self.channels: dict[str, _Channel] = {}
        self.binders: dict[str, dict[str, dict[str, Any]]] = {}
        self.durable: dict[str, dict[str, Any]] = {}
        self.frames: list[tuple[str, dict[str, Any]]] = []
        self.violations: list[str] = []
        self.max_unacked_seen = 0
        self.connections_accepted = 0
        self._ignore: dict[str, int] = {}
        self._fail_publishes = 0
        self._lock = threading.RLock()
        self._appended = threading.Condition(self._lock)
        self._server: socket.socket | None = None
        self._conns: list[_Conn] = []
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> MewbaseServerEmulator:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((self.host, 0))
        server.listen(16)
        server.settimeout(0.05)  # accept() does not wake up on close from another thread: poll
        self._server = server
        self._spawn(self._accept_loop, "mewbase-emulator-accept")
        return self

    def stop(self) -> None:
        self._stopped.set()
        with self._appended:
            self._appended.notify_all()
        if self._server is not None:
            self._server.close()
        self.close_all_connections()
        for thread in list(self._threads):
            thread.join(timeout=2)

    def __enter__(self) -> MewbaseServerEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "emulator not started"
        return int(self._server.getsockname()[1])

    def url(self, user: str | None = None, password: str | None = None) -> str:
        auth = ""
        if user is not None:
            auth = user + (f":{password}" if password is not None else "") + "@"
        return f"mewbase://{auth}{self.host}:{self.port}"

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)

    # ------------------------------------------------------------------ test controls

    def create_channel(self, name: str) -> None:
        with self._lock:
            self.channels.setdefault(name, _Channel(name))

    def append(
        self, channel: str, event: dict[str, Any], *, pos: int | None = None, timestamp: int | None = None
    ) -> int:
        """Store an event directly (seeding); returns its position."""
        with self._appended:
            chan = self.channels.setdefault(channel, _Channel(channel))
            record = self._append(chan, bson.encode(event), pos=pos, timestamp=timestamp)
            self._appended.notify_all()
            return record.pos

    def put_document(self, binder: str, doc_id: str, doc: dict[str, Any]) -> None:
        with self._lock:
            self.binders.setdefault(binder, {})[doc_id] = {"id": doc_id, **doc}

    def events(self, channel: str) -> list[tuple[int, int, dict[str, Any]]]:
        with self._lock:
            chan = self.channels.get(channel)
            return [] if chan is None else [(r.pos, r.timestamp, r.doc) for r in chan.records]

    def positions(self, channel: str) -> list[int]:
        return [pos for pos, _, _ in self.events(channel)]

    def ignore_next(self, frame_type: str, count: int = 1) -> None:
        with self._lock:
            self._ignore[frame_type] = self._ignore.get(frame_type, 0) + count

    def fail_next_publishes(self, count: int = 1) -> None:
        with self._lock:
            self._fail_publishes += count

    def send_raw(self, data: bytes) -> None:
        for conn in list(self._conns):
            with conn.write_lock:
                try:
                    conn.sock.sendall(data)
                except OSError:
                    pass

    def close_all_connections(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            self._kill(conn)

    def frames_of(self, frame_type: str) -> list[dict[str, Any]]:
        with self._lock:
            return [body for kind, body in self.frames if kind == frame_type]

    # ------------------------------------------------------------------ log

    def _append(
        self, chan: _Channel, raw: bytes, *, pos: int | None = None, timestamp: int | None = None
    ) -> _Record:
        now = int(time.time() * 1000)
        stamp = timestamp if timestamp is not None else max(now, chan.last_timestamp)
        position = chan.next_pos if pos is None else pos
        if chan.records and position <= chan.records[-1].pos:
            raise ValueError(f"position {position} does not follow the channel's last {chan.records[-1].pos}")
        record = _Record(position, stamp, raw, bson.decode(raw))
        size = len(bson.encode({"timestamp": Int64(stamp), "event": RawBSONDocument(raw)}))
        chan.records.append(record)
        chan.next_pos = position + size + RECORD_OVERHEAD
        chan.last_timestamp = max(chan.last_timestamp, stamp)
        return record

    # ------------------------------------------------------------------ sockets

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._stopped.is_set():
            try:
                sock, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            conn = _Conn(sock)
            with self._lock:
                self._conns.append(conn)
                self.connections_accepted += 1
            self._spawn(self._serve, "mewbase-emulator-conn", conn)

    def _kill(self, conn: _Conn) -> None:
        conn.alive = False
        for sub in list(conn.subs.values()):
            sub.closed = True
        for query in list(conn.queries.values()):
            query.closed = True
        with self._appended:
            self._appended.notify_all()
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.sock.close()

    @staticmethod
    def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
        chunks = []
        while size:
            chunk = sock.recv(min(size, 1 << 16))
            if not chunk:
                return None
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _write(self, conn: _Conn, frame_type: str, body: dict[str, Any]) -> None:
        data = bson.encode({"type": frame_type, "frame": body})
        with conn.write_lock:
            self._write_locked(conn, data)

    def _write_locked(self, conn: _Conn, data: bytes) -> None:
        if not conn.alive:
            return
        try:
            conn.sock.sendall(data)
        except OSError:
            conn.alive = False

    def _violation(self, conn: _Conn, text: str) -> None:
        with self._lock:
            self.violations.append(text)
        self._kill(conn)

    def _serve(self, conn: _Conn) -> None:
        try:
            while conn.alive:
                head = self._recv_exact(conn.sock, 4)
                if head is None:
                    return
                (length,) = struct.unpack("<i", head)
                if not 5 <= length <= self.max_frame_size:
                    self._violation(conn, f"frame length {length}")
                    return
                rest = self._recv_exact(conn.sock, length - 4)
                if rest is None:
                    return
                try:
                    outer = bson.decode(head + rest, RAW)
                    frame_type = outer["type"]
                    body_raw = outer["frame"]
                    body = bson.decode(body_raw.raw)
                except Exception as exc:
                    self._violation(conn, f"undecodable frame: {exc}")
                    return
                with self._lock:
                    self.frames.append((frame_type, body))
                    ignored = self._ignore.get(frame_type, 0)
                    if ignored:
                        self._ignore[frame_type] = ignored - 1
                if ignored:
                    continue
                self._handle(conn, frame_type, body, body_raw)
        except OSError:
            return
        finally:
            self._kill(conn)
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)

    # ------------------------------------------------------------------ frames

    def _respond(
        self,
        conn: _Conn,
        rid: Any,
        ok: bool,
        code: str | None = None,
        msg: str | None = None,
        frame_type: str = "RESPONSE",
        **extra: Any,
    ) -> None:
        body: dict[str, Any] = {"ok": ok}
        if rid is not None:
            body["rID"] = rid
        if code is not None:
            body["errCode"] = code
            body["errMsg"] = msg or code
        body.update(extra)
        self._write(conn, frame_type, body)

    def _handle(self, conn: _Conn, frame_type: str, body: dict[str, Any], body_raw: RawBSONDocument) -> None:
        rid = body.get("rID")
        if frame_type == "CONNECT":
            self._connect(conn, body)
            return
        if not conn.connected:
            self._respond(conn, rid, False, "NOT_CONNECTED", "CONNECT must come first")
            self._kill(conn)
            return
        handler = getattr(self, f"_on_{frame_type.lower()}", None)
        if handler is None:
            self._violation(conn, f"unknown frame type {frame_type!r}")
            return
        handler(conn, body, body_raw, rid)

    def _connect(self, conn: _Conn, body: dict[str, Any]) -> None:
        rid = body.get("rID", self.connect_rid)
        version = body.get("version")
        if version not in self.versions:
            self._respond(
                conn, rid, False, "UNSUPPORTED_VERSION", f"client version {version!r} not supported"
            )
            self._kill(conn)
            return
        if self.users is not None:
            user, password = body.get("username"), body.get("password")
            if user not in self.users or self.users[user] != password:
                self._respond(conn, rid, False, "AUTHENTICATION_FAILED", "invalid user name or password")
                self._kill(conn)
                return
        conn.connected = True
        self._respond(conn, rid, True)

    def _channel(self, name: str, create: bool) -> _Channel | None:
        with self._lock:
            chan = self.channels.get(name)
            if chan is None and create and self.auto_create_channels:
                chan = self.channels[name] = _Channel(name)
            return chan

    def _on_publish(self, conn: _Conn, body: dict[str, Any], body_raw: RawBSONDocument, rid: Any) -> None:
        channel, event = body.get("channel"), body.get("event")
        if not isinstance(channel, str) or not isinstance(event, dict) or rid is None:
            self._respond(conn, rid, False, "INVALID_FRAME", "PUBLISH needs channel, event and rID")
            return
        raw = bytes(body_raw["event"].raw)
        if len(raw) > self.max_event_size:
            self._respond(conn, rid, False, "EVENT_TOO_LARGE", f"event of {len(raw)} bytes")
            return
        chan = self._channel(channel, create=True)
        if chan is None:
            self._respond(conn, rid, False, "NO_SUCH_CHANNEL", f"no channel {channel}")
            return
        sess = body.get("sessID")
        if sess is not None and sess in conn.txs:
            conn.txs[sess].append((channel, raw))
            self._respond(conn, rid, True)
            return
        with self._appended:
            if self._fail_publishes:
                self._fail_publishes -= 1
                failed = True
            else:
                failed = False
                self._append(chan, raw)
                self._appended.notify_all()
        if failed:
            self._respond(conn, rid, False, "STORAGE_FAILED", "failed to persist")
        else:
            self._respond(conn, rid, True)

    def _on_starttx(self, conn: _Conn, body: dict[str, Any], _raw: RawBSONDocument, rid: Any) -> None:
        sess = body.get("sessID")
        if sess in conn.txs:
            self._respond(conn, rid, False, "TX_IN_PROGRESS", f"session {sess} already has a transaction")
            return
        conn.txs[sess] = []
        self._respond(conn, rid, True)

    def _on_committx(self, conn: _Conn, body: dict[str, Any], _raw: RawBSONDocument, rid: Any) -> None:
        staged = conn.txs.pop(body.get("sessID"), None)
        if staged is None:
            self._respond(conn, rid, False, "NO_TX", f"session {body.get('sessID')} has no transaction")
            return
        with self._appended:
            for channel, raw in staged:
                chan = self._channel(channel, create=True)
                assert chan is not None
                self._append(chan, raw)
            self._appended.notify_all()
        self._respond(conn, rid, True)

    def _on_aborttx(self, conn: _Conn, body: dict[str, Any], _raw: RawBSONDocument, rid: Any) -> None:
        if conn.txs.pop(body.get("sessID"), None) is None:
            self._respond(conn, rid, False, "NO_TX", f"session {body.get('sessID')} has no transaction")
            return
        self._respond(conn, rid, True)

    def _on_subscribe(self, conn: _Conn, body: dict[str, Any], _raw: RawBSONDocument, rid: Any) -> None:
        channel = body.get("channel")
        chan = self._channel(channel, create=False) if isinstance(channel, str) else None
        if chan is None:
            self._respond(
                conn, rid, False, "NO_SUCH_CHANNEL", f"no channel {channel}", frame_type="SUBRESPONSE"
            )
            return
        durable_id = body.get("durableID")
        start_pos, start_ts = body.get("startPos"), body.get("startTimestamp")
        with self._lock:
            records = chan.records
            state = self.durable.get(durable_id) if durable_id is not None else None
            if state is not None:
                acked = state["lastAcked"]
                cursor = next((i for i, r in enumerate(records) if r.pos > acked), len(records))
            elif start_pos is not None:
                cursor = next((i for i, r in enumerate(records) if r.pos >= start_pos), len(records))
            elif start_ts is not None:
                cursor = next((i for i, r in enumerate(records) if r.timestamp >= start_ts), len(records))
            else:
                cursor = len(records)
            sub = _Subscription(conn.next_sub, channel, cursor, body.get("matcher"), durable_id)
            conn.next_sub += 1
            conn.subs[sub.sub_id] = sub
        if self.events_before_subresponse:
            # An asynchronous server may let stored events overtake the SUBRESPONSE.
            self._spawn(self._deliver, "mewbase-emulator-sub", conn, chan, sub)
            time.sleep(0.1)
            self._respond(conn, rid, True, frame_type="SUBRESPONSE", subID=sub.sub_id)
            return
        # The SUBRESPONSE goes out before the first RECEV of the subscription.
        self._respond(conn, rid, True, frame_type="SUBRESPONSE", subID=sub.sub_id)
        self._spawn(self._deliver, "mewbase-emulator-sub", conn, chan, sub)

    def _deliver(self, conn: _Conn, chan: _Channel, sub: _Subscription) -> None:
        while True:
            with self._appended:
                while sub.cursor >= len(chan.records) and not sub.closed and not self._stopped.is_set():
                    self._appended.wait(0.2)
                if sub.closed or self._stopped.is_set():
                    return
                record = chan.records[sub.cursor]
                sub.cursor += 1
            if not _matches(record.doc, sub.matcher):
                continue
            data = bson.encode(
                {
                    "type": "RECEV",
                    "frame": {
                        "subID": sub.sub_id,
                        "timestamp": Int64(record.timestamp),
                        "pos": Int64(record.pos),
                        "event": RawBSONDocument(record.raw),
                    },
                }
            )
            with conn.write_lock:
                if sub.closed:
                    return
                sub.delivered = record.pos
                self._write_locked(conn, data)

    def _end_subscription(self, conn: _Conn, body: dict[str, Any], rid: Any, *, delete: bool) -> None:
        sub = conn.subs.pop(body.get("subID"), None)  # type: ignore[arg-type]
        if sub is None:
            self._respond(conn, rid, False, "NO_SUCH_SUBSCRIPTION", f"no subscription {body.get('subID')}")
            return
        with conn.write_lock:
            sub.closed = True  # no RECEV of it is written after this point
        if delete and sub.durable_id is not None:
            with self._lock:
                self.durable.pop(sub.durable_id, None)
        self._respond(conn, rid, True)

    def _on_unsubscribe(self, conn: _Conn, body: dict[str, Any], _raw: RawBSONDocument, rid: Any) -> None:
        self._end_subscription(conn, body, rid, delete=True)

    def _on_subclose(self, conn: _Conn, body: dict[str, Any], _raw: RawBSONDocument, rid: Any) -> None:
        self._end_subscription(conn, body, rid, delete=False)

    def _on_ackev(self, conn: _Conn, body: dict[str, Any], _raw: RawBSONDocument, _rid: Any) -> None:
        sub = conn.subs.get(body.get("subID"))  # type: ignore[arg-type]
        if sub is None:
            self._violation(conn, f"ACKEV for unknown subscription {body.get('subID')}")
            return
        with conn.write_lock:
            delivered = sub.delivered
        pos = body.get("pos") if self.ackev_pos else None
        if delivered is None:
            self._violation(conn, f"ACKEV on subscription {sub.sub_id} before any event was delivered")
            return
        if pos is not None and pos > delivered:
            self._violation(conn, f"ACKEV of position {pos} beyond the delivered {delivered}")
            return
        acked = delivered if pos is None else pos
        if sub.durable_id is not None:
            with self._lock:
                self.durable[sub.durable_id] = {"lastAcked": Int64(acked), "channel": sub.channel}

    def _system_docs(self, binder: str) -> dict[str, dict[str, Any]] | None:
        with self._lock:
            if binder == CHANNELS:
                docs: dict[str, dict[str, Any]] = {}
                for name, chan in self.channels.items():
                    doc: dict[str, Any] = {"id": name}
                    if self.channel_stats:
                        doc["count"] = len(chan.records)
                        if chan.records:
                            doc["firstPos"] = Int64(chan.records[0].pos)
                            doc["lastPos"] = Int64(chan.records[-1].pos)
                            doc["lastTimestamp"] = Int64(chan.last_timestamp)
                    docs[name] = doc
                return docs
            if binder == DURABLE_SUBS:
                return {did: {"id": did, **state} for did, state in self.durable.items()}
            found = self.binders.get(binder)
            return None if found is None else dict(found)

    def _on_query(self, conn: _Conn, body: dict[str, Any], _raw: RawBSONDocument, _rid: Any) -> None:
        query_id, binder, matcher = body.get("queryID"), body.get("binder"), body.get("matcher")
        docs = self._system_docs(binder) if isinstance(binder, str) else None
        if docs is None:
            self._write(
                conn,
                "QUERYRESPONSE",
                {
                    "queryID": query_id,
                    "ok": False,
                    "errCode": "NO_SUCH_BINDER",
                    "errMsg": f"no binder {binder}",
                },
            )
            return
        results = [docs[k] for k in sorted(docs) if _matches(docs[k], matcher)]
        query = _Query(query_id)  # type: ignore[arg-type]
        conn.queries[query_id] = query  # type: ignore[index]
        self._write(conn, "QUERYRESPONSE", {"queryID": query_id, "ok": True, "numResults": len(results)})
        if results:
            self._spawn(self._send_results, "mewbase-emulator-query", conn, query, results)

    def _send_results(self, conn: _Conn, query: _Query, results: list[dict[str, Any]]) -> None:
        for index, doc in enumerate(results):
            with self._appended:
                while query.unacked >= self.query_window and not query.closed and not self._stopped.is_set():
                    self._appended.wait(0.2)
                if query.closed or self._stopped.is_set():
                    return
                query.unacked += 1
                self.max_unacked_seen = max(self.max_unacked_seen, query.unacked)
            last = index == len(results) - 1
            self._write(conn, "QUERYRESULT", {"queryID": query.query_id, "result": doc, "last": last})
        conn.queries.pop(query.query_id, None)

    def _on_queryack(self, conn: _Conn, body: dict[str, Any], _raw: RawBSONDocument, _rid: Any) -> None:
        query = conn.queries.get(body.get("queryID"))  # type: ignore[arg-type]
        with self._appended:
            if query is not None and query.unacked > 0:
                query.unacked -= 1
                self._appended.notify_all()
