"""The columnar batch that range reads yield.

Columns rather than one object per record: the decoder fills whole lists with ``extend`` and
the Spark layer turns them into Arrow arrays without touching each record again, which is what
keeps the per-record Python cost of the hot path low.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(slots=True)
class RecordBatch:
    """Records of one stream, one list per column, all columns the same length.

    ``properties``, ``application_properties`` and ``message_annotations`` are ``None`` as whole
    columns when the batch was decoded with ``decode="raw"``; with ``decode="amqp"`` they hold one
    entry per record, ``None`` for a record without that section (or a record that is not AMQP).
    """

    stream: str
    offsets: list[int]
    chunk_timestamps: list[int]
    bodies: list[bytes]
    properties: list[dict[str, Any] | None] | None
    application_properties: list[dict[str, Any] | None] | None
    message_annotations: list[dict[str, Any] | None] | None

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def empty(cls, stream: str, decode: Literal["amqp", "raw"]) -> RecordBatch:
        """A batch with no records whose dict columns match the decode mode."""
        if decode == "raw":
            return cls(stream, [], [], [], None, None, None)
        if decode != "amqp":
            raise ValueError(f"decode must be 'amqp' or 'raw', not {decode!r}")
        return cls(stream, [], [], [], [], [], [])
