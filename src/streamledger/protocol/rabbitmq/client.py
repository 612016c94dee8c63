"""``StreamClient``: the synchronous face of the RabbitMQ Streams client.

One object per broker connection, usable from Spark executors and Airflow workers (no event
loop). Stream management, offsets, super streams and publishing share that connection; each
``read_range`` opens a dedicated one so it can drain the socket without interleaving.

Commands a broker lacks are never sent (a 3.10 broker answers an unknown key by closing the
connection): :class:`UnsupportedByBroker` names the command and the broker version instead.
Where a command is missing but the answer can be derived (first offset, committed tail,
offset resolution), the client probes with a one-chunk subscription, as documented per method.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

from streamledger import offsets
from streamledger.offsets import READ_BACK_INTERVAL, store_verified
from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq import scan
from streamledger.protocol.rabbitmq.chunk import ChunkHeader
from streamledger.protocol.rabbitmq.connection import Connection, raise_for_code, with_backoff
from streamledger.protocol.rabbitmq.errors import (
    InvalidRequest,
    OffsetOutOfRange,
    PreconditionFailed,
    StoreNotVerified,
    StreamNotAvailable,
)
from streamledger.protocol.rabbitmq.offsets import OffsetSpec
from streamledger.protocol.rabbitmq.publisher import (
    OutboundMessage,
    PublishResult,
    publish,
    supports_filtering,
)
from streamledger.protocol.rabbitmq.reader import ReadStats, probe_chunk, read_range
from streamledger.protocol.rabbitmq.records import MAX_BUFFER_BYTES, BufferBatch, RecordBatch
from streamledger.protocol.rabbitmq.stats import StreamMetadata, StreamStats
from streamledger.protocol.rabbitmq.url import ConnectionParams, to_params
from streamledger.protocol.rabbitmq.wire import (
    Reader,
    Writer,
    create_frame,
    metadata_frame,
    query_offset_frame,
    store_offset_frame,
    stream_stats_frame,
)

T = TypeVar("T")
log = logging.getLogger("streamledger.rabbitmq")
_MAX_AGE = re.compile(r"^[1-9][0-9]*[YMDhms]$")
_MAX_SEGMENT = 3_000_000_000


def _stream_arguments(
    max_length_bytes: int | None = None,
    max_age: str | int | timedelta | None = None,
    max_segment_size_bytes: int | None = None,
) -> dict[str, str]:
    """Validate creation arguments client-side: brokers crash or misstore on bad values (spec 7.13)."""
    args: dict[str, str] = {}
    if max_length_bytes is not None:
        if not isinstance(max_length_bytes, int) or max_length_bytes <= 0:
            raise InvalidRequest(f"max_length_bytes must be a positive integer, not {max_length_bytes!r}")
        args["max-length-bytes"] = str(max_length_bytes)
    if max_age is not None:
        if isinstance(max_age, timedelta):
            seconds = int(max_age.total_seconds())
            if seconds <= 0:
                raise InvalidRequest("max_age must be at least one second")
            args["max-age"] = f"{seconds}s"
        elif isinstance(max_age, int):
            if max_age <= 0:
                raise InvalidRequest("max_age must be a positive number of seconds")
            args["max-age"] = f"{max_age}s"
        elif isinstance(max_age, str) and _MAX_AGE.match(max_age):
            args["max-age"] = max_age
        else:
            raise InvalidRequest(
                f"max_age {max_age!r} is not valid: use seconds, a timedelta or <n><unit> "
                "with unit Y, M, D, h, m or s"
            )
    if max_segment_size_bytes is not None:
        if not isinstance(max_segment_size_bytes, int) or not 0 < max_segment_size_bytes <= _MAX_SEGMENT:
            raise InvalidRequest(f"max_segment_size_bytes must be in 1..{_MAX_SEGMENT}")
        args["stream-max-segment-size-bytes"] = str(max_segment_size_bytes)
    return args


def _read_stats(name: str, r: Reader) -> StreamStats:
    """A StreamStats answer's statistics (after its response code); negative values mean unknown."""
    raw: dict[str, int] = {}
    for _ in range(r.count(10)):
        key = r.string()
        raw[key] = r.i64()

    def get(key: str) -> int | None:
        value = raw.get(key, -1)
        return None if value < 0 else value

    return StreamStats(name, get("first_chunk_id"), get("committed_chunk_id"), get("last_chunk_id"),
                       get("committed_offset"), raw)


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{kind} name must be a non-empty string")
    if len(name.encode("utf-8")) > 255:
        raise InvalidRequest(f"{kind} name {name[:40]!r}… is longer than 255 bytes")


def _check_reference(reference: str) -> None:
    if not isinstance(reference, str) or not 0 < len(reference.encode("utf-8")) <= 255:
        raise InvalidRequest("offset reference must be 1..255 UTF-8 bytes")


def _check_offset(offset: int) -> None:
    if not isinstance(offset, int) or not 0 <= offset < 2**64:
        raise InvalidRequest(f"offset {offset!r} must be an integer in 0..2**64-1")


