"""What a subscription delivers: single events and columnar batches of a bounded read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamledger.protocol.mewbase.frames import decode_event

__all__ = ["Event", "EventBatch", "event_json"]


def event_json(raw: bytes) -> str:
    """One event as relaxed Extended JSON: readable, yet binary, ObjectId and dates survive the trip."""
    from bson import json_util

    return str(json_util.dumps(decode_event(raw), json_options=json_util.RELAXED_JSON_OPTIONS))


@dataclass(frozen=True, slots=True)
class Event:
    """One RECEV: the event's position, its persist timestamp (ms) and its BSON bytes as received."""

    sub_id: int
    pos: int
    timestamp: int
    raw: bytes

    def document(self) -> dict[str, Any]:
        return decode_event(self.raw)


@dataclass(slots=True)
class EventBatch:
    """Consecutive events of one channel, column by column (cheap to turn into Arrow).

    ``offsets`` and ``bodies`` are read-only aliases with the names of the stream client's
    ``RecordBatch``, so a source-neutral writer can treat both alike.
    """

    channel: str
    positions: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    events: list[bytes] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def offsets(self) -> list[int]:
        return self.positions

    @property
    def bodies(self) -> list[bytes]:
        return self.events

    @property
    def chunk_timestamps(self) -> list[int]:
        """The persist times (ms): each event is its own "chunk" of the log."""
        return self.timestamps

    def documents(self) -> list[dict[str, Any]]:
        """The events decoded to dicts (a FrameError names the first invalid one)."""
        return [decode_event(raw) for raw in self.events]

    def json_texts(self) -> list[str]:
        """The events as relaxed Extended JSON (:func:`event_json`), one string per event."""
        return [event_json(raw) for raw in self.events]
