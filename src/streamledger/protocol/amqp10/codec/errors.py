"""Errors of the AMQP 1.0 type codec (no dependency on any protocol client)."""

from __future__ import annotations

from streamledger.errors import StreamledgerError


class AmqpDecodeError(StreamledgerError, ValueError):
    """Bytes are not a valid AMQP 1.0 value or message."""