class StreamClient:
    """A connection to one broker with the stream, offset, super-stream and publish commands.

    Not thread-safe: use one client per thread (each ``read_range`` already has its own connection).
    """

    def __init__(self, conn: Connection, *, timeout: float = 10.0) -> None:
        self._conn = conn
        self.params: ConnectionParams = conn.params
        self.timeout = timeout
        self._sub_id = 0
        self._publisher_id = 0
        self.member_pool: dict[tuple[str, int], Connection] | None = None
        """Idle member connections range reads hand back (only inside :meth:`pooled_reads`)."""
        self.last_side: list[Connection] = []
        """The side connections of the last round :meth:`_spread` spread (closed with that round):
        where it asked what."""
        self._side_refused = False
        """A side connection could not be opened (a connection limit): this client spreads no more."""

    spread_at = 256
    """Streams of one many-stream round from which :meth:`_spread` spreads it over side connections."""
    side_connections = 3
    """Side connections :meth:`_spread` opens at most (besides this one); 0 spreads nothing."""

    @classmethod
    def connect(cls, url: str | ConnectionParams, *, timeout: float = 10.0) -> StreamClient:
        """Open and authenticate (connect failures are retried with backoff; auth failures are not)."""
        return cls(Connection.open(to_params(url), timeout=timeout), timeout=timeout)

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StreamClient({self.params.redacted()!r}, server_version={self.server_version!r})"

    def close(self) -> None:
        self._close_pool()
        self._conn.close()

    @contextlib.contextmanager
    def pooled_reads(self) -> Iterator[StreamClient]:
        """Inside the block, a finished ``read_range`` keeps its member connection for the next
        one (on this thread: the client is not thread-safe anyway): many small reads, such as a
        batch probing each partition or a Spark task reading several packed slices, cost a
        subscription each instead of a connection each. Closed at the end of the block."""
        if self.member_pool is not None:  # nested: the outer block owns the pool
            yield self
            return
        self.member_pool = {}
        try:
            yield self
        finally:
            self._close_pool()

    def _close_pool(self) -> None:
        pool, self.member_pool = self.member_pool, None
        for conn in (pool or {}).values():
            conn.close()

    @property
    def connection(self) -> Connection:
        return self._conn

    @property
    def server_version(self) -> str | None:
        return self._conn.server_version

    @property
    def cluster_name(self) -> str | None:
        """The cluster name the broker reports (PeerProperties ``cluster_name``): the same on every
        node, DNS alias or load balancer of one cluster, so it identifies the broker's history."""
        return self._conn.server_properties.get("cluster_name") or None

    def supports(self, key: int) -> bool:
        return self._conn.supports(key)

    # -- plumbing -----------------------------------------------------------------------------

    def _retrying(self, fn: Callable[[], T]) -> T:
        """Retry a read-only command while the stream has no leader (0x06): transient by nature."""
        return with_backoff(fn, transient=lambda exc: isinstance(exc, StreamNotAvailable), attempts=4)

    def _next_sub_id(self) -> int:
        self._sub_id = (self._sub_id + 1) % 256
        return self._sub_id

    def _next_publisher_id(self) -> int:
        self._publisher_id = (self._publisher_id + 1) % 256
        return self._publisher_id

    def _simple(self, key: int, build: Callable[[Writer], Writer], stream: str | None) -> int:
        conn = self._conn
        corr = conn.next_corr()
        code, _ = conn.request(key, corr, build(Writer(key).u32(corr)).frame(), stream=stream)
        return code

    # -- streams ------------------------------------------------------------------------------

    def create_stream(
        self,
        name: str,
        *,
        max_length_bytes: int | None = None,
        max_age: str | int | timedelta | None = None,
        max_segment_size_bytes: int | None = None,
        exists_ok: bool = False,
    ) -> None:
        """Create a stream; with ``exists_ok`` an existing stream with the same arguments is fine."""
        _check_name("stream", name)
        args = _stream_arguments(max_length_bytes, max_age, max_segment_size_bytes)
        corr = self._conn.next_corr()
        code, _ = self._conn.request(c.CREATE, corr, create_frame(corr, name, args), stream=name)
        if code == c.STREAM_ALREADY_EXISTS and exists_ok:
            return
        if code == c.PRECONDITION_FAILED:
            raise PreconditionFailed(
                "Create (a stream/queue of that name exists with other arguments, or the name is invalid)",
                code, c.code_name(code), name,
            )
        raise_for_code(code, c.CREATE, name)

    def delete_stream(self, name: str, *, missing_ok: bool = False) -> None:
        _check_name("stream", name)
        code = self._simple(c.DELETE, lambda w: w.string(name), name)
        if code == c.STREAM_DOES_NOT_EXIST and missing_ok:
            return
        raise_for_code(code, c.DELETE, name)

    def metadata(self, names: list[str]) -> dict[str, StreamMetadata]:
        """Leader/replicas per stream; entries come back in any order, so they are keyed by name."""

        def call() -> dict[str, StreamMetadata]:
            conn = self._conn
            corr = conn.next_corr()
            # Metadata's response has no response code (spec 7.15), only per-stream codes.
            r = conn.call(c.METADATA, corr, metadata_frame(corr, names))
            brokers: dict[int, tuple[str, int]] = {}
            for _ in range(r.count(8)):
                ref = r.u16()
                host = r.string()
                brokers[ref] = (host, r.u32())
            result: dict[str, StreamMetadata] = {}
            for _ in range(r.count(10)):
                stream = r.string()
                code = r.u16()
                leader = r.u16()
                replicas = [r.u16() for _ in range(r.count(2))]
                result[stream] = StreamMetadata(
                    stream, code, c.code_name(code), brokers.get(leader),
                    [brokers[x] for x in replicas if x in brokers],
                )
            return result

        return self._retrying(call)

    def stream_exists(self, name: str) -> bool:
        _check_name("stream", name)
        meta = self.metadata([name]).get(name)
        if meta is None or meta.code == c.STREAM_DOES_NOT_EXIST:
            return False
        if meta.code != c.OK:
            raise_for_code(meta.code, c.METADATA, name)
        return True

    def stream_stats(self, name: str) -> StreamStats:
        """StreamStats (3.12+); :class:`UnsupportedByBroker` on older brokers."""
        _check_name("stream", name)
        self._conn.require(c.STREAM_STATS, "StreamStats appeared in RabbitMQ 3.12")

        def call() -> StreamStats:
            conn = self._conn
            corr = conn.next_corr()
            frame = stream_stats_frame(corr, name)
            code, r = conn.request(c.STREAM_STATS, corr, frame, stream=name)
            raise_for_code(code, c.STREAM_STATS, name)
            return _read_stats(name, r)

        return self._retrying(call)

    # -- many streams at once (pipelined over this connection) ---------------------------------

    def _many(self, key: int, names: Sequence[str], build: Callable[[int, str], bytes],
              parse: Callable[[str, int, Reader], T]) -> list[T | Exception]:
        """One request per name, all in flight together (:meth:`Connection.pipeline`); an answer
        that is an error comes back as its exception (the caller decides what to retry)."""
        conn = self._conn
        requests = []
        for name in names:
            corr = conn.next_corr()
            requests.append((key, corr, build(corr, name)))

        def answer(i: int, r: Reader) -> T | Exception:
            code = r.u16()
            try:
                return parse(names[i], code, r)
            except Exception as exc:  # a per-stream error: kept, so the other answers are read
                return exc

        return conn.pipeline(requests, answer)

    def stream_stats_many(self, names: Sequence[str]) -> dict[str, StreamStats]:
        """:meth:`stream_stats` of every stream, asked all at once; a stream whose answer is an
        error is asked again alone (:meth:`stream_stats` retries a stream without a leader)."""
        for name in names:
            _check_name("stream", name)
        self._conn.require(c.STREAM_STATS, "StreamStats appeared in RabbitMQ 3.12")

        def parse(name: str, code: int, r: Reader) -> StreamStats:
            raise_for_code(code, c.STREAM_STATS, name)
            return _read_stats(name, r)

        got = self._many(c.STREAM_STATS, names, stream_stats_frame, parse)
        return {n: (self.stream_stats(n) if isinstance(g, Exception) else g)
                for n, g in zip(names, got, strict=True)}

    def committed_tails(self, names: Sequence[str]) -> dict[str, int]:
        """:meth:`committed_tail` of every stream (one pipelined StreamStats round where available)."""
        return self.tails_with_stats(names)[0]

    def tails_with_stats(self, names: Sequence[str]) -> tuple[dict[str, int], dict[str, StreamStats]]:
        """:meth:`committed_tails`, and the StreamStats they came from (none on a broker without
        them): what :meth:`user_records_many` of the same streams takes instead of asking again."""
        if not self.supports(c.STREAM_STATS):
            return {n: self.committed_tail(n) for n in names}, {}
        stats = self.stream_stats_many(names)
        return {n: self.committed_tail(n, stats=stats[n]) for n in names}, stats

    def retained_spans(self, names: Sequence[str]) -> dict[str, tuple[int, int]]:
        """``(first_offset, committed_tail)`` of every stream, both from one pipelined StreamStats
        round where available (a planner needs both: asked apart, they were two rounds)."""
        tails, stats = self.tails_with_stats(names)
        return {n: (self.first_offset(n, stats=stats.get(n)), tails[n]) for n in names}

    def resolve_offsets(self, names: Sequence[str], specs: Sequence[offsets.OffsetSpec]
                        ) -> dict[str, list[int]]:
        """:meth:`resolve_offset` of every spec for every stream, each stream's in the order given:
        one pipelined ResolveOffsetSpec round on 4.3+ for the specs it answers (timestamp, last),
        the others (and every spec before 4.3) one at a time as :meth:`resolve_offset` does. An
        error answer is asked again alone, so it raises as :meth:`resolve_offset` would."""
        wanted = [OffsetSpec.of(s) for s in specs]
        sent = [i for i, s in enumerate(wanted) if s.kind in ("timestamp", "last")]
        got = (self._resolve_each(names, [wanted[i] for i in sent])
               if sent and names and self.supports(c.RESOLVE_OFFSET_SPEC) else {})
        out: dict[str, list[int]] = {}
        for name in names:
            answers = dict(zip(sent, got[name], strict=True)) if name in got else {}
            out[name] = [int(a) if (a := answers.get(i)) is not None else self.resolve_offset(name, spec)
                         for i, spec in enumerate(wanted)]
        return out

    def first_offsets(self, names: Sequence[str]) -> dict[str, int]:
        """:meth:`first_offset` of every stream (one pipelined StreamStats round where available)."""
        if not self.supports(c.STREAM_STATS):
            return {n: self.first_offset(n) for n in names}
        stats = self.stream_stats_many(names)
        return {n: self.first_offset(n, stats=s) for n, s in stats.items()}

    def query_offsets(self, streams: Sequence[str], reference: str) -> dict[str, int | None]:
        """:meth:`query_offset` of every stream for ``reference``, asked all at once."""
        for name in streams:
            _check_name("stream", name)
        _check_reference(reference)

        def parse(name: str, code: int, r: Reader) -> int | None:
            if code == c.NO_OFFSET:
                return None
            raise_for_code(code, c.QUERY_OFFSET, name)
            return r.u64()

        got = self._many(c.QUERY_OFFSET, streams, lambda corr, s: query_offset_frame(corr, reference, s),
                         parse)
        return {s: (self.query_offset(s, reference) if isinstance(g, Exception) else g)
                for s, g in zip(streams, got, strict=True)}

    def store_offsets_verified(self, offsets: Mapping[str, int], reference: str, *,
                               timeout: float = 5.0) -> None:
        """:meth:`store_offset_verified` for several streams: every StoreOffset is written at once,
        then all are read back together (every :data:`~streamledger.offsets.READ_BACK_INTERVAL` for
        the ones not there yet) until each reads its offset, or :class:`StoreNotVerified` names the
        first that does not (the verified-store contract of :func:`streamledger.offsets.store_verified`)."""
        _check_reference(reference)
        for stream, offset in offsets.items():
            _check_name("stream", stream)
            _check_offset(offset)
        if not offsets:
            return
        self._conn.send(b"".join(store_offset_frame(reference, s, o) for s, o in offsets.items()))
        deadline = time.monotonic() + timeout
        pending = list(offsets)
        while True:
            seen = self.query_offsets(pending, reference)
            pending = [s for s in pending if seen[s] != offsets[s]]
            if not pending:
                return
            if time.monotonic() >= deadline:
                s = pending[0]
                raise StoreNotVerified(
                    f"stream {s!r}: stored offset for reference {reference!r} still reads {seen[s]} "
                    f"instead of {offsets[s]} after {timeout:g}s"
                    + (f" ({len(pending) - 1} more stream(s) likewise)" if len(pending) > 1 else "")
                )
            time.sleep(READ_BACK_INTERVAL)

    def bytes_per_offset(self, name: str) -> float | None:
        """Stored bytes per offset of the stream's newest user chunk (None when it has none): what a
        reader estimates a range's size by without reading it (``maxBytesPerTrigger``)."""
        _check_name("stream", name)
        info = self._probe(name, OffsetSpec.last(), all_chunks=False)
        if info is None or info.num_records <= 0:
            return None
        return info.data_length / info.num_records

    def _probe(self, name: str, spec: OffsetSpec, *, all_chunks: bool) -> ChunkHeader | None:
        return probe_chunk(self._conn, self._next_sub_id(), name, spec, all_chunks=all_chunks)

    def chunk_at(self, name: str, offset: int) -> ChunkHeader | None:
        """The header of the user chunk holding ``offset`` (one chunk delivered, its data unread);
        None when no retained user chunk holds it (below retention, past the tail, a tracking offset).
        Its first offset, timestamp and CRC tell one incarnation of a stream from another."""
        _check_name("stream", name)
        _check_offset(offset)
        head = self._probe(name, OffsetSpec.offset(offset), all_chunks=False)
        return head if head is not None and head.first_offset <= offset < head.next_offset else None

    def chunks_at(self, asks: Sequence[tuple[str, int]], *,
                  window: int = scan.MAX_WINDOW) -> dict[tuple[str, int], ChunkHeader | None]:
        """:meth:`chunk_at` of many ``(stream, offset)`` at once: the subscriptions of up to
        ``window`` of them in flight together on this connection (:mod:`.scan`)."""
        heads = self.chunks_from(asks, window=window)
        return {(n, o): (h if h is not None and h.first_offset <= o < h.next_offset else None)
                for (n, o), h in heads.items()}

    def chunks_from(self, asks: Sequence[tuple[str, int]], *, window: int = scan.MAX_WINDOW,
                    all_chunks: bool = False) -> dict[tuple[str, int], ChunkHeader | None]:
        """The header of the first user chunk at or after each ``(stream, offset)`` (the chunk holding
        the offset, or the next user chunk), None when the stream has none there yet: one pipelined
        round like :meth:`chunks_at`, without asking the chunk to hold the offset (a tracking chunk may).
        ``all_chunks``: the first chunk of any type (whether the offset is still in the log at all)."""
        wanted = list(dict.fromkeys(asks))
        for name, offset in wanted:
            _check_name("stream", name)
            _check_offset(offset)
        if not wanted:
            return {}
        heads = scan.chunk_headers(self._conn, wanted, window=window, timeout=self.timeout,
                                   all_chunks=all_chunks)
        return dict(zip(wanted, heads, strict=True))

    def user_records_many(self, ranges: Mapping[str, tuple[int, int]], *, need: int = 1,
                          window: int = scan.MAX_WINDOW,
                          stats: Mapping[str, StreamStats] | None = None,
                          by_last_chunk: bool = False) -> dict[str, int | None]:
        """User records in each stream's ``[start, end)``, counting no further than ``need``, for
        many streams at once (:mod:`.scan`); None for a range whose start retention removed. An
        ``end`` past the committed tail raises :class:`OffsetOutOfRange`, as :meth:`read_range` does.
        ``stats``: the StreamStats of these streams the caller asked for already (the ranges' ends
        are tails they gave: :meth:`tails_with_stats`), not asked again. ``by_last_chunk`` (4.3+,
        ``need`` 1): a range the stream's last user chunk begins in is answered 1 from one pipelined
        ResolveOffsetSpec round, without a subscription (issue 44: a batch's probe of 1,000 partitions)."""
        for name, (start, end) in ranges.items():
            _check_name("stream", name)
            _check_offset(start)
            _check_offset(end)
            if start > end:
                raise InvalidRequest(f"stream {name!r}: start {start} is after end {end}")
        live = [n for n, (start, end) in ranges.items() if start < end]
        if not live:
            return dict.fromkeys(ranges, 0)
        known: dict[str, StreamStats] = {}
        if self.supports(c.STREAM_STATS):  # tails and first offsets from one StreamStats round
            known = {n: stats[n] for n in live if stats and n in stats}
            known.update(self.stream_stats_many([n for n in live if n not in known]))
            tails = {n: self.committed_tail(n, stats=known[n]) for n in live}
            firsts = {n: self.first_offset(n, stats=known[n]) for n in live}
        else:
            tails, firsts = self.committed_tails(live), self.first_offsets(live)
        for name in live:
            if ranges[name][1] > tails[name]:
                raise OffsetOutOfRange(name, ranges[name][1], tails[name])
        lost = {n for n in live if ranges[n][0] < firsts[n]}
        kept = [n for n in live if n not in lost]
        # The last user chunk of each stream, one pipelined round (4.3+): one that begins inside
        # [start, end) answers need=1 without a subscription (a subscription makes the broker open a
        # segment reader: 1,000 of them were the first batch's probe, 8x the resolutions' time).
        # Chunks are the same on every member and end is a committed tail the caller saw, so a chunk
        # begun there is committed, whichever member answered.
        last = (self._resolve_each(kept, [OffsetSpec.last()])
                if kept and by_last_chunk and need == 1 and self.supports(c.RESOLVE_OFFSET_SPEC) else {})
        found = {n for n in kept if last.get(n, [None])[0] is not None
                 and ranges[n][0] <= int(last[n][0] or 0) < ranges[n][1]}
        quiet = self._no_user_chunk_from({n: ranges[n] for n in kept if n not in found}, known, last)
        todo = [(n, *ranges[n]) for n in kept if n not in quiet and n not in found]
        counts = dict(zip([t[0] for t in todo], scan.user_records(self._conn, todo, need=need, window=window,
                                                                  timeout=self.timeout), strict=True))
        counts.update(dict.fromkeys(found, 1))
        return {n: (None if n in lost else counts.get(n, 0)) for n in ranges}

    def _no_user_chunk_from(self, ranges: Mapping[str, tuple[int, int]],
                            stats: Mapping[str, StreamStats],
                            last: Mapping[str, list[int | None]] | None = None) -> set[str]:
        """The streams whose ``[start, end)`` is known to hold no user record without a
        subscription (4.3+, ResolveOffsetSpec): a chunk begins at ``start`` (its id is one the
        StreamStats ``stats`` name: no chunk straddles it), and the last user chunk of a member that
        holds every chunk below ``end``, resolved after those stats, begins before ``start``. What
        a StoreOffset leaves on an idle stream: a tracking chunk at the tail, right after the
        records a batch read. A stream with replicas (the Metadata asked after the resolution
        names some) may have been answered by one that lags: its member's next offset, then its
        last user chunk, are asked again together, so the next offset tells it holds the range."""
        if not stats or not self.supports(c.RESOLVE_OFFSET_SPEC):
            return set()
        named = [n for n, (start, _end) in ranges.items() if n in stats and start in (
            stats[n].first_chunk_id, stats[n].committed_chunk_id, stats[n].last_chunk_id)]
        if not named:
            return set()
        answers = {n: list(last[n]) for n in named if last and n in last}  # asked already
        answers.update(self._resolve_each([n for n in named if n not in answers], [OffsetSpec.last()]))
        md = self.metadata(named)
        alone = {n for n in named if n in md and md[n].exists and not md[n].replicas}
        shared = [n for n in named if n not in alone]
        if shared:
            answers.update(self._resolve_each(shared, [OffsetSpec.next(), OffsetSpec.last()]))
        quiet = set()
        for name in named:
            start, end = ranges[name]
            got = answers[name]
            held = name in alone or (got[0] is not None and got[0] >= end)
            if held and got[-1] is not None and got[-1] < start:
                quiet.add(name)
        return quiet

    def _resolve_each(self, names: Sequence[str], specs: Sequence[OffsetSpec]) -> dict[str, list[int | None]]:
        """ResolveOffsetSpec of every spec for every stream, pipelined, each stream's in the order
        given (the broker answers one connection's requests in order); None for an error answer.
        Many streams are spread over side connections (:meth:`_spread`): the broker resolves one
        connection's requests one after the other, at a cost of its own per stream."""
        for name in names:
            _check_name("stream", name)
        wanted = list(specs)
        return self._spread(list(names), lambda conn, part: _resolve_on(conn, part, wanted))

    def _spread(self, names: list[str],
                work: Callable[[Connection, list[str]], dict[str, T]]) -> dict[str, T]:
        """``work(connection, part)`` of ``names``: on this connection alone below :attr:`spread_at`
        streams, else split into parts done at once, one on this connection and each other on a side
        connection to the same address (:attr:`side_connections` at most), one thread each. Each
        stream's whole work is on one connection, in the order ``work`` sends it, so what one
        connection's answers prove of a stream holds as before. Only for read-only work: a side
        connection that fails is closed and its part done again on this connection.

        Side connections live for one round: a client held open for a whole batch must not hold
        four of its user's connections meanwhile (under a per-user or per-vhost limit, the batch's
        own range reads and Spark tasks would be refused). One that cannot be opened (that limit,
        most likely) ends the spreading for this client: it is not asked again every round.

        Why: the broker answers one connection's requests one after the other in one process, and
        a ResolveOffsetSpec costs it about 0.3 ms of CPU per stream (it opens the stream's log):
        1,000 of them were 0.3-0.6 s on one connection and 0.16-0.23 s over four, on 2 cores
        (issue 44, docs/history/performance.md)."""
        k = min(1 + self.side_connections, len(names) * 2 // max(self.spread_at, 2))
        if len(names) < self.spread_at or k < 2 or self._side_refused:
            return work(self._conn, names)
        parts = [names[i::k] for i in range(k)]
        side: list[Connection | None] = [None] * (k - 1)  # those that answered their part
        got: list[dict[str, T] | None] = [None] * k

        def run(i: int) -> None:
            try:
                conn = Connection.open(self.params, timeout=self.timeout, attempts=1)
            except Exception as exc:  # its part is done again on the main connection
                self._side_refused = True
                log.debug("side connection %d to %s: %s; asking on the main connection, not spreading "
                          "again", i, self.params.redacted(), exc)
                return
            try:
                got[i] = work(conn, parts[i])
                side[i - 1] = conn
            except Exception as exc:  # the part is done again on the main connection
                log.debug("side connection %d to %s: %s; asking on the main connection", i,
                          self.params.redacted(), exc)
            finally:
                conn.close()

        threads = [threading.Thread(target=run, args=(i,), daemon=True, name=f"streamledger-side-{i}")
                   for i in range(1, k)]
        for t in threads:
            t.start()
        try:
            got[0] = work(self._conn, parts[0])
        finally:
            for t in threads:
                t.join()
            self.last_side = [conn for conn in side if conn is not None]
        out: dict[str, T] = {}
        for part, answers in zip(parts, got, strict=True):
            out.update(answers if answers is not None else work(self._conn, part))
        return {n: out[n] for n in names}

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int]], *, decode: Literal["amqp", "raw"] = "amqp",
        verify_crc: bool = True, credit: int = 2, max_batch_records: int = 65_536,
        prefer: Literal["replica", "leader", "url"] = "replica",
        layout: Literal["lists", "buffers"] = "lists", maps: bool = True, window: int = scan.MAX_WINDOW,
        stats: ReadStats | None = None, max_batch_bytes: int = MAX_BUFFER_BYTES,
    ) -> Iterator[tuple[int, RecordBatch | BufferBatch]]:
        """:meth:`read_range` of many small ``(stream, start, end)`` at once: ``(index, batch)``
        pairs, range by range in the order given, each range's batches those :meth:`read_range`
        yields. Up to ``window`` subscriptions are in flight together on one connection per serving
        member (:mod:`.scan`): a few round trips per window instead of about four per range. The
        records of a window are held until it is complete, so this is for small ranges (a packed
        task's); bounds are checked now, as :meth:`read_range` checks them. No ``filter_values``
        (a filtered read stays with :meth:`read_range`)."""
        return scan.read_ranges(self, ranges, decode=decode, verify_crc=verify_crc, credit=credit,
                                max_batch_records=max_batch_records, prefer=prefer, layout=layout, maps=maps,
                                window=window, stats=stats, max_batch_bytes=max_batch_bytes)

    def first_offset(self, name: str, *, stats: StreamStats | None = None) -> int:
        """Lowest offset still retained (0 for an empty stream).

        From StreamStats where available (``stats`` when the caller has them); otherwise the first
        chunk of any type delivered by a ``first`` subscription with ``chunk_selector=all``.
        """
        _check_name("stream", name)
        if stats is None and self.supports(c.STREAM_STATS):
            stats = self.stream_stats(name)
        if stats is not None:
            if stats.first_chunk_id is not None:
                return stats.first_chunk_id
            return self.committed_tail(name, stats=stats)
        info = self._probe(name, OffsetSpec.first(), all_chunks=True)
        return info.first_offset if info is not None else 0

    def committed_tail(self, name: str, *, stats: StreamStats | None = None) -> int:
        """Exclusive end a reader may plan up to (docs/interfaces.md, "Offsets").

        4.3+: ``committed_offset + 1``. 3.12-4.2: the chunk at ``committed_chunk_id`` is probed for
        its record count. Without StreamStats (3.10/3.11): the end of the last user chunk, which is
        enough for reading (only non-user offsets can follow it).
        """
        _check_name("stream", name)
        if stats is None and self.supports(c.STREAM_STATS):
            stats = self.stream_stats(name)
        if stats is not None:
            if stats.committed_offset is not None:
                return stats.committed_offset + 1
            if stats.committed_chunk_id is None:
                return stats.first_chunk_id or 0
            info = self._probe(name, OffsetSpec.offset(stats.committed_chunk_id), all_chunks=True)
            if info is None:
                return stats.committed_chunk_id
            return max(info.next_offset, stats.committed_chunk_id)
        info = self._probe(name, OffsetSpec.last(), all_chunks=False)
        if info is not None:
            return info.next_offset
        first = self._probe(name, OffsetSpec.first(), all_chunks=True)
        return first.first_offset if first is not None else 0

    def resolve_offset(self, name: str, spec: offsets.OffsetSpec) -> int:
        """Turn a spec into a concrete offset usable as a range bound.

        first -> first retained offset; next -> committed tail; offset(n) -> n clamped to
        [first, tail]; last -> first offset of the last user chunk (tail if none);
        timestamp(ms) -> first offset of the first chunk with timestamp >= ms (tail if none).
        Uses ResolveOffsetSpec (0x1f) on 4.3+, a one-chunk subscription probe otherwise. Any
        log-neutral :class:`streamledger.offsets.OffsetSpec` is accepted.
        """
        _check_name("stream", name)
        spec = OffsetSpec.of(spec)
        if spec.kind == "first":
            return self.first_offset(name)
        if spec.kind == "next":
            return self.committed_tail(name)
        if spec.kind == "offset":
            first = self.first_offset(name)
            tail = self.committed_tail(name)
            return min(max(spec.value or 0, first), tail)
        if self.supports(c.RESOLVE_OFFSET_SPEC):
            conn = self._conn
            corr = conn.next_corr()
            code, r = conn.request(c.RESOLVE_OFFSET_SPEC, corr, _resolve_frame(corr, name, spec), stream=name)
            raise_for_code(code, c.RESOLVE_OFFSET_SPEC, name)
            return _resolved_offset(r)
        info = self._probe(name, spec, all_chunks=False)
        if info is not None:
            return info.first_offset
        return self.committed_tail(name)

    # -- super streams ------------------------------------------------------------------------

    def create_super_stream(
        self,
        name: str,
        *,
        partitions: int | None = None,
        binding_keys: list[str] | None = None,
        arguments: dict[str, Any] | None = None,
        exists_ok: bool = False,
    ) -> None:
        """Create a super stream: ``partitions=N`` -> ``name-0..name-(N-1)`` with keys ``0..N-1``;
        ``binding_keys=[a, b]`` -> ``name-a``, ``name-b`` (the rabbitmq-streams CLI convention).
        ``arguments`` takes the :meth:`create_stream` keywords, applied to every partition."""
        _check_name("super stream", name)
        if (partitions is None) == (binding_keys is None):
            raise InvalidRequest("give exactly one of partitions (a count) or binding_keys")
        if partitions is not None:
            if not isinstance(partitions, int) or partitions < 1:
                raise InvalidRequest(f"partitions must be a positive integer, not {partitions!r}")
            keys = [str(i) for i in range(partitions)]
        else:
            keys = [str(k) for k in binding_keys or []]
            if not keys or any(not k for k in keys) or len(set(keys)) != len(keys):
                raise InvalidRequest("binding_keys must be non-empty, unique and not blank")
        names = [f"{name}-{k}" for k in keys]
        for partition in names:
            _check_name("partition", partition)
        args = _stream_arguments(**(arguments or {}))
        self._conn.require(
            c.CREATE_SUPER_STREAM,
            "CreateSuperStream appeared in RabbitMQ 3.13; create it with "
            "'rabbitmq-streams add_super_stream' on this broker",
        )
        code = self._simple(
            c.CREATE_SUPER_STREAM,
            lambda w: w.string(name).string_array(names).string_array(keys).string_map(args),
            name,
        )
        if code == c.STREAM_ALREADY_EXISTS and exists_ok:
            return
        raise_for_code(code, c.CREATE_SUPER_STREAM, name)

    def delete_super_stream(self, name: str, *, missing_ok: bool = False) -> None:
        _check_name("super stream", name)
        self._conn.require(
            c.DELETE_SUPER_STREAM,
            "DeleteSuperStream appeared in RabbitMQ 3.13; use 'rabbitmq-streams delete_super_stream'",
        )
        code = self._simple(c.DELETE_SUPER_STREAM, lambda w: w.string(name), name)
        if code == c.STREAM_DOES_NOT_EXIST and missing_ok:
            return
        raise_for_code(code, c.DELETE_SUPER_STREAM, name)

    def partitions(self, super_stream: str) -> list[str]:
        """Partition streams in ``x-stream-partition-order`` order."""
        _check_name("super stream", super_stream)

        def call() -> list[str]:
            conn = self._conn
            corr = conn.next_corr()
            frame = Writer(c.PARTITIONS).u32(corr).string(super_stream).frame()
            code, r = conn.request(c.PARTITIONS, corr, frame, stream=super_stream)
            raise_for_code(code, c.PARTITIONS, super_stream)
            return r.string_array()

        return self._retrying(call)

    def route(self, super_stream: str, routing_key: str) -> list[str]:
        """Partitions whose binding key equals ``routing_key`` (empty list if none)."""
        _check_name("super stream", super_stream)

        def call() -> list[str]:
            conn = self._conn
            corr = conn.next_corr()
            frame = Writer(c.ROUTE).u32(corr).string(routing_key).string(super_stream).frame()
            code, r = conn.request(c.ROUTE, corr, frame, stream=super_stream)
            raise_for_code(code, c.ROUTE, super_stream)
            return r.string_array()

        return self._retrying(call)

    # -- offsets ------------------------------------------------------------------------------

    def store_offset(self, stream: str, reference: str, offset: int) -> None:
        """Store the last processed offset for ``reference`` (the broker never answers; failures
        are silent, so use :meth:`store_offset_verified` when it matters)."""
        _check_name("stream", stream)
        _check_reference(reference)
        _check_offset(offset)
        self._conn.send(store_offset_frame(reference, stream, offset))

    def query_offset(self, stream: str, reference: str) -> int | None:
        """The stored offset, or ``None`` when nothing was stored (NO_OFFSET, 0x13)."""
        _check_name("stream", stream)
        _check_reference(reference)

        def call() -> int | None:
            conn = self._conn
            corr = conn.next_corr()
            frame = query_offset_frame(corr, reference, stream)
            code, r = conn.request(c.QUERY_OFFSET, corr, frame, stream=stream)
            if code == c.NO_OFFSET:
                return None
            raise_for_code(code, c.QUERY_OFFSET, stream)
            return r.u64()

        return self._retrying(call)

    def store_offset_verified(
        self, stream: str, reference: str, offset: int, *, timeout: float = 5.0
    ) -> None:
        """Store, then read back until the broker returns ``offset``: the verified-store contract of
        :func:`streamledger.offsets.store_verified` (its cadence; :class:`StoreNotVerified`)."""
        self.store_offset(stream, reference, offset)
        store_verified(
            lambda: self.query_offset(stream, reference), offset, timeout=timeout, error=StoreNotVerified,
            describe=lambda last: (f"stream {stream!r}: stored offset for reference {reference!r} "
                                   f"still reads {last} instead of {offset} after {timeout:g}s"),
        )

    # -- publishing and reading ---------------------------------------------------------------

    def publish(
        self,
        stream: str,
        bodies: Iterable[bytes | OutboundMessage],
        *,
        amqp: bool = True,
        publisher_ref: str | None = None,
        batch_size: int = 500,
        application_properties: dict[str, Any] | None = None,
        first_publishing_id: int | None = None,
        filter_property: str | None = None,
    ) -> PublishResult:
        """Publish and wait for every confirm; see :func:`publisher.publish` (``filter_property``: the
        application property whose value is each message's filter value, RabbitMQ 3.13+)."""
        return publish(
            self._conn, self._next_publisher_id(), stream, bodies, amqp=amqp, publisher_ref=publisher_ref,
            batch_size=batch_size, application_properties=application_properties,
            first_publishing_id=first_publishing_id, timeout=self.timeout, filter_property=filter_property,
        )

    @property
    def supports_filtering(self) -> bool:
        """Whether the broker has stream filtering (filter values, chunk Bloom filters): 3.13+."""
        return supports_filtering(self._conn)

    @overload
    def read_range(
        self, stream: str, start: int, end: int, *, decode: Literal["amqp", "raw"] = ...,
        verify_crc: bool = ..., credit: int = ..., max_batch_records: int = ...,
        prefer: Literal["replica", "leader", "url"] = ...,
        layout: Literal["lists"] = ..., maps: bool = ...,
        filter_values: Collection[str] | None = ..., stats: ReadStats | None = ...,
        max_batch_bytes: int = ..., first_batch_records: int | None = ...,
    ) -> Iterator[RecordBatch]: ...

    @overload
    def read_range(
        self, stream: str, start: int, end: int, *, decode: Literal["amqp", "raw"] = ...,
        verify_crc: bool = ..., credit: int = ..., max_batch_records: int = ...,
        prefer: Literal["replica", "leader", "url"] = ...,
        layout: Literal["buffers"], maps: bool = ...,
        filter_values: Collection[str] | None = ..., stats: ReadStats | None = ...,
        max_batch_bytes: int = ..., first_batch_records: int | None = ...,
    ) -> Iterator[BufferBatch]: ...

    def read_range(
        self,
        stream: str,
        start: int,
        end: int,
        *,
        decode: Literal["amqp", "raw"] = "amqp",
        verify_crc: bool = True,
        credit: int = 16,
        max_batch_records: int = 65_536,
        prefer: Literal["replica", "leader", "url"] = "replica",
        layout: Literal["lists", "buffers"] = "lists",
        maps: bool = True,
        filter_values: Collection[str] | None = None,
        stats: ReadStats | None = None,
        max_batch_bytes: int = MAX_BUFFER_BYTES,
        first_batch_records: int | None = None,
    ) -> Iterator[RecordBatch] | Iterator[BufferBatch]:
        """Exactly the user records with ``start <= offset < end``; see :func:`reader.read_range`
        (``prefer``: which member serves the read, default a replica; ``layout="buffers"``: flat
        :class:`BufferBatch` es, ``maps=False`` to skip their map columns, ``max_batch_bytes`` to cut
        them by body bytes too; ``filter_values``: only the chunks the broker's stream filtering lets
        through, a superset the caller post-filters; ``stats``: what the broker delivered;
        ``first_batch_records``: smaller first batches, doubling up to ``max_batch_records``)."""
        return read_range(  # type: ignore[return-value]
            self, stream, start, end, decode=decode, verify_crc=verify_crc, credit=credit,
            max_batch_records=max_batch_records, prefer=prefer, layout=layout, maps=maps,
            filter_values=filter_values, stats=stats, max_batch_bytes=max_batch_bytes,
            first_batch_records=first_batch_records,
        )


def _resolve_on(conn: Connection, names: Sequence[str], specs: Sequence[OffsetSpec]
                ) -> dict[str, list[int | None]]:
    """:meth:`StreamClient._resolve_each` of ``names`` on one connection: one pipelined round."""
    requests = []
    for name in names:
        for spec in specs:
            corr = conn.next_corr()
            requests.append((c.RESOLVE_OFFSET_SPEC, corr, _resolve_frame(corr, name, spec)))

    def answer(_i: int, r: Reader) -> int | None:
        return _resolved_offset(r) if r.u16() == c.OK else None

    got = conn.pipeline(requests, answer)
    k = len(specs)
    return {n: got[i * k:(i + 1) * k] for i, n in enumerate(names)}


def _resolve_frame(corr: int, name: str, spec: OffsetSpec) -> bytes:
    """A ResolveOffsetSpec request (0x1f) for ``spec`` on stream ``name``."""
    return spec.encode(Writer(c.RESOLVE_OFFSET_SPEC).u32(corr).string(name)).frame()


def _resolved_offset(r: Reader) -> int:
    """The offset of a ResolveOffsetSpec answer whose code was OK (its offset type skipped)."""
    r.u16()
    return r.u64()
