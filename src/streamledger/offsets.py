"""The log-neutral offset vocabulary: where a read starts (:class:`OffsetSpec`), retention that
removed unread offsets (:class:`DataLossError`) and the verified store (:func:`store_verified`).

Both protocol packages satisfy it: RabbitMQ's ``OffsetSpec`` and ``DataLossError`` are subclasses of
the ones here (adding the wire encoding and the stream client's error family), and
``StreamClient.store_offset_verified`` and ``MewbaseLog.store_offset_verified`` end in the same
read-back loop. Log-neutral code (planning, the batch, the sensors) imports this module, never a
protocol's names, so a source of another kind is one more implementation, not another branch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

from streamledger.errors import StreamledgerError

__all__ = [
    "READ_BACK_INTERVAL",
    "WORDS",
    "ChunkPrint",
    "DataLossError",
    "OffsetKind",
    "OffsetNotVerified",
    "OffsetSpec",
    "OffsetSpecError",
    "same_stream",
    "same_streams",
    "store_verified",
    "take_print",
    "take_prints",
    "take_prints_within",
]

OffsetKind = Literal["first", "last", "next", "offset", "timestamp"]
KINDS: tuple[OffsetKind, ...] = ("first", "last", "next", "offset", "timestamp")
WORDS: dict[str, OffsetKind] = {
    "first": "first", "earliest": "first",
    "last": "last",
    "next": "next", "latest": "next", "tail": "next", "end": "next",
}
"""The words for a position, and their aliases: ``earliest`` / ``latest`` are Kafka's and Spark's
names for ``first`` / ``next``; ``tail`` and ``end`` say ``next`` too. ``last`` is the last record."""


class OffsetSpecError(StreamledgerError, ValueError):
    """An offset specification that names no position (unknown kind, missing or bad value)."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """A position in a log: first / last (last user record) / next (the tail) / an offset / a
    timestamp (ms). Modelled on confluent-kafka's ``OffsetSpec``: named constructors, no magic
    integers. A log's ``resolve_offset(name, spec)`` turns it into a concrete offset."""

    kind: OffsetKind
    value: int | None = None
    error: ClassVar[type[Exception]] = OffsetSpecError

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise self.error(f"unknown offset spec kind {self.kind!r}")
        if self.kind in ("offset", "timestamp"):
            if self.value is None:
                raise self.error(f"offset spec {self.kind} needs a value")
            if self.kind == "offset" and not 0 <= self.value < 2**64:
                raise self.error(f"offset {self.value} is outside 0..2**64-1")
            if self.kind == "timestamp" and not -(2**63) <= self.value < 2**63:
                raise self.error(f"timestamp {self.value} does not fit in 64 bits")
        elif self.value is not None:
            raise self.error(f"offset spec {self.kind} takes no value")

    @classmethod
    def first(cls) -> Self:
        return cls("first")

    @classmethod
    def last(cls) -> Self:
        return cls("last")

    @classmethod
    def next(cls) -> Self:
        return cls("next")

    @classmethod
    def earliest(cls) -> Self:
        """Kafka's and Spark's name for :meth:`first` (an alias: the kind is ``first``)."""
        return cls.first()

    @classmethod
    def latest(cls) -> Self:
        """Kafka's and Spark's name for :meth:`next`, the tail (an alias: the kind is ``next``)."""
        return cls.next()

    @classmethod
    def offset(cls, offset: int) -> Self:
        return cls("offset", int(offset))

    @classmethod
    def timestamp(cls, millis: int) -> Self:
        return cls("timestamp", int(millis))

    @classmethod
    def parse(cls, text: str) -> Self:
        """A word of :data:`WORDS`, an integer offset, or ``timestamp:<ms>`` (CLI form)."""
        lowered = text.strip().lower()
        if lowered in WORDS:
            return cls(WORDS[lowered])
        if lowered.startswith("timestamp:"):
            return cls.timestamp(cls._int(lowered.split(":", 1)[1], text))
        return cls.offset(cls._int(lowered, text))

    @classmethod
    def _int(cls, value: str, original: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise cls.error(
                f"invalid offset spec {original!r}: use first, last, next, an offset or timestamp:<ms>"
            ) from None

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}({self.value})"


