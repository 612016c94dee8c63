"""Create and delete streams and super streams, idempotently.

"Already exists" with the same shape is success, so these operators can sit at the head of every
DAG run. A different shape is an error naming what differs: for a stream, the broker itself
refuses a create whose arguments differ from the existing stream's (response 0x11, precondition
failed); for a super stream, the existing partitions are compared with the requested ones.
Deleting something absent is success too.

With the connection extra ``topology: amqp10`` the same operators go through RabbitMQ 4's AMQP 1.0
``/management`` node instead of the stream protocol (:mod:`streamledger.protocol.amqp10`): a 409
answer is the shape mismatch, and super streams are built as the broker builds them.
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

        hook = self.hook()
        if hook.topology_over_amqp10:
            return self._execute_amqp10(hook)
        with hook.get_conn() as client:
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

    def _execute_amqp10(self, hook: RabbitMQStreamHook) -> dict[str, Any]:
        from streamledger.protocol.amqp10 import Conflict, StreamOptions

        options = StreamOptions(max_age=self.max_age, max_length_bytes=self.max_length_bytes,
                                max_segment_size_bytes=self.max_segment_size_bytes)
        with hook.get_management() as m:
            existed = m.queue_exists(self.stream)
            try:
                m.declare_stream(self.stream, options)
            except Conflict as exc:
                raise StreamShapeMismatch(f"stream {self.stream!r} already exists with different arguments "
                                          f"(broker said: {exc.description})") from exc
        self.log.info("stream %s %s (AMQP 1.0)", self.stream, "already existed" if existed else "created")
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
        hook = self.hook()
        if hook.topology_over_amqp10:
            with hook.get_management() as m:
                existed = m.queue_exists(self.stream)
                m.delete_queue(self.stream)
            self.log.info("stream %s %s (AMQP 1.0)", self.stream,
                          "deleted" if existed else "was already absent")
            return {"stream": self.stream, "deleted": existed}
        with hook.get_conn() as client:
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
        hook = self.hook()
        if hook.topology_over_amqp10:
            return self._execute_amqp10(hook, wanted)
        with hook.get_conn() as client:
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

    def _execute_amqp10(self, hook: RabbitMQStreamHook, wanted: list[str]) -> dict[str, Any]:
        from streamledger.protocol.amqp10 import Conflict

        with hook.get_management() as m:
            existing = [p for p in wanted if m.queue_exists(p)]
            if self.partitions is not None and m.queue_exists(f"{self.super_stream}-{self.partitions}"):
                raise StreamShapeMismatch(f"super stream {self.super_stream!r} already has more than "
                                          f"{self.partitions} partitions")
            try:
                created = m.create_super_stream(self.super_stream, partitions=self.partitions,
                                                binding_keys=self.binding_keys)
            except Conflict as exc:
                raise StreamShapeMismatch(f"super stream {self.super_stream!r} exists in another shape "
                                          f"(broker said: {exc.description})") from exc
        fresh = len(existing) < len(wanted)
        self.log.info("super stream %s %s (AMQP 1.0): %s", self.super_stream,
                      "created" if fresh else "already existed", ", ".join(created))
        return {"super_stream": self.super_stream, "partitions": created, "created": fresh}


class DeleteSuperStreamOperator(_StreamOperator):
    """Delete a super stream and its partitions (success if absent).

    :param super_stream: Templated.
    :param binding_keys: only with ``topology: amqp10`` and a super stream made by binding keys (the
        AMQP 1.0 management node cannot list partitions; numbered ones are found by probing).
    """

    template_fields: Sequence[str] = ("super_stream", "rabbitmq_stream_conn_id")

    def __init__(self, *, super_stream: str, binding_keys: Sequence[str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not super_stream:
            raise ValueError(f"{self.task_id}: super_stream name is required")
        self.super_stream = super_stream
        self.binding_keys = list(binding_keys) if binding_keys else None

    def execute(self, context: Context) -> dict[str, Any]:
        hook = self.hook()
        if hook.topology_over_amqp10:
            with hook.get_management() as m:
                deleted = m.delete_super_stream(self.super_stream, binding_keys=self.binding_keys)
            self.log.info("super stream %s deleted (AMQP 1.0): %s", self.super_stream,
                          ", ".join(deleted) or "-")
            return {"super_stream": self.super_stream}
        with hook.get_conn() as client:
            client.delete_super_stream(self.super_stream, missing_ok=True)
        self.log.info("super stream %s deleted (or was absent)", self.super_stream)
        return {"super_stream": self.super_stream}
