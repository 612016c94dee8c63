"""A mewbase channel seen as an offset-addressed log: the calls a bounded batch makes of its source.

:class:`MewbaseLog` answers the same questions, with the same meaning, as the stream client does for a
RabbitMQ stream partition (``first_offset``, ``committed_tail``, ``query_offset``,
``store_offset_verified``, ``resolve_offset``, ``read_range``), so the batch core can treat a channel
as one more offset-addressed log. Positions play the part of offsets: int64, increasing, with gaps.

Where the draft protocol has no answer the rules are (see also ``conventions``):

* **Tail and first position.** Read from the channel's document in the system binder ``_mb.channels``
  (``firstPos``/``lastPos``/``lastTimestamp``/``count``). A server whose document lacks them is scanned
  instead: subscribe from the last position seen before (0 the first time) and read until
  ``probe_timeout`` seconds pass without an event. The committed tail is the last position + 1 (0 for
  an empty channel); the first position of an empty channel is its tail.
* **Stored position** of a reference = the acknowledged position of the durable subscription
  ``durable_id(channel, reference)``, read with a QUERY of ``_mb.durableSubs`` (``lastAcked``).
  Storing re-creates that durable subscription at the position and acknowledges it with ACKEV, then
  reads it back. The stored value is the last processed event's position (resume = stored + 1).
* **Timestamps** resolve to the first event whose persist timestamp is at or after them (a
  ``startTimestamp`` subscription), or the tail when there is none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from streamledger.offsets import store_verified
from streamledger.protocol.mewbase import conventions as cv
from streamledger.protocol.mewbase.client import MewbaseClient
from streamledger.protocol.mewbase.errors import (
    BinderNotFound,
    ChannelNotFound,
    InvalidRequest,
    MewbaseProtocolError,
    MewbaseTimeout,
    OffsetOutOfRange,
    StoreNotVerified,
)
from streamledger.protocol.mewbase.events import EventBatch
from streamledger.protocol.mewbase.url import MewbaseParams

__all__ = ["ChannelInfo", "MewbaseLog"]


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """What is known of a channel's extent; ``exact`` is False when it came from a scan."""

    channel: str
    first_pos: int | None
    last_pos: int | None
    last_timestamp: int | None
    count: int | None
    exact: bool

    @property
    def empty(self) -> bool:
        return self.last_pos is None

    @property
    def tail(self) -> int:
        """Exclusive end: last position + 1, or 0 for an empty channel."""
        return 0 if self.last_pos is None else self.last_pos + 1


def _int_field(doc: dict[str, Any], name: str, channel: str) -> int | None:
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise MewbaseProtocolError(
            f"channel {channel!r}: {cv.CHANNELS_BINDER} field {name} is not an integer"
        )
    return int(value)


