"""The mewbase client: publish (with transactions), subscribe, acknowledge, query, and bounded reads.

Written from ``specs/mewbase.md`` (the draft ``wire_protocol.md`` of the mewbase event server); the
choices the draft leaves open are in :mod:`streamledger.protocol.mewbase.conventions`. Everything
runs on one :class:`~streamledger.protocol.mewbase.connection.Connection` and every wait has a timeout.

Bounded reads are exact over positions with gaps: :meth:`MewbaseClient.read_range` subscribes at
``start``, keeps the events with ``pos < end`` and stops at the first event with ``pos >= end`` (or
right after an event at ``end - 1``, the last position the range can hold). If no such event arrives
within ``timeout`` seconds of silence, ``end`` lies beyond what the server holds: it raises
:class:`OffsetOutOfRange` instead of waiting for ever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

from streamledger.protocol.mewbase import conventions as cv
from streamledger.protocol.mewbase import frames as fr
from streamledger.protocol.mewbase.connection import Connection
from streamledger.protocol.mewbase.errors import (
    InvalidRequest,
    MewbaseError,
    MewbaseProtocolError,
    MewbaseTimeout,
    OffsetOutOfRange,
    ServerError,
    server_error,
)
from streamledger.protocol.mewbase.events import Event, EventBatch
from streamledger.protocol.mewbase.url import MewbaseParams, parse_url

__all__ = ["MewbaseClient", "Subscription", "Transaction"]

log = logging.getLogger(__name__)

Document = Mapping[str, Any] | bytes


def _position(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer position, got {value!r}")
    if not 0 <= value <= cv.INT64_MAX:
        raise InvalidRequest(f"{name} {value} is outside 0..2**63-1")
    return value


class Subscription:
    """An open subscription (SUBSCRIBE answered by SUBRESPONSE); RECEV frames arrive on it."""

    def __init__(self, client: MewbaseClient, channel: str, sub_id: int, durable_id: str | None) -> None:
        self._client = client
        self.channel = channel
        self.sub_id = sub_id
        self.durable_id = durable_id
        self.open = True
        self.last_pos: int | None = None

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_quietly()

    def __repr__(self) -> str:
        return f"Subscription(channel={self.channel!r}, sub_id={self.sub_id}, durable_id={self.durable_id!r})"

    def poll(self, timeout: float | None = None) -> Event | None:
        """The next event, or None if none arrives within ``timeout`` seconds."""
        if not self.open:
            raise InvalidRequest(f"subscription {self.sub_id} on {self.channel!r} is closed")
        conn = self._client.connection
        limit = conn.timeout if timeout is None else timeout
        frame = conn.next_event(self.sub_id, time.monotonic() + limit)
        if frame is None:
            return None
        body = frame.body
        pos = int(body["pos"])
        if self.last_pos is not None and pos <= self.last_pos:
            raise MewbaseProtocolError(
                f"channel {self.channel!r}: position {pos} delivered after {self.last_pos} "
                "(positions must increase)"
            )
        self.last_pos = pos
        assert frame.event is not None
        return Event(self.sub_id, pos, int(body["timestamp"]), frame.event)

    def receive(self, timeout: float | None = None) -> Event:
        """The next event; MewbaseTimeout if none arrives within ``timeout`` seconds."""
        event = self.poll(timeout)
        if event is None:
            limit = self._client.connection.timeout if timeout is None else timeout
            raise MewbaseTimeout(
                f"channel {self.channel!r}: no event within {limit:g}s on subscription {self.sub_id}"
            )
        return event

    def ack(self, pos: int | None = None) -> None:
        """ACKEV: acknowledge every event up to and including ``pos`` (default: the last received).

        ACKEV has no response; frames on a connection are handled in order, so a later request's
        response shows the acknowledgement was processed.
        """
        if not self.open:
            raise InvalidRequest(f"subscription {self.sub_id} on {self.channel!r} is closed")
        if pos is None:
            if self.last_pos is None:
                raise InvalidRequest(
                    f"subscription {self.sub_id} on {self.channel!r} has received no event to ack"
                )
            pos = self.last_pos
        elif self.last_pos is None or pos > self.last_pos:
            raise InvalidRequest(
                f"subscription {self.sub_id} on {self.channel!r}: cannot acknowledge position {pos} "
                f"beyond the last one received ({self.last_pos})"
            )
        self._client.connection.send(fr.ACKEV, {"subID": self.sub_id, cv.ACKEV_POS: _position("pos", pos)})

    def close(self, *, timeout: float | None = None) -> None:
        """SUBCLOSE: stop delivery; a durable subscription keeps its acknowledged position."""
        self._end(fr.SUBCLOSE, timeout)

    def unsubscribe(self, *, timeout: float | None = None) -> None:
        """UNSUBSCRIBE: stop delivery and delete a durable subscription's state on the server."""
        self._end(fr.UNSUBSCRIBE, timeout)

    def close_quietly(self, *, unsubscribe: bool = False, timeout: float = 2.0) -> None:
        """Close if still open, swallowing errors (for ``finally`` blocks: the first error wins)."""
        if not self.open or self._client.connection.closed:
            self.open = False
            return
        try:
            self._end(fr.UNSUBSCRIBE if unsubscribe else fr.SUBCLOSE, timeout)
        except MewbaseError as exc:
            log.debug("closing subscription %s failed: %s", self.sub_id, exc)

    def _end(self, frame_type: str, timeout: float | None) -> None:
        if not self.open:
            return
        self.open = False
        conn = self._client.connection
        try:
            conn.request(
                frame_type,
                {"subID": self.sub_id},
                f"{frame_type} of subscription {self.sub_id} on {self.channel!r}",
                timeout=timeout,
            )
        finally:
            conn.forget_subscription(self.sub_id)


