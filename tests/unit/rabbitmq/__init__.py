"""Unit tests of the RabbitMQ Streams data-plane codecs (no broker needed)."""

from __future__ import annotations

from typing import Any


def load_accel() -> Any:
    """The compiled loops, built here if the developer has not built them yet (gcc is required)."""
    try:
        from streamledger.protocol.rabbitmq import _accel
    except ImportError:
        from streamledger.protocol.rabbitmq import _accel_build

        _accel_build.build(quiet=True)
        from streamledger.protocol.rabbitmq import _accel
    from streamledger.protocol.rabbitmq import amqp

    _accel.configure(amqp.Symbol, amqp._ts, amqp._uuid_from_bytes, amqp.PROPERTY_FIELDS)
    return _accel