class MewbaseLog:
    """The batch-source calls over one :class:`MewbaseClient` (not thread-safe, like the client)."""

    def __init__(self, client: MewbaseClient, *, probe_timeout: float = 1.0) -> None:
        if not probe_timeout > 0:
            raise InvalidRequest(f"probe_timeout must be positive, got {probe_timeout}")
        self.client = client
        self.probe_timeout = probe_timeout
        self._scanned: dict[str, tuple[int | None, int | None, int | None]] = {}

    @classmethod
    def connect(
        cls, url: str | MewbaseParams, *, timeout: float = 10.0, probe_timeout: float = 1.0, **kwargs: Any
    ) -> MewbaseLog:
        return cls(MewbaseClient.connect(url, timeout=timeout, **kwargs), probe_timeout=probe_timeout)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> MewbaseLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- extent -----------------------------------------------------------------------------------

    def channel_info(self, channel: str) -> ChannelInfo:
        """The channel's first/last position from ``_mb.channels``, or from a scan (see module doc)."""
        try:
            docs = self.client.query(cv.CHANNELS_BINDER, {cv.ID_FIELD: channel})
        except BinderNotFound:
            docs = None
        if docs is not None:
            doc = next((d for d in docs if d.get(cv.ID_FIELD) == channel), None)
            if doc is None:
                raise ChannelNotFound(
                    f"channel lookup of {channel!r}",
                    cv.ERR_NO_SUCH_CHANNEL,
                    None,
                    message=f"channel {channel!r} does not exist on the server (not in {cv.CHANNELS_BINDER})",
                )
            first = _int_field(doc, cv.FIRST_POS_FIELD, channel)
            last = _int_field(doc, cv.LAST_POS_FIELD, channel)
            count = _int_field(doc, cv.COUNT_FIELD, channel)
            if last is not None or count == 0:
                if (first is None) != (last is None) or (
                    first is not None and last is not None and first > last
                ):
                    raise MewbaseProtocolError(
                        f"channel {channel!r}: inconsistent extent firstPos={first} lastPos={last}"
                    )
                stamp = _int_field(doc, cv.LAST_TIMESTAMP_FIELD, channel)
                return ChannelInfo(channel, first, last, stamp, count, exact=True)
        return self._scan(channel)

    def _scan(self, channel: str) -> ChannelInfo:
        """Read the channel from the last position seen before until it stays quiet (no statistics).

        The scan also ends after the connection's timeout in total, so a channel that is written to
        without pause cannot hold it for ever: every position seen is persisted, so the last one + 1
        is a valid (if not the newest) committed tail, and the next scan continues from there.
        """
        first, last, stamp = self._scanned.get(channel, (None, None, None))
        start = 0 if last is None else last
        budget_end = time.monotonic() + self.client.connection.timeout
        with self.client.subscribe(channel, start_pos=start) as sub:
            while (event := sub.poll(self.probe_timeout)) is not None:
                if first is None:
                    first = event.pos
                last, stamp = event.pos, event.timestamp
                if time.monotonic() >= budget_end:
                    break
        self._scanned[channel] = (first, last, stamp)
        return ChannelInfo(channel, first, last, stamp, None, exact=False)

    def partitions(self, name: str) -> list[str]:
        """A channel is not partitioned: ``[name]`` once the channel is known to exist.

        Present so a channel fits wherever a super stream's partition list is asked for.
        """
        self.channel_info(name)
        return [name]

    def first_offset(self, channel: str) -> int:
        """Position of the channel's first event; the tail (0) when the channel is empty."""
        info = self.channel_info(channel)
        return info.tail if info.first_pos is None else info.first_pos

    def committed_tail(self, channel: str) -> int:
        """Exclusive end of what is persisted: last position + 1 (0 for an empty channel)."""
        return self.channel_info(channel).tail

    # -- stored position --------------------------------------------------------------------------

    @staticmethod
    def _durable_id(channel: str, reference: str) -> str:
        try:
            return cv.durable_id(channel, reference)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None

    def query_offset(self, channel: str, reference: str) -> int | None:
        """The durable subscription's acknowledged position (last processed event), None if none."""
        did = self._durable_id(channel, reference)
        try:
            docs = self.client.query(cv.DURABLE_SUBS_BINDER, {cv.ID_FIELD: did})
        except BinderNotFound:
            return None
        for doc in docs:
            if doc.get(cv.ID_FIELD) == did:
                value = doc.get(cv.LAST_ACKED_FIELD)
                if value is None:
                    return None
                if isinstance(value, bool) or not isinstance(value, int):
                    raise MewbaseProtocolError(
                        f"durable subscription {did!r}: {cv.LAST_ACKED_FIELD} is not an integer"
                    )
                return int(value)
        return None

    def store_offset_verified(
        self, channel: str, reference: str, offset: int, *, timeout: float = 5.0
    ) -> None:
        """Make ``offset`` the acknowledged position of (channel, reference) and read it back.

        The durable subscription is re-created at ``offset`` (UNSUBSCRIBE deletes the old state), the
        first event at or after ``offset`` is awaited (an ACKEV needs a delivered event) and
        acknowledged with ``pos = offset``; SUBCLOSE keeps the new state. OffsetOutOfRange (with the
        old state untouched) if no event at or after ``offset`` exists, StoreNotVerified if the
        read-back differs.
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= cv.INT64_MAX:
            raise InvalidRequest(
                f"channel {channel!r}: offset to store must be a position >= 0, got {offset!r}"
            )
        did = self._durable_id(channel, reference)
        current = self.query_offset(channel, reference)
        if current == offset:
            return
        # Check before touching the stored state: an acknowledgement needs an event at or after offset.
        last = self.channel_info(channel).last_pos
        if last is None or offset > last:
            raise OffsetOutOfRange(
                f"channel {channel!r}: cannot store position {offset} for {reference!r}: the last event "
                f"is at {'none' if last is None else last}"
            )
        if current is not None:
            self.client.subscribe(channel, durable_id=did, timeout=timeout).unsubscribe(timeout=timeout)
        sub = self.client.subscribe(channel, durable_id=did, start_pos=offset, timeout=timeout)
        try:
            event = sub.poll(timeout)
            if event is None:
                raise OffsetOutOfRange(
                    f"channel {channel!r}: cannot store position {offset} for {reference!r}: "
                    f"no event at or after it arrived within {timeout:g}s"
                )
            sub.ack(offset)
            sub.close(timeout=timeout)
        finally:
            sub.close_quietly(unsubscribe=True)  # only acts if ack/close did not happen
        store_verified(
            lambda: self.query_offset(channel, reference), offset, timeout=timeout, error=StoreNotVerified,
            describe=lambda stored: (f"channel {channel!r}: stored position {offset} for {reference!r} "
                                     f"but the server reports {stored if stored is not None else 'none'}"),
        )

    # -- positions from specs -----------------------------------------------------------------------

    def resolve_offset(self, channel: str, spec: Any) -> int:
        """A concrete position for ``spec``.

        ``spec`` is an object with ``kind``/``value`` (:class:`streamledger.offsets.OffsetSpec`) or the
        CLI text form: ``first``, ``last``, ``next``/``latest``/``tail``, ``timestamp:<ms>`` or a number.
        """
        kind, value = _spec(spec)
        if kind == "offset":
            assert value is not None
            return value
        if kind == "first":
            return self.first_offset(channel)
        if kind == "next":
            return self.committed_tail(channel)
        info = self.channel_info(channel)
        if kind == "last":
            return info.tail if info.last_pos is None else info.last_pos
        assert value is not None
        return self._resolve_timestamp(info, value)

    def _resolve_timestamp(self, info: ChannelInfo, millis: int) -> int:
        if info.empty:
            return info.tail
        if info.last_timestamp is not None and millis > info.last_timestamp:
            return info.tail
        # With exact statistics an event at or after millis is known to exist: wait as for a response.
        wait = (
            self.client.connection.timeout
            if info.exact and info.last_timestamp is not None
            else self.probe_timeout
        )
        with self.client.subscribe(info.channel, start_timestamp=millis) as sub:
            event = sub.poll(wait)
        if event is None:
            if info.exact and info.last_timestamp is not None:
                raise MewbaseTimeout(
                    f"channel {info.channel!r}: no event for timestamp {millis} within {wait:g}s "
                    f"although the last event is at {info.last_timestamp}"
                )
            return self.committed_tail(info.channel)
        return event.pos

    # -- reading ------------------------------------------------------------------------------------

    def read_range(
        self,
        channel: str,
        start: int,
        end: int,
        *,
        timeout: float | None = None,
        batch_events: int = 1000,
        decode: str = "raw",
    ) -> Iterator[EventBatch]:
        """Exactly the events with ``start <= pos < end`` (see :meth:`MewbaseClient.read_range`).

        ``decode`` exists for the batch core, which calls ``read_range(..., decode="raw")`` on any
        source: events always arrive as BSON bytes ("raw", or "bson"); ``EventBatch.documents()``
        decodes them.
        """
        if decode not in ("raw", "bson"):
            raise InvalidRequest(f"decode={decode!r}: mewbase events are BSON; use 'raw' or 'bson'")
        return self.client.read_range(channel, start, end, timeout=timeout, batch_events=batch_events)


_KINDS = {
    "first": "first",
    "earliest": "first",
    "last": "last",
    "next": "next",
    "latest": "next",
    "tail": "next",
    "end": "next",
}


def _spec(spec: Any) -> tuple[str, int | None]:
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text in _KINDS:
            return _KINDS[text], None
        if text.startswith("timestamp:"):
            return "timestamp", _spec_int(text.split(":", 1)[1], spec)
        return "offset", _spec_int(text, spec)
    kind = getattr(spec, "kind", None)
    value = getattr(spec, "value", None)
    if kind in ("first", "last", "next") and value is None:
        return str(kind), None
    if kind in ("offset", "timestamp") and isinstance(value, int) and not isinstance(value, bool):
        if kind == "offset" and not 0 <= value <= cv.INT64_MAX:
            raise InvalidRequest(f"position {value} is outside 0..2**63-1")
        return str(kind), value
    raise InvalidRequest(
        f"cannot resolve {spec!r}: use first, last, next, a position or timestamp:<ms> (or an OffsetSpec)"
    )


def _spec_int(text: str, original: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidRequest(
            f"invalid position {original!r}: use first, last, next, a position or timestamp:<ms>"
        ) from None
    if not 0 <= value <= cv.INT64_MAX and not original.strip().lower().startswith("timestamp:"):
        raise InvalidRequest(f"position {value} is outside 0..2**63-1")
    return value