class DataLossError(StreamledgerError):
    """The requested start offset is below the first offset still retained (retention removed it)."""

    def __init__(self, stream: str, requested: int, first_available: int) -> None:
        super().__init__(
            f"stream {stream!r}: offset {requested} is no longer retained "
            f"(first available offset is {first_available}); {first_available - requested} offset(s) lost"
        )
        self.stream = stream
        self.requested = requested
        self.first_available = first_available


class OffsetNotVerified(StreamledgerError):
    """A stored offset did not read back within the timeout (the batch's store step relies on the
    read-back: the watermark counts as stored only once the log says so)."""


READ_BACK_INTERVAL = 0.05
"""Seconds between read-backs of a stored offset. A store is one request on both logs and usually
reads back at once; a short interval keeps an idle batch's store step short."""


def store_verified(
    query: Callable[[], int | None], offset: int, *, timeout: float, describe: Callable[[int | None], str],
    error: Callable[[str], Exception] = OffsetNotVerified,
) -> None:
    """The verified-store contract, after the log has stored ``offset``: read it back every
    :data:`READ_BACK_INTERVAL` seconds until ``query()`` returns ``offset``; after ``timeout``
    seconds raise ``error(describe(last value read))`` (one line naming the stream and reference)."""
    deadline = time.monotonic() + timeout
    while True:
        stored = query()
        if stored == offset:
            return
        if time.monotonic() >= deadline:
            raise error(describe(stored))
        time.sleep(READ_BACK_INTERVAL)


@dataclass(frozen=True, slots=True)
class ChunkPrint:
    """A fingerprint of one committed chunk of a log: its first offset, timestamp and CRC, as its
    header gives them. The ledger records one when a range with records is committed; a log whose
    chunk at that offset differs is another incarnation of the stream (deleted and re-created),
    whatever its length or stored offsets say."""

    offset: int
    timestamp: int
    crc: int

    @classmethod
    def of(cls, header: Any) -> ChunkPrint:
        """From a chunk header (``first_offset``, ``timestamp``, ``crc``)."""
        return cls(int(header.first_offset), int(header.timestamp), int(header.crc))

    def differs(self, also: str = "") -> str:
        """The reason a stream is refused when the log's chunk at this offset is another (one
        wording for the batch and the streaming recorder); ``also`` joins the parenthesis."""
        more = f"; {also}" if also else ""
        return (f"the broker's chunk at offset {self.offset} is not the one the ledger committed "
                f"(timestamp {self.timestamp}, CRC {self.crc:#010x}{more})")

    def found_different_in(self, reason: str | None) -> bool:
        """Whether ``reason`` (a ``replaced`` mark) records that the log's chunk at this very print's
        offset was found to be another (:meth:`differs`): evidence that outlives the chunk, when
        retention rolls the new stream's chunk at that offset out before the cure is run."""
        return reason is not None and self.differs().rstrip(")") in reason


def take_print(log: Any, stream: str, offset: int) -> ChunkPrint | None:
    """The fingerprint of the chunk holding ``offset`` (a committed record); None when the log
    cannot be probed (no ``chunk_at``: a log without chunk headers) or holds no such chunk."""
    chunk_at = getattr(log, "chunk_at", None)
    head = chunk_at(stream, offset) if chunk_at is not None else None
    return None if head is None else ChunkPrint.of(head)


def same_stream(log: Any, stream: str, fingerprint: ChunkPrint) -> bool | None:
    """Whether ``log`` still holds the chunk ``fingerprint`` was taken of: True; False when the
    chunk holding its offset is another (or no user chunk holds it, yet the offset is retained):
    the stream was re-created; None when it cannot tell (retention removed the offset, or the log
    cannot be probed). One small read: one chunk header."""
    chunk_at = getattr(log, "chunk_at", None)
    if chunk_at is None:
        return None
    head = chunk_at(stream, fingerprint.offset)
    if head is not None:
        return ChunkPrint.of(head) == fingerprint
    return _gone_verdicts(log, {stream: fingerprint})[stream]


