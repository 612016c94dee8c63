"""Transforms given by import path in the tests (``tests.integration.batch.order_transforms:...``):
what a user's own module holds."""

from __future__ import annotations

from typing import Any


def paid_totals(records: Any) -> Any:
    """Orders paid, summed per currency (an aggregate: fewer rows out than records in)."""
    from pyspark.sql import functions as F

    return (records.where(F.col("status") == "paid")
            .groupBy("currency").agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("orders")))


def items(records: Any) -> Any:
    """One row per item of an order (explode: more rows out than records in)."""
    from pyspark.sql import functions as F

    return records.select("order_id", F.explode("items").alias("item"))
