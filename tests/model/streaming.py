"""The model's ledger-recorded streaming query, as docs/spark.md shows it: one definition for the
query run in the checker's own Spark session and for the one a child process runs to be SIGKILLed
mid-batch (``python -m tests.model.child``).

Its rows go to a sink of the pipeline's kind, each idempotent by micro-batch id as a streaming sink
must be (the source does not make a sink exactly once, docs/spark.md): a directory pipeline's
query writes Parquet per micro-batch (``out/b<id>``, overwritten on a replay); a Delta one appends
to a Delta table of its own with the micro-batch id as the table's application transaction
(``deltalake``); an Iceberg one appends to an Iceberg table of its own in the pipeline's catalog,
each snapshot naming the micro-batch it holds (``pyiceberg``). A reader of the pipeline's outputs
(:mod:`tests.model.oracle`) reads them all back.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

#: The snapshot property of the query's Iceberg table naming the micro-batch a snapshot holds.
BATCH_PROPERTY = "model.micro-batch"
#: The namespace of the queries' Iceberg tables in a pipeline's catalog.
NAMESPACE = "model_streaming"


@dataclass(frozen=True)
class QueryJob:
    """Everything one run of a query needs (JSON across the child's stdin: URLs may hold passwords)."""

    url: str
    stream: str
    ledger_url: str = field(repr=False)
    pipeline: str
    root: str  # the pipeline's output root: ``ledgerOutput``
    where: str  # the query's own directory: ``checkpoint/``, its rows
    sink: Literal["directory", "iceberg", "delta"]
    table: str  # the query's Iceberg table name (``<namespace>.<name>``); unused by the others
    catalog: Mapping[str, str] = field(default_factory=dict, repr=False)
    max_offsets: int | None = None
    fail_on_data_loss: bool = True
    earliest: bool = False  # a new query of a pipeline without history: from the first offset
    fail_at: int | None = None  # the query raises before writing its micro-batch number ``fail_at``
    #: the process SIGKILLs itself (and its Spark) at its micro-batch number ``kill_at``, before or after
    #: writing its rows: planned and claimed, not committed
    kill_at: int | None = None
    kill_when: Literal["before_write", "after_write"] = "after_write"

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "catalog": dict(self.catalog)}


def write_rows(job: QueryJob, rows: Any, batch_id: int) -> None:
    """Write one micro-batch's rows (``stream``, ``offset``, ``body``) to the query's sink, once."""
    where = Path(job.where)
    if job.sink == "directory":
        rows.write.mode("overwrite").parquet(str(where / "out" / f"b{batch_id:05d}"))
        return
    data = rows.toArrow()
    if job.sink == "delta":
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        path, app = where / "delta", f"model-{where.name}"
        done = DeltaTable(str(path)).transaction_version(app) if (path / "_delta_log").exists() else None
        if done is not None and done >= batch_id:
            return  # a replayed micro-batch the table holds already
        write_deltalake(str(path), data, mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(app, batch_id)]))
        return
    from streamledger.batch.sinks.iceberg import load_catalog

    cat = load_catalog(job.catalog)
    cat.create_namespace_if_not_exists(NAMESPACE)
    table = cat.create_table_if_not_exists(job.table, schema=data.schema,
                                           location=(where / "iceberg").resolve().as_uri())
    if any(s.summary is not None and s.summary.additional_properties.get(BATCH_PROPERTY) == str(batch_id)
           for s in table.snapshots()):
        return
    table.append(data, snapshot_properties={BATCH_PROPERTY: str(batch_id)})


def run_query(spark: Any, job: QueryJob, timeout_s: float = 300.0) -> str | None:
    """Run the query to the end of an available-now trigger; None, or why it failed (its text)."""
    reader = (spark.readStream.format("rabbitmq_stream").option("url", job.url).option("stream", job.stream)
              .option("ledger", job.ledger_url).option("pipeline", job.pipeline)
              .option("ledgerOutput", job.root)
              .option("failOnDataLoss", str(job.fail_on_data_loss).lower()))
    if job.max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", job.max_offsets)
    if job.earliest:
        reader = reader.option("startingOffsets", "earliest")
    run = [0]

    def each(df: Any, batch_id: int) -> None:  # in the driver's Python (py4j), one batch at a time
        if job.fail_at is not None and run[0] >= job.fail_at:
            raise RuntimeError(f"model: query dies before writing micro-batch {batch_id}")
        killing = job.kill_at is not None and run[0] >= job.kill_at
        run[0] += 1
        if killing and job.kill_when == "before_write":
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the driver and its JVM, mid-batch
        write_rows(job, df.select("stream", "offset", "body"), batch_id)
        if killing:
            os.killpg(os.getpgrp(), signal.SIGKILL)

    checkpoint = str(Path(job.where) / "checkpoint")
    q = (reader.load().writeStream.foreachBatch(each).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    try:
        q.awaitTermination(timeout_s)
    except Exception as exc:
        return str(exc)
    if q.isActive:
        q.stop()
        return f"did not end within {timeout_s:.0f} s"
    return None if q.exception() is None else str(q.exception())
