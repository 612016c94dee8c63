"""Where a read starts: an immutable offset specification with named constructors.

Modelled on confluent-kafka's ``OffsetSpec``: ``OffsetSpec.first()``, ``.last()``, ``.next()``,
``.offset(n)`` and ``.timestamp(ms)`` instead of magic integers. The same value encodes itself
for Subscribe and ResolveOffsetSpec (rabbitmq-stream.md section 7.7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.errors import InvalidRequest
from streamledger.protocol.rabbitmq.wire import Writer

OffsetKind = Literal["first", "last", "next", "offset", "timestamp"]

_TYPES: dict[str, int] = {
    "first": c.OFFSET_TYPE_FIRST,
    "last": c.OFFSET_TYPE_LAST,
    "next": c.OFFSET_TYPE_NEXT,
    "offset": c.OFFSET_TYPE_OFFSET,
    "timestamp": c.OFFSET_TYPE_TIMESTAMP,
}


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """A position in a stream: first / last (last user chunk) / next / an offset / a timestamp (ms)."""

    kind: OffsetKind
    value: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _TYPES:
            raise InvalidRequest(f"unknown offset spec kind {self.kind!r}")
        if self.kind in ("offset", "timestamp"):
            if self.value is None:
                raise InvalidRequest(f"offset spec {self.kind} needs a value")
            if self.kind == "offset" and not 0 <= self.value < 2**64:
                raise InvalidRequest(f"offset {self.value} is outside 0..2**64-1")
            if self.kind == "timestamp" and not -(2**63) <= self.value < 2**63:
                raise InvalidRequest(f"timestamp {self.value} does not fit in 64 bits")
        elif self.value is not None:
            raise InvalidRequest(f"offset spec {self.kind} takes no value")

    @classmethod
    def first(cls) -> OffsetSpec:
        return cls("first")

    @classmethod
    def last(cls) -> OffsetSpec:
        return cls("last")

    @classmethod
    def next(cls) -> OffsetSpec:
        return cls("next")

    @classmethod
    def offset(cls, offset: int) -> OffsetSpec:
        return cls("offset", int(offset))

    @classmethod
    def timestamp(cls, millis: int) -> OffsetSpec:
        return cls("timestamp", int(millis))

    @classmethod
    def parse(cls, text: str) -> OffsetSpec:
        """``first``, ``last``, ``next``, an integer offset, or ``timestamp:<ms>`` (CLI form)."""
        lowered = text.strip().lower()
        if lowered in ("first", "earliest"):
            return cls.first()
        if lowered == "last":
            return cls.last()
        if lowered in ("next", "latest"):
            return cls.next()
        if lowered.startswith("timestamp:"):
            return cls.timestamp(_int(lowered.split(":", 1)[1], text))
        return cls.offset(_int(lowered, text))

    @property
    def wire_type(self) -> int:
        return _TYPES[self.kind]

    def encode(self, w: Writer) -> Writer:
        """Append ``OffsetType:uint16 [Offset:uint64 | Timestamp:int64]``."""
        w.u16(self.wire_type)
        if self.kind == "offset":
            w.u64(self.value or 0)
        elif self.kind == "timestamp":
            w.i64(self.value or 0)
        return w

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}({self.value})"


def _int(value: str, original: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidRequest(
            f"invalid offset spec {original!r}: use first, last, next, an offset or timestamp:<ms>"
        ) from None
