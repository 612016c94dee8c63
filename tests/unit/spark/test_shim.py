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


def test_local_spark_without_jars_is_one_line(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A venv with only ``pyspark-client`` (the ``[airflow]`` extra) has no jars: local Spark is refused
    in one line naming the extra, before pyspark's SPARK_HOME search."""
    import pyspark
    import pytest

    from streamledger.spark.session import LocalSparkUnavailable, build_session

    (tmp_path / "pyspark").mkdir()
    monkeypatch.setattr(pyspark, "__file__", str(tmp_path / "pyspark" / "__init__.py"))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    with pytest.raises(LocalSparkUnavailable, match=r"streamledger\[spark\]") as err:
        build_session()
    assert "\n" not in str(err.value)
