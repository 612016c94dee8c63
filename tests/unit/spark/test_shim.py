"""Spark's automatic lookup imports top-level ``pyspark_*`` modules and registers their ``DefaultSource``."""

from __future__ import annotations

import importlib

from pyspark.sql.datasource import DataSource

from streamledger.spark.datasource import RabbitMQStreamDataSource


def test_shim_exposes_the_data_source() -> None:
    shim = importlib.import_module("pyspark_streamledger")
    assert shim.DefaultSource is RabbitMQStreamDataSource
    assert issubclass(shim.DefaultSource, DataSource)
    assert shim.DefaultSource.name() == "rabbitmq_stream"


def test_class_docstring_names_options() -> None:
    doc = RabbitMQStreamDataSource.__doc__ or ""
    for option in ("url", "superStream", "ranges", "startingOffsets", "endingOffsets",
                   "maxRecordsPerPartition", "failOnDataLoss", "decode"):
        assert f"``{option}``" in doc, option
