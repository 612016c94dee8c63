"""Spark's automatic data-source lookup imports top-level ``pyspark_*`` modules that define
``DefaultSource``; this shim points it at :mod:`streamledger.spark.datasource`."""

from streamledger.spark.datasource import RabbitMQStreamDataSource as DefaultSource

__all__ = ["DefaultSource"]
