"""Spark's automatic data-source lookup imports top-level ``pyspark_*`` modules that define
``DefaultSource``; this shim points it at the ``mewbase`` source
(:mod:`streamledger.spark.mewbase_source`)."""

from streamledger.spark.mewbase_source import MewbaseDataSource as DefaultSource

__all__ = ["DefaultSource"]
