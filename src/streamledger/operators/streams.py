"""Create and delete streams and super streams, idempotently.

"Already exists" with the same shape is success, so these operators can sit at the head of every
DAG run. A different shape is an error naming what differs; deleting something absent is success
too. The operators only adapt Airflow to :mod:`streamledger.topology`: the connection's hook picks
the transport (extra ``topology``: ``stream``, the default, or ``amqp10`` for RabbitMQ 4's AMQP 1.0
``/management`` node) and the operators never ask which one it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook
from streamledger.topology import StreamSettings, StreamShapeMismatch, expected_partitions

__all__ = [
    "CreateStreamOperator", "CreateSuperStreamOperator", "DeleteStreamOperator", "DeleteSuperStreamOperator",
    "StreamShapeMismatch", "expected_partitions",
]


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
        settings = StreamSettings(max_age=self.max_age, max_length_bytes=self.max_length_bytes,
                                  max_segment_size_bytes=self.max_segment_size_bytes)
        with self.hook().get_topology() as topology:
            created = topology.create_stream(self.stream, settings)
        self.log.info("stream %s %s (%s)", self.stream, "created" if created else "already existed",
                      topology.transport)
        return {"stream": self.stream, "created": created}


class DeleteStreamOperator(_StreamOperator):
    """Delete a stream (success if it does not exist). :param stream: stream name. Templated."""

    template_fields: Sequence[str] = ("stream", "rabbitmq_stream_conn_id")

    def __init__(self, *, stream: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not stream:
            raise ValueError(f"{self.task_id}: stream name is required")
        self.stream = stream

    def execute(self, context: Context) -> dict[str, Any]:
        with self.hook().get_topology() as topology:
            existed = topology.delete_stream(self.stream)
        self.log.info("stream %s %s (%s)", self.stream, "deleted" if existed else "was already absent",
                      topology.transport)
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
        with self.hook().get_topology() as topology:
            streams, created = topology.create_super_stream(
                self.super_stream, partitions=self.partitions, binding_keys=self.binding_keys
            )
        if created:
            self.log.info("super stream %s created (%s): %s", self.super_stream, topology.transport,
                          ", ".join(streams))
        else:
            self.log.info("super stream %s already exists with %d partitions (%s)", self.super_stream,
                          len(streams), topology.transport)
        return {"super_stream": self.super_stream, "partitions": streams, "created": created}


class DeleteSuperStreamOperator(_StreamOperator):
    """Delete a super stream and its partitions (success if absent).

    :param super_stream: Templated.
    :param binding_keys: only with ``topology: amqp10``: the keys of a super stream made by binding
        keys, when the connection's stream port cannot be asked for its partitions (the AMQP 1.0
        management node cannot list them; numbered ones are found by probing).
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
        with self.hook().get_topology() as topology:
            deleted = topology.delete_super_stream(self.super_stream, binding_keys=self.binding_keys)
        self.log.info("super stream %s deleted (or was absent) (%s): %s", self.super_stream,
                      topology.transport, ", ".join(deleted) or "-")
        return {"super_stream": self.super_stream}
