"""Where a pipeline stands on its streams: one room for every poller.

The batch, the Airflow sensor and triggers, and the Dagster sensor and assets all ask the same
questions: which streams does the pipeline read (a stream, or a super stream's partitions), where
does its next range begin, what is done, which claims are in flight and which will never finish,
and is a *user* record waiting? They used to answer them in four rooms with four slightly different
answers. Here: :class:`PipelineSource` (which streams; "exactly one of stream or super stream" is
checked here only), :class:`StreamPosition` (the answers for one stream) and :func:`measure` (one
ledger read per stream, :meth:`streamledger.ledger.Ledger.position`, plus the broker's tail).

The abandonment rule lives in the ledger (``SourcePosition.stale``, by the ledger's clock); this room
adds only what the scheduler knows (``holder_alive``). "A user record waits" means: the last user
chunk (``OffsetSpec.last()``) starts at or after the position. A StoreOffset on an idle stream
writes a tracking chunk that takes an offset, so comparing offsets alone would see a backlog of 1
forever.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from streamledger.batch.plan import broker_identity
from streamledger.batch.rules import source_problem as source_problem  # the one rule: ``rules``
from streamledger.errors import BatchError
from streamledger.ledger.types import RunIdentity as RunId
from streamledger.ledger.types import SourcePosition, SourceRef, Watermark
from streamledger.paths import name_problem
from streamledger.sources import shared_name_problem, super_stream_partitions

if TYPE_CHECKING:
    from streamledger.ledger import Ledger, OffsetRange

__all__ = [
    "LogOffsets", "PipelineSource", "StreamPosition", "cluster_name", "first_offsets", "lag", "log_offsets",
    "measure", "source_problem", "survey_offsets", "user_records", "user_records_many",
]


def cluster_name(log: Any) -> str | None:
    """The name the log server reports for itself (RabbitMQ's cluster name), if any."""
    name = getattr(log, "cluster_name", None)
    return name if isinstance(name, str) and name else None


@dataclass(frozen=True, slots=True)
class PipelineSource:
    """A pipeline and what it reads: exactly one of a stream or a super stream, on one log server."""

    pipeline: str
    url: str
    stream: str | None = None
    super_stream: str | None = None
    broker_name: str | None = None

    def __post_init__(self) -> None:
        problem = source_problem(self.pipeline, self.stream, self.super_stream, self.url)
        if problem is not None:
            raise BatchError(problem)

    def streams(self, log: Any) -> list[str]:
        """The stream, or the super stream's partitions as the broker lists them now."""
        if self.super_stream is not None:
            names = super_stream_partitions(log, self.super_stream, error=BatchError)
            for name in names:  # as the broker lists them: refused before anything is claimed
                problem = name_problem("partition", name)
                if problem is not None:
                    raise BatchError(f"super stream {self.super_stream!r}: {problem}")
            return names
        assert self.stream is not None
        return [self.stream]

    def identity(self, log: Any) -> str:
        """The credential-free broker identity the ledger files this pipeline's history under."""
        reported = None if self.broker_name else cluster_name(log)
        problem = shared_name_problem(self.url, reported, self.broker_name)
        if problem is not None:
            raise BatchError(f"pipeline {self.pipeline!r}: {problem}")
        return broker_identity(self.url, self.broker_name or reported)

    def ref(self, identity: str, stream: str) -> SourceRef:
        return SourceRef(broker=identity, stream=stream, super_stream=self.super_stream)


_NO_HISTORY = SourcePosition(None, 0, None, Watermark(None, None))


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """One stream of a pipeline as every poller sees it (the batch, the Airflow triggers, the Dagster
    sensor and automation condition: one type).

    Two types, one for each side: :class:`~streamledger.ledger.types.SourcePosition` is what the ledger
    alone knows (one transaction; the ledger never talks to a broker); this one adds what the broker
    says (tail, last user chunk) and what the scheduler says (claims whose holder is gone).

    ``start``: where the pipeline's next new range begins (the ledger's end, else the broker's
    stored offset + 1, else the first retained offset); ``tail``: the committed tail (exclusive);
    ``last_user``: the first offset of the last user chunk (``tail`` when unknown or none);
    ``ledger``: the ledger's side (watermark, frontier, claims, holes); ``gone``: open claims nobody
    will finish (not heard from for the claim timeout, or whose holder the scheduler reports gone).
    """

    stream: str
    start: int
    tail: int
    last_user: int
    ledger: SourcePosition = field(default_factory=lambda: _NO_HISTORY)
    gone: tuple[OffsetRange, ...] = ()

    def has_user_data_from(self, offset: int) -> bool:
        """Whether a user chunk starts at or after ``offset`` (chunk boundaries: tails always are one)."""
        return offset <= self.last_user < self.tail

    @property
    def backlog(self) -> int:
        """Unprocessed offsets (an upper bound on records), 0 when only tracking chunks follow ``start``."""
        return self.tail - self.start if self.has_user_data_from(self.start) else 0

    @property
    def claimed(self) -> tuple[OffsetRange, ...]:
        """Claims in flight that someone may still finish."""
        gone = {r.id for r in self.gone}
        return tuple(r for r in self.ledger.open_claims if r.id not in gone)

    @property
    def frontier(self) -> int | None:
        """End of the done prefix once it holds a committed or lost range (None before)."""
        return self.ledger.frontier

    @property
    def resume(self) -> int:
        """Where the done work ends: the frontier, else (no history) the start."""
        return self.ledger.frontier if self.ledger.frontier is not None else self.start


def _last_user(log: Any, stream: str) -> int | None:
    """First offset of the stream's last user chunk; None when the log cannot say (then any offset
    past the start counts as data)."""
    resolve = getattr(log, "resolve_offset", None)
    if resolve is None:
        return None
    from streamledger.offsets import OffsetSpec

    return int(resolve(stream, OffsetSpec.last()))


def log_offsets(log: Any, streams: Sequence[str], reference: str, *, tails: bool = True,
                stored: bool = True) -> tuple[dict[str, int], dict[str, int | None]]:
    """Committed tails and the stored offsets of ``reference`` on many streams (each asked for
    unless turned off): all at once over one connection when the log can (``committed_tails`` /
    ``query_offsets``, a RabbitMQ ``StreamClient``), else one stream at a time."""
    names = list(streams)
    many = getattr(log, "committed_tails", None)
    found: dict[str, int] = {}
    if tails:
        found = ({s: int(t) for s, t in many(names).items()} if many is not None
                 else {s: int(log.committed_tail(s)) for s in names})
    if not stored:
        return found, {}
    many = getattr(log, "query_offsets", None)
    offsets = dict(many(names, reference)) if many is not None else {s: log.query_offset(s, reference)
                                                                      for s in names}
    return found, offsets


@dataclass(frozen=True, slots=True)
class LogOffsets:
    """What a log said of many streams at once (:func:`survey_offsets`): committed tails, stored
    offsets of one reference, and the StreamStats the tails came from when the log answers with
    them (a RabbitMQ ``StreamClient``), which a probe of the same streams takes instead of asking
    again (:func:`user_records_many`)."""

    tails: dict[str, int]
    stored: dict[str, int | None]
    stats: Mapping[str, Any] | None = None


def survey_offsets(log: Any, streams: Sequence[str], reference: str) -> LogOffsets:
    """:func:`log_offsets` of many streams, keeping the stats the tails came from (each asked once)."""
    names = list(streams)
    many = getattr(log, "tails_with_stats", None)
    if many is None:
        return LogOffsets(*log_offsets(log, names, reference))
    tails, stats = many(names)
    stored = log_offsets(log, names, reference, tails=False)[1]
    return LogOffsets({s: int(t) for s, t in tails.items()}, stored, stats)


def first_offsets(log: Any, streams: Sequence[str]) -> dict[str, int]:
    """The first retained offset of many streams (all at once when the log can)."""
    names = list(streams)
    if not names:
        return {}
    many = getattr(log, "first_offsets", None)
    if many is not None:
        return {s: int(f) for s, f in many(names).items()}
    return {s: int(log.first_offset(s)) for s in names}


def measure(log: Any, ledger: Ledger | None, source: PipelineSource, *,
            streams: Sequence[str] | None = None,
            holder_alive: Callable[[RunId], bool] | None = None,
            claim_timeout: float | None = None,
            identity: str | None = None,
            last_user: bool = True) -> list[StreamPosition]:
    """The position of every stream of ``source`` (``streams`` if the caller listed them already).

    ``ledger`` None means no ledger exists yet (no pipeline has history). The ledger's positions
    are read in one transaction, the tails (and, without ledger history, stored offsets) all at
    once; the last chunks are read before the tails, so ``last_user < tail`` holds even while data
    arrives.
    ``last_user=False`` skips the last chunk (callers that count offsets, not user records).
    """
    names = list(streams) if streams is not None else source.streams(log)
    ident = identity or source.identity(log)
    stale = None if claim_timeout is None else timedelta(seconds=claim_timeout)
    lasts = {s: _last_user(log, s) for s in names} if last_user else {}
    tails, _ = log_offsets(log, names, source.pipeline, stored=False)
    found = (ledger.positions(source.pipeline, [source.ref(ident, s) for s in names], stale_after=stale)
             if ledger is not None else [_NO_HISTORY] * len(names))
    fresh = [s for s, pos in zip(names, found, strict=True) if pos.end is None]
    stored = log_offsets(log, fresh, source.pipeline, tails=False)[1] if fresh else {}
    firsts = first_offsets(log, [s for s in fresh if stored.get(s) is None])
    out: list[StreamPosition] = []
    for stream, pos in zip(names, found, strict=True):
        last = lasts.get(stream)
        tail = tails[stream]
        if pos.end is not None:
            start = pos.end
        else:
            got = stored.get(stream)
            start = got + 1 if got is not None else firsts[stream]
        gone = []
        for claim in pos.open_claims:
            if claim.id in pos.stale or (holder_alive is not None and not holder_alive(claim.run)):
                gone.append(claim)
        out.append(StreamPosition(stream, start, tail, _last_or_any(last, start, tail), pos, tuple(gone)))
    return out


def _last_or_any(last: int | None, start: int, tail: int) -> int:
    """The last user chunk's offset; unknown, any offset past ``start`` counts as data."""
    return max(start, tail - 1) if last is None else last


def lag(log: Any, stream: str, start: int) -> tuple[int, int]:
    """The stream's committed tail and the backlog from ``start`` to it, by :attr:`StreamPosition.backlog`'s
    rule (0 when only tracking chunks follow ``start``): for a reader such as ``streamledger status``."""
    last = _last_user(log, stream)  # before the tail, so last < tail holds while data arrives
    tail = int(log.committed_tail(stream))
    return tail, StreamPosition(stream, start, tail, _last_or_any(last, start, tail)).backlog


def user_records(log: Any, stream: str, start: int, end: int, need: int = 1) -> int:
    """User records in ``[start, end)``, counting no further than ``need``: what tells a range of
    tracking chunks only (nothing to read) from one with data. A log without ``read_range``, or a
    start below retention, answers ``need`` (the batch must run to read or record the loss)."""
    read_range = getattr(log, "read_range", None)
    if read_range is None or start >= end or need <= 0:
        return need if read_range is None and start < end and need > 0 else 0
    from streamledger.offsets import DataLossError

    seen = 0
    try:
        batches = read_range(stream, start, end, decode="raw")
        try:
            for batch in batches:
                seen += len(batch)
                if seen >= need:
                    break
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    except DataLossError:
        return need
    return seen


def user_records_many(log: Any, ranges: Mapping[str, tuple[int, int]], need: int = 1, *,
                      seen: LogOffsets | None = None) -> dict[str, int]:
    """:func:`user_records` of many streams (``stream -> (start, end)``): all at once over one
    connection when the log can (``user_records_many``, a RabbitMQ ``StreamClient``; a start below
    retention answers ``need`` there too), else one stream at a time. ``seen``: what the log said of
    these streams already (:func:`survey_offsets`), so their stats are not asked again."""
    many = getattr(log, "user_records_many", None)
    if many is None or len(ranges) < 2:
        return {s: user_records(log, s, start, end, need) for s, (start, end) in ranges.items()}
    quick = {"by_last_chunk": True} if need == 1 else {}  # a batch's probe: the cheapest answer
    found = (many(dict(ranges), need=need, stats=seen.stats, **quick) if seen is not None and seen.stats
             else many(dict(ranges), need=need, **quick))
    return {s: need if found[s] is None else int(found[s]) for s in ranges}
