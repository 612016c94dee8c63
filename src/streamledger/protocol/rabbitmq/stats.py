"""StreamStats as a value (its own module: the client and the reader both use it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StreamStats:
    """StreamStats (3.12+): chunk ids, and ``committed_offset`` (4.3+; ``None`` when absent).

    ``-1`` from the broker ("none yet") is reported as ``None``.
    """

    stream: str
    first_chunk_id: int | None
    committed_chunk_id: int | None
    last_chunk_id: int | None
    committed_offset: int | None
    raw: dict[str, int] = field(default_factory=dict)
