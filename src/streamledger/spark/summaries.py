"""Slice summaries: what a read task handed Spark, per log, as rows Spark carries to the job's metrics.

With option ``sliceSummaries`` (the job sets it; readers of the data never should), a task yields,
after its records, one *summary row* per log it read records of: ``offset`` = :data:`SUMMARY_OFFSET`
(no record has a negative offset), ``stream`` = the log, ``body`` = ``b"records,first,last"``, the
other columns null. The job observes them with a fixed number of aggregates (a ``collect_list`` of the
summary rows, a count of the record rows) and filters them out before the write
(:func:`streamledger.spark.job._observe_written`).

Why not one ``count``/``min``/``max`` per log in the observation: that was 3 aggregates per log, all
evaluated on every row and compiled into one generated class (301 at 100 partitions: ~1 s to compile
in a fresh JVM, ~0.6 s of driver-side building per job), a cost growing with the partition count for
any amount of data. The summaries are computed from the Arrow batches the task already holds
(``pyarrow.compute.min_max`` per batch). They come from the attempts Spark accepted, like any observed
metric, and the job checks that their record counts add up to the record rows Spark counted on the
way to the writer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamledger.errors import StreamledgerError

#: The ``offset`` of a summary row; a record's offset is never negative.
SUMMARY_OFFSET = -1


class SummaryError(StreamledgerError):
    """A task's batches cannot be summarized (a reader bug: a batch mixing logs)."""


def with_summaries(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` unchanged, then one batch of summary rows (one per log that had records)."""
    seen: dict[str, list[int]] = {}  # log -> [records, first, last], in the order first seen
    schema = None
    for batch in batches:
        if batch.num_rows:
            schema = batch.schema
            logs, bounds = batch.column("stream"), pc.min_max(batch.column("offset"))
            # A batch holds one log's records (one slice is read into its own batches).
            stream, lo, hi = logs[0].as_py(), bounds["min"].as_py(), bounds["max"].as_py()
            if batch.num_rows > 1 and not pc.all(pc.equal(logs, stream)).as_py():
                raise SummaryError(f"a batch of stream {stream!r} also holds records of other logs; "
                                   "slice summaries need one log per batch")
            got = seen.get(stream)
            if got is None:
                seen[stream] = [batch.num_rows, lo, hi]
            else:
                got[0] += batch.num_rows
                got[1], got[2] = min(got[1], lo), max(got[2], hi)
        yield batch
    if schema is None:
        return
    columns: list[Any] = []
    n = len(seen)
    for f in schema:
        if f.name == "stream":
            columns.append(pa.array(list(seen), f.type))
        elif f.name == "offset":
            columns.append(pa.array([SUMMARY_OFFSET] * n, f.type))
        elif f.name == "body":
            columns.append(pa.array([encode(*v) for v in seen.values()], f.type))
        else:
            columns.append(pa.nulls(n, f.type))
    yield pa.RecordBatch.from_arrays(columns, schema=schema)


def encode(records: int, first: int, last: int) -> bytes:
    return f"{records},{first},{last}".encode("ascii")


def decode(body: bytes | bytearray) -> tuple[int, int, int]:
    """``(records, first, last)`` of a summary row's body."""
    records, first, last = (int(x) for x in bytes(body).decode("ascii").split(","))
    return records, first, last
