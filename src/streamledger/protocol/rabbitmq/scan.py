"""Many small subscriptions at once over one connection: chunk headers and user-record probes.

A batch over N partitions asks each partition one small question: the header of the chunk at an
offset (its fingerprint check, and the fingerprint it takes at commit), or whether a range holds a
user record (the probe of ranges that hold only tracking chunks). Asked one stream at a time each
costs a Subscribe, a barrier and an Unsubscribe round trip; here the Subscribes of up to ``window``
streams are in flight together (``Connection.pipeline``), their deliveries are told apart by
subscription id, and the Unsubscribes go together too: a few round trips per window instead of a
few per stream. The answers are those of :func:`reader.probe_chunk` and :func:`reader.read_range`.

Runs on the client's own connection, where no subscription outlives a call, so the ids 0..window-1
are free; every subscription is ended (or the connection fails) before the call returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.chunk import ChunkHeader, decode_chunk, parse_chunk_header
from streamledger.protocol.rabbitmq.connection import Connection, raise_for_code
from streamledger.protocol.rabbitmq.errors import ResponseError, StreamTimeout
from streamledger.protocol.rabbitmq.offsets import OffsetSpec
from streamledger.protocol.rabbitmq.reader import chunk_position
from streamledger.protocol.rabbitmq.records import RecordBatch
from streamledger.protocol.rabbitmq.wire import (
    credit_frame,
    metadata_frame,
    subscribe_frame,
    unsubscribe_frame,
)

MAX_WINDOW = 255
"""Subscription ids are one byte."""


@dataclass(slots=True)
class _Sub:
    """One subscription's question and what its deliveries answered so far."""

    stream: str
    offset: int
    end: int | None  # None: the first chunk's header is the answer
    position: int
    header: ChunkHeader | None = None
    records: int = 0
    skipped: bool = False  # the first chunk began after ``offset``: retention removed it
    done: bool = False