def _gone_verdicts(log: Any, prints: Mapping[str, ChunkPrint]) -> dict[str, bool | None]:
    """The verdict on prints no user chunk holds the offset of: None when retention took the offset
    (the log's first chunk of any type begins past it), else False (another chunk type holds it, or
    the log ends before it: a log never shrinks). Asked of the chunks themselves when the log can
    (``chunks_from`` of all chunk types, one round), not of the first offset its statistics give:
    those move only after retention has deleted the segment, and in between an offset retention
    took looked retained, the stream re-created (a false ``replaced`` mark)."""
    many = getattr(log, "chunks_from", None)
    if many is None:
        firsts_of = getattr(log, "first_offsets", None)
        firsts = (dict(firsts_of(list(prints))) if firsts_of is not None
                  else {s: log.first_offset(s) for s in prints})
        return {s: None if p.offset < int(firsts[s]) else False for s, p in prints.items()}
    heads = many([(s, p.offset) for s, p in prints.items()], all_chunks=True)
    out: dict[str, bool | None] = {}
    for s, p in prints.items():
        head = heads[(s, p.offset)]
        out[s] = None if head is not None and int(head.first_offset) > p.offset else False
    return out


def take_prints(log: Any, offsets: Mapping[str, int]) -> dict[str, ChunkPrint]:
    """:func:`take_print` of many streams (``stream -> offset``), asked all at once when the log can
    (``chunks_at``: a RabbitMQ ``StreamClient``); streams without a print are left out."""
    many = getattr(log, "chunks_at", None)
    if many is None or len(offsets) < 2:
        found = {s: take_print(log, s, o) for s, o in offsets.items()}
        return {s: p for s, p in found.items() if p is not None}
    heads = many(list(offsets.items()))
    return {s: ChunkPrint.of(h) for s, o in offsets.items() if (h := heads[(s, o)]) is not None}


def take_prints_within(log: Any, spans: Mapping[str, tuple[int, int]]) -> dict[str, ChunkPrint]:
    """The fingerprint of the first user chunk at or after each stream's ``start`` that begins below
    its ``end`` (``stream -> (start, end)``, ``end`` a committed tail: the chunk exists), asked all at
    once when the log can (``chunks_from``), else the chunk holding ``start``; streams without one
    (only tracking chunks there) are left out. What a claim of ``[start, end)`` records as evidence
    of which stream it claimed before anything of it is committed."""
    live = {s: (a, b) for s, (a, b) in spans.items() if a < b}
    many = getattr(log, "chunks_from", None)
    if many is None:
        found = {s: take_print(log, s, a) for s, (a, _b) in live.items()}
        return {s: p for s, p in found.items() if p is not None}
    heads = many([(s, a) for s, (a, _b) in live.items()]) if live else {}
    return {s: ChunkPrint.of(h) for s, (a, b) in live.items()
            if (h := heads[(s, a)]) is not None and int(h.first_offset) < b}


def same_streams(log: Any, prints: Mapping[str, ChunkPrint]) -> dict[str, bool | None]:
    """:func:`same_stream` of many streams, asked all at once when the log can (``chunks_at``, and
    ``first_offsets`` for those whose chunk is gone)."""
    many = getattr(log, "chunks_at", None)
    if many is None or len(prints) < 2:
        return {s: same_stream(log, s, p) for s, p in prints.items()}
    heads = many([(s, p.offset) for s, p in prints.items()])
    gone = {s: p for s, p in prints.items() if heads[(s, p.offset)] is None}
    out = _gone_verdicts(log, gone) if gone else {}
    for s, p in prints.items():
        head = heads[(s, p.offset)]
        if head is not None:
            out[s] = ChunkPrint.of(head) == p
    return out
