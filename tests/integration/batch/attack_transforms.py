"""Transforms used by the red-team tests (``tests.integration.batch.attack_transforms:...``)."""

from __future__ import annotations

from typing import Any

FACTOR = 2
"""A module constant the function below reads: its source does not change when this does."""


def scaled(records: Any) -> Any:
    """Each order's amount times :data:`FACTOR`."""
    from pyspark.sql import functions as F

    return records.select("order_id", (F.col("amount") * F.lit(FACTOR)).alias("scaled"))


def other_session(records: Any) -> Any:
    """Rows that do not come from ``records`` at all: a DataFrame of another session."""
    other = records.sparkSession.newSession()
    return other.createDataFrame([("planted", 1)], "order_id STRING, n INT")