def _run(conn: Connection, subs: list[_Sub], *, all_chunks: bool, need: int, barrier: bool,
         timeout: float, grace: float = 0.05) -> None:
    """Subscribe all of ``subs`` (ids 0..len-1) together, feed their deliveries to them until each is
    done (``barrier``: or the broker has sent what it had at subscribe time, plus ``grace``), then
    unsubscribe them together."""
    credit_errors: list[int] = []

    def on_deliver(version: int, buf: bytearray, pos: int, end: int) -> None:
        sid, chunk = chunk_position(version, buf, pos, end)
        if sid >= len(subs) or subs[sid].done:
            return
        s = subs[sid]
        view = memoryview(buf)[:end]
        if s.end is None:  # a header probe: the first chunk delivered is the answer
            s.header, s.done = parse_chunk_header(view, chunk), True
            return
        batch = RecordBatch.empty(s.stream, "raw")
        head = decode_chunk(view, chunk, start=s.position, end=s.end, decode="raw", verify_crc=True,
                            out=batch)
        if s.header is None:
            s.header = head
            if head.first_offset > s.offset:
                s.skipped, s.done = True, True
                return
        s.records += len(batch)
        s.position = max(s.position, head.next_offset)
        if s.records >= need or s.position >= s.end:
            s.done = True
        else:
            conn.send(credit_frame(sid, 1))

    previous, conn.on_deliver = conn.on_deliver, on_deliver
    previous_credit = conn.on_credit_error
    conn.on_credit_error = lambda _sid, code: credit_errors.append(code)
    props = {"chunk_selector": "all"} if all_chunks else None
    subscribed: list[int] = []
    ours = {s.stream for s in subs}
    # A connection that lives long (the batch's client) may hold updates of streams it used before.
    known = len(conn.metadata_updates)
    try:
        asks = []
        for sid, s in enumerate(subs):
            corr = conn.next_corr()
            spec = OffsetSpec.offset(s.offset)
            asks.append((c.SUBSCRIBE, corr, subscribe_frame(corr, sid, s.stream, spec, 1, props)))
        codes = conn.pipeline(asks, lambda _i, r: r.u16(), timeout=timeout)
        subscribed = [sid for sid, code in enumerate(codes) if code == c.OK]
        for sid, code in enumerate(codes):
            raise_for_code(code, c.SUBSCRIBE, subs[sid].stream)
        deadline = time.monotonic() + timeout
        if barrier:
            # The broker writes the chunks it has at subscribe time before it reads our next request.
            corr = conn.next_corr()
            conn.call(c.METADATA, corr, metadata_frame(corr, [subs[0].stream]), timeout=timeout)
            deadline = time.monotonic() + grace
        while not all(s.done for s in subs):
            mine = [(code, name) for code, name in conn.metadata_updates[known:] if name in ours]
            if mine:
                code, name = mine[-1]
                raise ResponseError("a probe of many streams stopped", code, c.code_name(code), name)
            if credit_errors:
                raise ResponseError("Credit", credit_errors[0], c.code_name(credit_errors[0]),
                                    subs[0].stream)
            try:
                key, version, pos, end = conn.read_frame(deadline, "Deliver frames")
            except StreamTimeout:
                if barrier:
                    break
                waiting = [s for s in subs if not s.done]
                raise StreamTimeout(
                    f"probe of stream {waiting[0].stream!r} up to offset {waiting[0].end}: no chunk after "
                    f"offset {waiting[0].position} within {timeout:g}s ({len(waiting)} stream(s) waiting)"
                ) from None
            progress = sum(s.done for s in subs)
            conn.dispatch(key, version, pos, end, waiting_for="Deliver frames")
            if not barrier and sum(s.done for s in subs) > progress:
                deadline = time.monotonic() + timeout
    finally:
        try:
            if subscribed and not conn.closed:
                done = []
                for sid in subscribed:
                    corr = conn.next_corr()
                    done.append((c.UNSUBSCRIBE, corr, unsubscribe_frame(corr, sid)))
                codes = conn.pipeline(done, lambda _i, r: r.u16(), timeout=timeout)
                for sid, code in zip(subscribed, codes, strict=True):
                    if code not in (c.OK, c.SUBSCRIPTION_ID_DOES_NOT_EXIST):
                        raise_for_code(code, c.UNSUBSCRIBE, subs[sid].stream)
        finally:
            conn.on_deliver, conn.on_credit_error = previous, previous_credit


def _windows(subs: list[_Sub], window: int, run: Callable[[list[_Sub]], None]) -> None:
    size = max(1, min(window, MAX_WINDOW))
    for i in range(0, len(subs), size):
        run(subs[i:i + size])


def chunk_headers(conn: Connection, asks: Sequence[tuple[str, int]], *, window: int = MAX_WINDOW,
                  timeout: float = 10.0) -> list[ChunkHeader | None]:
    """The header of the first user chunk a subscription at each ``(stream, offset)`` gets (the
    chunk holding the offset, or the next user chunk), None when there is none yet."""
    subs = [_Sub(stream, offset, None, offset) for stream, offset in asks]
    _windows(subs, window, lambda part: _run(conn, part, all_chunks=False, need=1, barrier=True,
                                                   timeout=timeout))
    return [s.header for s in subs]


def user_records(conn: Connection, ranges: Sequence[tuple[str, int, int]], *, need: int = 1,
                 window: int = MAX_WINDOW, timeout: float = 10.0) -> list[int | None]:
    """User records in each ``(stream, start, end)``, counting no further than ``need``; None when
    the first chunk delivered begins after ``start`` (retention removed it). Every ``end`` must lie
    at or below the stream's committed tail (the chunks are waited for)."""
    subs = [_Sub(stream, start, end, start) for stream, start, end in ranges if start < end]
    _windows(subs, window, lambda part: _run(conn, part, all_chunks=True, need=need, barrier=False,
                                                   timeout=timeout))
    found = iter(subs)
    out: list[int | None] = []
    for _stream, start, end in ranges:
        if start >= end:
            out.append(0)
            continue
        s = next(found)
        out.append(None if s.skipped else min(s.records, need))
    return out
