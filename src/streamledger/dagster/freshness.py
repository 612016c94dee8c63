"""How far a pipeline's output is behind its stream, in time, from the log's own timestamps.

Offsets say how much is waiting, not how old it is. Every chunk (RabbitMQ) or event (mewbase)
carries the server's clock at write time, so the lag of a stream is the timestamp of its last user
chunk minus that of the first chunk the pipeline has not processed (0 when nothing waits). Two short
reads per stream, through the log protocol of :mod:`streamledger.sources`; no clock of this host is
involved, so a skewed worker clock cannot make a stream look fresh.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamledger.errors import StreamledgerError


def _first_timestamp(client: Any, stream: str, start: int, end: int) -> int | None:
    """Timestamp (ms) of the first user record in ``[start, end)``, or None if there is none: the
    first batch of a plain ``read_range`` (any log), closed once it is seen."""
    from streamledger.offsets import DataLossError

    try:
        batches = client.read_range(stream, start, end, decode="raw")
    except DataLossError:
        return None
    try:
        for batch in batches:
            if len(batch):
                return int(batch.chunk_timestamps[0])
    except DataLossError:
        return None
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    return None


def stream_lag_seconds(client: Any, stream: str, watermark: int, tail: int | None = None) -> float:
    """Seconds between the newest user chunk and the oldest one at or after ``watermark``."""
    from streamledger.offsets import OffsetSpec

    tail = int(client.committed_tail(stream)) if tail is None else tail
    if watermark >= tail:
        return 0.0
    oldest = _first_timestamp(client, stream, watermark, tail)
    if oldest is None:
        return 0.0  # only tracking chunks (stored offsets) beyond the watermark
    last = int(client.resolve_offset(stream, OffsetSpec.last()))
    newest = _first_timestamp(client, stream, max(last, watermark), tail)
    if newest is None:
        raise StreamledgerError(f"stream {stream!r}: no user record at its last chunk {last} (tail {tail})")
    return max(0.0, (newest - oldest) / 1000.0)


def lag_by_stream(client: Any, watermarks: Iterable[tuple[str, int]]) -> dict[str, float]:
    """``{stream: lag seconds}`` for ``(stream, watermark)`` pairs."""
    return {stream: stream_lag_seconds(client, stream, watermark) for stream, watermark in watermarks}