class Transaction:
    """A STARTTX … COMMITTX session: events published through it become visible together."""

    def __init__(self, client: MewbaseClient, sess_id: int) -> None:
        self._client = client
        self.sess_id = sess_id
        self.active = True

    def publish(self, channel: str, event: Document) -> None:
        self._client.publish(channel, event, sess_id=self.sess_id)

    def commit(self) -> None:
        self.active = False
        self._client.commit_tx(self.sess_id)

    def abort(self) -> None:
        self.active = False
        self._client.abort_tx(self.sess_id)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.active:
            return
        if exc_type is None:
            self.commit()
            return
        try:
            self.abort()
        except MewbaseError as abort_error:  # the original error matters more
            log.debug("ABORTTX after an error failed: %s", abort_error)


class MewbaseClient:
    """A connected client. Not thread-safe: one client per thread (see the connection module)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    @classmethod
    def connect(
        cls,
        url: str | MewbaseParams,
        *,
        timeout: float = 10.0,
        max_frame_size: int = cv.DEFAULT_MAX_FRAME_SIZE,
        version: str = cv.PROTOCOL_VERSION,
    ) -> MewbaseClient:
        """Connect and authenticate (CONNECT); refusals raise AuthenticationFailed / UnsupportedVersion."""
        params = parse_url(url)
        return cls(Connection(params, timeout=timeout, max_frame_size=max_frame_size, version=version))

    @property
    def params(self) -> MewbaseParams:
        return self.connection.params

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> MewbaseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MewbaseClient({self.params.redacted()!r})"

    # -- publishing -------------------------------------------------------------------------------

    def publish(
        self, channel: str, event: Document, *, sess_id: int | None = None, timeout: float | None = None
    ) -> None:
        """Publish one event and wait for its RESPONSE: the server's confirm that it is persisted."""
        self.connection.request(
            fr.PUBLISH,
            {"channel": channel, "event": event, "sessID": sess_id},
            f"PUBLISH to channel {channel!r}",
            timeout=timeout,
        )

    def publish_many(
        self,
        channel: str,
        events: Iterable[Document],
        *,
        window: int = 256,
        sess_id: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Publish with up to ``window`` unconfirmed events in flight; returns the confirmed count.

        On the first refusal nothing more is sent, the events in flight are awaited (so the connection
        stays usable) and the refusal is raised.
        """
        if window < 1:
            raise InvalidRequest(f"window must be at least 1, got {window}")
        conn = self.connection
        what = f"PUBLISH to channel {channel!r}"
        in_flight: list[int] = []
        confirmed = 0
        failure: ServerError | None = None

        def settle(rid: int) -> None:
            nonlocal confirmed, failure
            frame = conn.wait_response(rid, what, timeout=timeout)
            if frame.body["ok"]:
                confirmed += 1
            elif failure is None:
                failure = server_error(what, frame.body.get("errCode"), frame.body.get("errMsg"))

        head = 0
        for event in events:
            if failure is not None:
                break
            in_flight.append(
                conn.send_request(fr.PUBLISH, {"channel": channel, "event": event, "sessID": sess_id})
            )
            if len(in_flight) - head >= window:
                settle(in_flight[head])
                head += 1
        for rid in in_flight[head:]:
            settle(rid)
        if failure is not None:
            raise failure
        return confirmed

    def start_tx(self, sess_id: int | None = None, *, timeout: float | None = None) -> int:
        """STARTTX for ``sess_id`` (a fresh one by default); returns the session id."""
        sess = self.connection.next_id("sessID") if sess_id is None else sess_id
        self.connection.request(fr.STARTTX, {"sessID": sess}, f"STARTTX of session {sess}", timeout=timeout)
        return sess

    def commit_tx(self, sess_id: int, *, timeout: float | None = None) -> None:
        """COMMITTX: its RESPONSE confirms every event of the transaction is persisted."""
        self.connection.request(
            fr.COMMITTX, {"sessID": sess_id}, f"COMMITTX of session {sess_id}", timeout=timeout
        )

    def abort_tx(self, sess_id: int, *, timeout: float | None = None) -> None:
        self.connection.request(
            fr.ABORTTX, {"sessID": sess_id}, f"ABORTTX of session {sess_id}", timeout=timeout
        )

    def transaction(self, sess_id: int | None = None) -> Transaction:
        """``with client.transaction() as tx: tx.publish(...)``: COMMITTX on success, ABORTTX on error."""
        return Transaction(self, self.start_tx(sess_id))

    # -- subscribing ------------------------------------------------------------------------------

    def subscribe(
        self,
        channel: str,
        *,
        start_pos: int | None = None,
        start_timestamp: int | None = None,
        durable_id: str | None = None,
        matcher: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Subscription:
        """SUBSCRIBE; without start_pos/start_timestamp only events published from now on arrive.

        A durable subscription whose durableID has an acknowledged position resumes after it.
        """
        if start_pos is not None:
            _position("start_pos", start_pos)
        conn = self.connection
        conn.begin_subscribe()
        sub_id: int | None = None
        try:
            frame = conn.request(
                fr.SUBSCRIBE,
                {
                    "channel": channel,
                    "startPos": start_pos,
                    "startTimestamp": start_timestamp,
                    "durableID": durable_id,
                    "matcher": matcher,
                },
                f"SUBSCRIBE to channel {channel!r}",
                timeout=timeout,
            )
            if frame.type != fr.SUBRESPONSE or frame.body.get("subID") is None:
                raise MewbaseProtocolError(f"SUBSCRIBE to channel {channel!r} answered without a subID")
            sub_id = int(frame.body["subID"])
        finally:
            conn.end_subscribe(sub_id)
        return Subscription(self, channel, sub_id, durable_id)

    # -- querying ---------------------------------------------------------------------------------

    def iter_query(
        self, binder: str, matcher: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> Iterator[dict[str, Any]]:
        """QUERY a binder; yields each QUERYRESULT's document and acknowledges it with QUERYACK.

        Acknowledging every result keeps the server's window of unacknowledged results from filling.
        """
        conn = self.connection
        limit = conn.timeout if timeout is None else timeout
        query_id = conn.next_id("queryID")
        what = f"QUERY of binder {binder!r}"
        conn.open_query(query_id)
        try:
            conn.send(fr.QUERY, {"queryID": query_id, "binder": binder, "matcher": dict(matcher or {})})
            frame = conn.next_query_frame(query_id, time.monotonic() + limit)
            if frame is None:
                raise MewbaseTimeout(f"{what}: no QUERYRESPONSE within {limit:g}s")
            if frame.type != fr.QUERYRESPONSE:
                raise MewbaseProtocolError(f"{what}: {frame.type} before QUERYRESPONSE")
            if not frame.body["ok"]:
                raise server_error(what, frame.body.get("errCode"), frame.body.get("errMsg"))
            if frame.body.get(cv.QUERYRESPONSE_NUM_RESULTS) == 0:
                return
            while True:
                frame = conn.next_query_frame(query_id, time.monotonic() + limit)
                if frame is None:
                    raise MewbaseTimeout(f"{what}: no QUERYRESULT within {limit:g}s")
                if frame.type != fr.QUERYRESULT:
                    raise MewbaseProtocolError(f"{what}: unexpected {frame.type} among the results")
                conn.send(fr.QUERYACK, {"queryID": query_id})
                yield frame.body["result"]
                if frame.body["last"]:
                    return
        finally:
            conn.close_query(query_id)

    def query(
        self, binder: str, matcher: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Every document of ``binder`` that matches ``matcher`` (see :meth:`iter_query`)."""
        return list(self.iter_query(binder, matcher, timeout=timeout))

    # -- bounded reads ----------------------------------------------------------------------------

    def read_range(
        self,
        channel: str,
        start: int,
        end: int,
        *,
        timeout: float | None = None,
        batch_events: int = 1000,
    ) -> Iterator[EventBatch]:
        """Exactly the events with ``start <= pos < end``, in batches of up to ``batch_events``.

        Arguments are checked at call time; ``start == end`` is an empty iterator without network.
        ``timeout`` (default: the connection's) bounds each silence while waiting for events.
        """
        _position("start", start)
        _position("end", end)
        if start > end:
            raise InvalidRequest(f"channel {channel!r}: range start {start} is after its end {end}")
        if batch_events < 1:
            raise InvalidRequest(f"batch_events must be at least 1, got {batch_events}")
        limit = self.connection.timeout if timeout is None else timeout
        if start == end:
            return iter(())
        return self._read(channel, start, end, limit, batch_events)

    def _read(
        self, channel: str, start: int, end: int, limit: float, batch_events: int
    ) -> Iterator[EventBatch]:
        sub = self.subscribe(channel, start_pos=start)
        try:
            batch = EventBatch(channel)
            last: int | None = None
            while True:
                event = sub.poll(limit)
                if event is None:
                    seen = "no event at all" if last is None else f"the last was at position {last}"
                    raise OffsetOutOfRange(
                        f"channel {channel!r}: end {end} lies beyond what the server holds: no event at or "
                        f"after position {start if last is None else last + 1} within {limit:g}s ({seen})"
                    )
                pos = event.pos
                if pos < start:
                    raise MewbaseProtocolError(
                        f"channel {channel!r}: subscription at {start} delivered position {pos} before it"
                    )
                last = pos
                if pos >= end:
                    break
                batch.positions.append(pos)
                batch.timestamps.append(event.timestamp)
                batch.events.append(event.raw)
                if len(batch) >= batch_events:
                    yield batch
                    batch = EventBatch(channel)
                if pos == end - 1:
                    break
            if len(batch):
                yield batch
        finally:
            sub.close_quietly(unsubscribe=True)
