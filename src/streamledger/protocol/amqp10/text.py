"""An AMQP value as text: the one spelling shared by the Spark columns, the CLI's JSON and filter values.

It lives with the codec, below every user, so that the publisher's filter values and the reader's
``filter_value`` column are the same text by construction.
"""

from __future__ import annotations

import base64
import datetime as _dt
import uuid
from typing import Any


def stringify(value: Any) -> str | None:
    """One AMQP value as the string stored in a ``MAP<STRING,STRING>`` cell.

    Text stays text; binary is UTF-8 when it decodes, else ``base64:<b64>`` so that no byte is lost;
    timestamps become ISO-8601 UTC; booleans are ``true``/``false`` like Spark prints them.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode("ascii")
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        return str(value.astimezone(_dt.UTC).isoformat())
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)
