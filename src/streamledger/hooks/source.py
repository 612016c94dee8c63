"""The Airflow hook of a source connection, whichever log it names.

The batch operator, the backlog sensor, the triggers and the audit operator take one connection
id for their source. The connection's *type* says which log it is, as a URL's scheme does in
:mod:`streamledger.sources` (the one table): ``rabbitmq_stream`` (a RabbitMQ stream or super
stream, :class:`~streamledger.hooks.rabbitmq_stream.RabbitMQStreamHook`) or ``mewbase`` (a mewbase
channel, :class:`~streamledger.hooks.mewbase.MewbaseHook`). Every such hook offers the same calls.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from streamledger.sources import KINDS, LogKind, OffsetLog, UnsupportedSource, conn_kind

__all__ = ["SourceHook", "source_hook", "source_kind"]


class SourceHook(Protocol):
    """What the adapters call of a source connection's hook."""

    @property
    def timeout(self) -> float: ...
    def get_url(self) -> str: ...
    def get_conn(self) -> Any: ...  # an OffsetLog, a context manager
    def broker_identity(self, client: OffsetLog | None = None) -> str: ...


def source_kind(conn_id: str, conn_type: str | None) -> LogKind:
    """The kind of log the connection ``conn_id`` of type ``conn_type`` names; one line otherwise."""
    kind = conn_kind(conn_type)
    if kind is None:
        known = " or ".join(k.conn_type for k in KINDS)
        raise UnsupportedSource(
            f"connection {conn_id!r} has type {conn_type or ''!r}; a source connection has type {known}"
        )
    return kind


def source_hook(conn_id: str) -> SourceHook:
    """The hook of the source connection ``conn_id``: its type picks the log (see the module doc)."""
    from airflow.sdk import BaseHook

    kind = source_kind(conn_id, BaseHook.get_connection(conn_id).conn_type)
    module, _, name = kind.airflow_hook.partition(":")
    hook: SourceHook = getattr(importlib.import_module(module), name)(conn_id)
    return hook
