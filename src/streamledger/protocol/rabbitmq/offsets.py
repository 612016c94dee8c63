"""Where a read starts: the log-neutral :class:`streamledger.offsets.OffsetSpec` (named
constructors ``first()``, ``last()``, ``next()``, ``offset(n)``, ``timestamp(ms)``), plus the wire
form it takes in Subscribe and ResolveOffsetSpec (rabbitmq-stream.md section 7.7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from streamledger import offsets
from streamledger.offsets import OffsetKind
from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.errors import InvalidRequest
from streamledger.protocol.rabbitmq.wire import Writer

_TYPES: dict[str, int] = {
    "first": c.OFFSET_TYPE_FIRST,
    "last": c.OFFSET_TYPE_LAST,
    "next": c.OFFSET_TYPE_NEXT,
    "offset": c.OFFSET_TYPE_OFFSET,
    "timestamp": c.OFFSET_TYPE_TIMESTAMP,
}


@dataclass(frozen=True, slots=True)
class OffsetSpec(offsets.OffsetSpec):
    """The log-neutral :class:`streamledger.offsets.OffsetSpec` with its wire form; bad values raise
    the stream client's :class:`InvalidRequest`."""

    error: ClassVar[type[Exception]] = InvalidRequest

    @classmethod
    def of(cls, spec: offsets.OffsetSpec) -> OffsetSpec:
        """This class's form of any log-neutral spec (what ``resolve_offset`` is handed)."""
        return spec if isinstance(spec, cls) else cls(spec.kind, spec.value)

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


__all__ = ["OffsetKind", "OffsetSpec"]
