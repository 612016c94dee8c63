"""The announcement of new data: what the event trigger yields, as a typed record.

Airflow stores an event's payload as JSON (the asset event's ``extra["payload"]``); consumers of the
asset read those keys, so :meth:`Announcement.payload` is the one place that spells them, and
:meth:`Announcement.from_payload` the one place that reads them back (the redelivery rule does).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def announcement_id(pipeline: str, vector: Mapping[str, int | None]) -> str:
    """The identity of one announcement: a digest of the pipeline and, per partition, the announced
    position once it is acknowledged (``None``: never announced). In ack mode that vector is on the
    broker from the pin on, and no new pin is written while one waits, so an announcement yielded
    again after a restart (even one acknowledged on some partitions only) has the same identity."""
    text = json.dumps([pipeline, sorted((s, v) for s, v in vector.items() if v is not None)])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class PartitionNews:
    """One partition's part of an announcement: its tail, its backlog (offsets the pipeline has not
    processed), the offsets newly announced and the first of them (``begin``)."""

    tail: int
    backlog: int
    new: int
    begin: int

    def to_dict(self) -> dict[str, int]:
        return {"tail": self.tail, "backlog": self.backlog, "new": self.new, "from": self.begin}


@dataclass(frozen=True)
class Announcement:
    """New data of ``pipeline``: per partition what is announced (``streams``) and the offset each
    announced partition stores once the event is persisted (``upto``); ``identity`` is
    :func:`announcement_id` of the position vector after it; ``redelivered`` marks an announcement
    yielded again (ack mode) under the same identity."""

    pipeline: str
    super_stream: str | None
    identity: str
    upto: Mapping[str, int]
    streams: Mapping[str, PartitionNews] = field(default_factory=dict)
    redelivered: bool = False

    @property
    def new(self) -> int:
        return sum(p.new for p in self.streams.values())

    @property
    def backlog(self) -> int:
        return sum(p.backlog for p in self.streams.values())

    def payload(self) -> dict[str, Any]:
        """The event's JSON payload (the keys consumers of the asset read)."""
        out: dict[str, Any] = {
            "pipeline": self.pipeline,
            "super_stream": self.super_stream,
            "announcement": self.identity,
            "upto": dict(self.upto),
            "streams": {s: p.to_dict() for s, p in self.streams.items()},
            "tail": {s: p.tail for s, p in self.streams.items()},
            "backlog": self.backlog,
            "new": self.new,
        }
        if self.redelivered:
            out["redelivered"] = True
        return out

    @classmethod
    def from_payload(cls, payload: Any, pipeline: str) -> Announcement | None:
        """The announcement of ``pipeline`` in an event payload, else ``None`` (another trigger's
        event, another pipeline's, or not an announcement at all)."""
        if not isinstance(payload, Mapping) or payload.get("pipeline") != pipeline:
            return None
        ident = payload.get("announcement")
        if not isinstance(ident, str):
            return None
        streams = payload.get("streams")
        news = {
            s: PartitionNews(int(v["tail"]), int(v["backlog"]), int(v["new"]), int(v["from"]))
            for s, v in (streams.items() if isinstance(streams, Mapping) else ())
            if isinstance(v, Mapping) and {"tail", "backlog", "new", "from"} <= v.keys()
        }
        upto = payload.get("upto")
        return cls(pipeline=pipeline, super_stream=payload.get("super_stream"), identity=ident,
                   upto={s: int(o) for s, o in upto.items()} if isinstance(upto, Mapping) else {},
                   streams=news, redelivered=bool(payload.get("redelivered")))
