"""Create and delete streams and super streams, idempotently.

"Already exists" with the same shape is success, so these operators can sit at the head of every
DAG run. A different shape is an error naming what differs: for a stream, the broker itself
refuses a create whose arguments differ from the existing stream's (response 0x11, precondition
failed); for a super stream, the existing partitions are compared with the requested ones.
Deleting something absent is success too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from streamledger.errors import StreamledgerError
from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook


class StreamShapeMismatch(StreamledgerError):
    """The stream or super stream exists, but not in the requested shape."""


def expected_partitions(name: str, partitions: int | None, binding_keys: Sequence[str] | None) -> list[str]:
    """Partition names RabbitMQ derives for a super stream: ``<name>-<i>`` or ``<name>-<key>``."""
    if binding_keys:
        return [f"{name}-{key}" for key in binding_keys]
    assert partitions is not None
    return [f"{name}-{i}" for i in range(partitions)]


class _StreamOperator(BaseOperator):
    ui_color = "#fde68a"

    def __init__(self, *, rabbitmq_stream_conn_id: str = RabbitMQStreamHook.default_conn_name,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id

    def hook(self) -> RabbitMQStreamHook:
        return RabbitMQStreamHook(self.rabbitmq_stream_conn_id)


class CreateStreamOperator(_StreamOperator):
    """Create a stream (success if it already exists with the same arguments).

    :param stream: stream name. Templated.
    :param max_length_bytes: retention by size (``x-max-length-bytes``).
    :param max_age: retention by age, e.g. ``"7D"`` or ``"24h"`` (``x-max-age``).
    :param max_segment_size_bytes: segment size (``x-stream-max-segment-size-bytes``).
    """

    template_fields: Sequence[str] = ("stream", "max_age", "rabbitmq_stream_conn_id")

    def __init__(self, *, stream: str, max_length_bytes: int | None = None, max_age: str | None = None,
                 max_segment_size_bytes: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not stream:
            raise ValueError(f"{self.task_id}: stream name is required")
        self.stream = stream
        self.max_length_bytes = max_length_bytes
        self.max_age = max_age
        self.max_segment_size_bytes = max_segment_size_bytes

    def execute(self, context: Context) -> dict[str, Any]:
        from streamledger.protocol.rabbitmq import ResponseError

        with self.hook().get_conn() as client:
            existed = client.stream_exists(self.stream)
            try:
                client.create_stream(
                    self.stream, max_length_bytes=self.max_length_bytes, max_age=self.max_age,
                    max_segment_size_bytes=self.max_segment_size_bytes, exists_ok=True,
                )
            except ResponseError as exc:
                if existed:
                    raise StreamShapeMismatch(
                        f"stream {self.stream!r} already exists with different arguments than "
                        f"max_length_bytes={self.max_length_bytes}, max_age={self.max_age}, "
                        f"max_segment_size_bytes={self.max_segment_size_bytes} (broker said: {exc})"
                    ) from exc
                raise
        self.log.info("stream %s %s", self.stream, "already existed" if existed else "created")
        return {"stream": self.stream, "created": not existed}


class DeleteStreamOperator(_StreamOperator):
    """Delete a stream (success if it does not exist). :param stream: stream name. Templated."""

    template_fields: Sequence[str] = ("stream", "rabbitmq_stream_conn_id")

    def __init__(self, *, stream: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not stream:
            raise ValueError(f"{self.task_id}: stream name is required")
        self.stream = stream

    def execute(self, context: Context) -> dict[str, Any]:
        with self.hook().get_conn() as client:
            existed = client.stream_exists(self.stream)
            client.delete_stream(self.stream, missing_ok=True)
        self.log.info("stream %s %s", self.stream, "deleted" if existed else "was already absent")
        return {"stream": self.stream, "deleted": existed}


class CreateSuperStreamOperator(_StreamOperator):
    """Create a super stream by partition count or binding keys (idempotent on the same shape).

    :param super_stream: name. Templated.
    :param partitions: number of partitions (``<name>-0`` ... ``<name>-N-1``).
    :param binding_keys: routing keys, one partition each (``<name>-<key>``); instead of ``partitions``.
    """

    template_fields: Sequence[str] = ("super_stream", "rabbitmq_stream_conn_id")

    def __init__(self, *, super_stream: str, partitions: int | None = None,
                 binding_keys: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not super_stream:
            raise ValueError(f"{self.task_id}: super_stream name is required")
        if (partitions is None) == (not binding_keys):
            raise ValueError(f"{self.task_id}: give exactly one of partitions= or binding_keys=")
        if partitions is not None and partitions < 1:
            raise ValueError(f"{self.task_id}: partitions must be >= 1, got {partitions}")
        self.super_stream = super_stream
        self.partitions = partitions
        self.binding_keys = list(binding_keys) if binding_keys else None

    def execute(self, context: Context) -> dict[str, Any]:
        from streamledger.protocol.rabbitmq import StreamError

        wanted = expected_partitions(self.super_stream, self.partitions, self.binding_keys)
        with self.hook().get_conn() as client:
            try:
                existing = list(client.partitions(self.super_stream))
            except StreamError:
                existing = []
            if existing:
                if existing != wanted:
                    raise StreamShapeMismatch(
                        f"super stream {self.super_stream!r} already exists with partitions {existing}, "
                        f"not the requested {wanted}"
                    )
                self.log.info("super stream %s already exists with %d partitions", self.super_stream,
                              len(existing))
                return {"super_stream": self.super_stream, "partitions": existing, "created": False}
            client.create_super_stream(
                self.super_stream, partitions=self.partitions, binding_keys=self.binding_keys, exists_ok=True
            )
            created = list(client.partitions(self.super_stream))
        if created != wanted:
            raise StreamShapeMismatch(
                f"super stream {self.super_stream!r} was created with partitions {created}, expected {wanted}"
            )
        self.log.info("super stream %s created: %s", self.super_stream, ", ".join(created))
        return {"super_stream": self.super_stream, "partitions": created, "created": True}


class DeleteSuperStreamOperator(_StreamOperator):
    """Delete a super stream and its partitions (success if absent). :param super_stream: Templated."""

    template_fields: Sequence[str] = ("super_stream", "rabbitmq_stream_conn_id")

    def __init__(self, *, super_stream: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not super_stream:
            raise ValueError(f"{self.task_id}: super_stream name is required")
        self.super_stream = super_stream

    def execute(self, context: Context) -> dict[str, Any]:
        with self.hook().get_conn() as client:
            client.delete_super_stream(self.super_stream, missing_ok=True)
        self.log.info("super stream %s deleted (or was absent)", self.super_stream)
        return {"super_stream": self.super_stream}
