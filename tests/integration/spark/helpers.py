"""Helpers shared by the Spark integration tests: publish known records, read them back exactly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from streamledger.protocol.rabbitmq import StreamClient


def body(stream: str, i: int) -> bytes:
    return f"{stream}#{i:06d}".encode()


def publish(url: str, stream: str, count: int, *, start: int = 0, batch_size: int = 300) -> None:
    """Publish ``count`` AMQP messages with known bodies (``<stream>#<i>``) and one app property."""
    if count <= 0:
        return
    with StreamClient.connect(url) as client:
        result = client.publish(
            stream,
            [body(stream, i) for i in range(start, start + count)],
            batch_size=batch_size,
            application_properties={"source": "spark-tests"},
        )
    assert result.confirmed == count, result


def create_stream(url: str, stream: str, count: int = 0, **kwargs: Any) -> None:
    with StreamClient.connect(url) as client:
        client.create_stream(stream, **kwargs)
    publish(url, stream, count)


def client_offsets(url: str, stream: str, start: int, end: int) -> list[int]:
    """What the client itself reads for the range (the reference the Spark output must equal)."""
    with StreamClient.connect(url) as client:
        return [o for batch in client.read_range(stream, start, end, decode="raw") for o in batch.offsets]


def rows_by_stream(rows: Sequence[Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in rows:
        out.setdefault(r["stream"], []).append(r["offset"])
    return {k: sorted(v) for k, v in out.items()}


def read_df(spark: Any, url: str, **options: Any) -> Any:
    reader = spark.read.format("rabbitmq_stream").option("url", url)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


class RoundTrips:
    """Counts the broker round trips of the real connections (a spy calling through): each answer
    waited for, whether of one request (a connection's handshake and close included) or of a
    pipelined window of requests."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from streamledger.protocol.rabbitmq.connection import Connection

        self.count = 0
        for name in ("call", "pipeline"):
            monkeypatch.setattr(Connection, name, self._counting(getattr(Connection, name)))

    def _counting(self, real: Any) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return real(*args, **kwargs)

        return spy
