"""Spark session helpers: the environment a local or submitted job needs to find its Python workers.

Two settings decide whether a PySpark job works on this kind of host at all (both measured, see
the toolchain recipe): ``PYSPARK_PYTHON`` must name the interpreter that has streamledger and pyarrow
installed (else the workers die with a bare ``EOFException``), and ``SPARK_LOCAL_IP`` pins Spark to
loopback. :func:`spark_environment` fills in both when the caller has not.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamledger.errors import StreamledgerError

DEFAULT_MASTER = "local[2]"

#: JVM flags that trade peak JIT speed for start-up: C1 only and the serial collector. Measured on the
#: 2-core VM (alternating runs, load ~5): session start 26-30 s -> 13-14 s and the first data-source
#: call 15-22 s -> 15-16 s, but a warm 1M-message Parquet read 8.6 s -> 13.6 s. Worth it for short
#: bounded reads in a fresh process; not for long ones or a long-lived session.
QUICK_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_environment() -> dict[str, str]:
    """Set (if unset) and return the environment variables Spark's Python workers rely on."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return {k: os.environ[k] for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON")}


class LocalSparkUnavailable(StreamledgerError):
    """This environment has the Spark Connect client only (``pyspark-client``), no Spark to run."""


def _require_local_spark() -> None:
    """One line instead of pyspark's "Could not find valid SPARK_HOME": the ``[airflow]`` extra alone
    brings ``pyspark-client`` (a Connect client without Spark's jars)."""
    if os.environ.get("SPARK_HOME"):
        return
    import pyspark

    if not (Path(pyspark.__file__).parent / "jars").is_dir():
        raise LocalSparkUnavailable(
            "local Spark needs the full pyspark: pip install 'streamledger[spark]' (this environment "
            "has only the Spark Connect client), or run on a Connect server (--remote, "
            "spark_connect_conn_id)"
        )


def build_session(
    *,
    master: str | None = DEFAULT_MASTER,
    app_name: str = "streamledger",
    conf: Mapping[str, Any] | None = None,
    register: bool = True,
    quick_start: bool = False,
) -> Any:
    """A ``SparkSession`` with the UI off and the ``rabbitmq_stream`` and ``mewbase`` sources registered.

    ``master=None`` leaves the master to spark-submit (``--master``). ``quick_start`` applies
    :data:`QUICK_START_JAVA_OPTIONS` to the driver JVM (only effective when this call starts the JVM).
    """
    spark_environment()
    _require_local_spark()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).config("spark.ui.enabled", "false")
    if quick_start:
        builder = builder.config("spark.driver.extraJavaOptions", QUICK_START_JAVA_OPTIONS)
    if master:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    if register:
        register_source(spark)
    return spark


def register_source(spark: Any) -> None:
    """Register the data sources (``rabbitmq_stream``, ``mewbase``) explicitly; works whenever the
    workers can import streamledger. The mewbase client is imported only when a read is planned."""
    from streamledger.spark.datasource import RabbitMQStreamDataSource
    from streamledger.spark.mewbase_source import MewbaseDataSource

    spark.dataSource.register(RabbitMQStreamDataSource)
    spark.dataSource.register(MewbaseDataSource)


#: Task slots assumed where a session cannot tell (a Connect client of a cluster whose master
#: and default parallelism it cannot read): enough tasks to keep a small cluster busy.
FALLBACK_PARALLELISM = 8


def parallelism(spark: Any) -> int:
    """How many tasks the session runs at once: the classic context's default parallelism, else
    ``spark.default.parallelism`` or a ``local[N]`` master read from the conf (a Connect session has
    no context), else :data:`FALLBACK_PARALLELISM`."""
    context = None
    with contextlib.suppress(Exception):  # pyspark's errors vary by mode and version
        context = spark.sparkContext  # a Connect session raises here
    if context is not None:
        return max(1, int(context.defaultParallelism))
    conf: dict[str, str] = {}
    with contextlib.suppress(Exception):  # pyspark's errors vary by mode and version
        conf = dict(spark.conf.getAll)  # one round trip to a Connect server, not one per key
    with contextlib.suppress(Exception):
        given = conf.get("spark.default.parallelism")
        if given:
            return max(1, int(given))
    with contextlib.suppress(Exception):
        master = (conf.get("spark.master") or "").strip()
        if master.startswith("local"):
            inner = master[master.find("[") + 1:master.find("]")] if "[" in master else "1"
            count = inner.split(",")[0].strip()
            return max(1, os.cpu_count() or 1) if count == "*" else max(1, int(count))
    return FALLBACK_PARALLELISM
