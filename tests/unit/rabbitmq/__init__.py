"""Unit tests of the RabbitMQ Streams data-plane codecs (no broker needed)."""

from __future__ import annotations

from typing import Any


def load_accel() -> Any:
    """The compiled loops, built here if the developer has not built them yet (gcc is required)."""
    from streamledger.protocol.rabbitmq import _accel_build

    built = _accel_build.target()
    if not built.exists() or built.stat().st_mtime < _accel_build.SOURCE.stat().st_mtime:
        _accel_build.build(quiet=True)  # missing or older than its source: test what is in the tree
    from streamledger.protocol.rabbitmq import _accel, amqp

    _accel.configure(amqp.Symbol, amqp._ts, amqp._uuid_from_bytes, amqp.PROPERTY_FIELDS)
    return _accel
