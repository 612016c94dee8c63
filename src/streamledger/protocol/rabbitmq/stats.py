"""StreamStats and StreamMetadata as values (their own module: the client and the reader both use them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamledger.protocol.rabbitmq import constants as c


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


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """Leader and replicas of one stream as advertised by the broker (host, port)."""

    stream: str
    code: int
    code_name: str
    leader: tuple[str, int] | None
    replicas: list[tuple[str, int]]

    @property
    def exists(self) -> bool:
        return self.code == c.OK
