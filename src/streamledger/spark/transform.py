"""The user's transform on Spark: one range's raw records in, typed rows (and dead letters) out.

The job lands a batch's raw records first (verified exactly as a raw pipeline's: counts, first and
last offsets, files), then runs :func:`transform_range` for each range on exactly those files, so a
retry runs the transform again on exactly the same records whatever the transform does. What the
user's code sees is the view ``records``: the source's columns, plus the decoded body's fields when
``body_format`` is ``json``. What it returns gets the lineage columns
(:data:`~streamledger.transform.LINEAGE_COLUMNS`) appended here, never by the user's code.

The view name is the user's (``FROM records``), so a temp view is registered under a lock held
until the range's write ends: Spark Connect resolves views when a plan runs, not when it is built.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from streamledger.transform import (
    BAD_RECORD_MARK,
    CORRUPT_COLUMN,
    DEAD_LETTER_DIR,
    LINEAGE_COLUMNS,
    Transform,
    TransformError,
    lineage_problem,
)

VIEW = "records"
_VIEW_LOCK = threading.RLock()


@dataclass(frozen=True, slots=True)
class RangeOutput:
    """What one range's transform wrote: ``rows`` into its directory, ``dead_letter`` records aside."""

    rows: int
    dead_letter: int


def decoded(df: Any, t: Transform) -> tuple[Any, Any | None]:
    """``df`` with the body's fields as columns (the view the user's code sees), and the records that
    did not decode (``on_bad_record="dead_letter"``; else None). ``fail`` raises inside the tasks,
    naming the stream and offset of the bad record (turned into one line by :func:`one_line`).
    The dead letters get a pass of their own (the body parsed again): a count observed during the
    rows' pass cannot decide it, since the user's code may never read ``records`` to the end
    (``LIMIT``, ``WHERE false``: Spark prunes the observed node) or at all."""
    if not t.decodes:
        return df, None
    from pyspark.sql import functions as F

    schema = f"{t.body_schema}, {CORRUPT_COLUMN} STRING"
    body = F.col("body").cast("string")
    parsed = F.from_json(body, schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN})
    # A body that is JSON but not an object (null, a number, an array) parses to NULL: also bad.
    bad = parsed.isNull() | parsed[CORRUPT_COLUMN].isNotNull()
    with_parsed = df.withColumn("__streamledger_parsed", parsed).withColumn("__streamledger_bad", bad)
    names = _field_names(with_parsed)
    taken = {c.lower() for c in df.columns}
    clash = [n for n in names if n.lower() in taken]
    if clash:
        raise TransformError(f"body_schema field(s) {', '.join(clash)} are also the source's column(s): "
                             "rename them in body_schema")
    is_bad = F.col("__streamledger_bad")
    dead = None
    kept: list[Any] = []  # beside the decoded fields: the body of a bad record, with "null"
    if t.on_bad_record == "fail":
        message = F.concat(F.lit(f"{BAD_RECORD_MARK} stream '"), F.col("stream"), F.lit("' offset "),
                           F.col("offset").cast("string"),
                           F.lit(": body is not a JSON object of body_schema"))
        good = with_parsed.where(~F.when(is_bad, F.raise_error(message)).otherwise(F.lit(False)))
    elif t.on_bad_record == "dead_letter":
        dead = with_parsed.where(is_bad).select(*df.columns)
        good = with_parsed.where(~is_bad)
    else:
        good = with_parsed
        kept = [F.when(is_bad, body).alias(CORRUPT_COLUMN)]
    decoded_fields = [F.col("__streamledger_parsed").getField(n).alias(n) for n in names]
    return good.select(*df.columns, *decoded_fields, *kept), dead


def _field_names(with_parsed: Any) -> list[str]:
    struct = with_parsed.schema["__streamledger_parsed"].dataType
    return [f.name for f in struct.fields if f.name != CORRUPT_COLUMN]


@contextmanager
def user_view(spark: Any, df: Any) -> Iterator[None]:
    """``df`` as the temp view ``records`` while the body runs (other jobs of the session wait)."""
    with _VIEW_LOCK:
        df.createOrReplaceTempView(VIEW)
        try:
            yield
        finally:
            spark.catalog.dropTempView(VIEW)


def as_query(sql: str) -> str:
    """The user's SQL as a subquery: only a query parses there, so a command (``INSERT OVERWRITE
    DIRECTORY``, ``CREATE TABLE``, ``DROP``...), which ``spark.sql`` would run at once, even when
    the batch only analyses it before the claim, is a syntax error instead, and so are several
    statements. The line ends keep a trailing ``--`` comment off the closing parenthesis."""
    body = sql.strip().rstrip(";").rstrip()
    return f"SELECT * FROM (\n{body}\n) AS streamledger_transform"


def apply_user(spark: Any, records: Any, t: Transform) -> Any:
    """The user's SQL or function over ``records`` (call inside :func:`user_view`)."""
    if t.sql is not None:
        return spark.sql(as_query(t.sql))
    if t.function is not None:
        out = t.load_function()(records)
        if not hasattr(out, "schema") or not hasattr(out, "write"):
            raise TransformError(f"transform {t.function_name} returned {type(out).__name__}, "
                                 "not a DataFrame")
        return out
    return records


def stamped(out: Any, stream: str, start: int, end: int) -> Any:
    """The transform's rows with the range they came from (the lineage columns, constant)."""
    from pyspark.sql import functions as F

    return out.select("*", F.lit(stream).alias(LINEAGE_COLUMNS[0]),
                      F.lit(start).cast("long").alias(LINEAGE_COLUMNS[1]),
                      F.lit(end).cast("long").alias(LINEAGE_COLUMNS[2]))


def output_schema(spark: Any, t: Transform, source_ddl: str, reserved: Sequence[str] = ()) -> Any:
    """The schema a transform writes, as pyarrow (lineage columns included), found by analysing it on an
    empty DataFrame of the source's columns: SQL that does not parse or names an unknown column, a
    function that does not import or fails, a schema that does not parse, a clash with the lineage
    columns: one-line :class:`TransformError`, before anything is claimed."""
    try:
        empty = spark.createDataFrame([], source_ddl)
        records, _dead = decoded(empty, t)
        with user_view(spark, records):  # Connect resolves the view when a plan is analysed: inside
            out = apply_user(spark, records, t)
            schema = out.schema  # analysed here (Connect: a round trip to the server)
            written = stamped(out, "", 0, 0).schema
    except TransformError:
        raise
    except Exception as exc:
        said = one_line(exc)
        if t.sql is not None and "Syntax error" in said:  # the subquery's lines: one more than the user's
            said = re.sub(r"\(line (\d+),", lambda m: f"(line {int(m.group(1)) - 1},", said)
            raise TransformError("the transform's sql is not one query that parses (SELECT ... FROM "
                                 f"records): {said} in {' '.join(t.sql.split())[:80]!r}") from None
        raise TransformError(f"the transform cannot run: {said}") from None
    problem = lineage_problem(list(schema.names), tuple(reserved))
    if problem is not None:
        raise TransformError(problem)
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(written, timezone="UTC")  # Parquet TIMESTAMP_MICROS, UTC-adjusted
    except Exception as exc:  # a type Arrow cannot hold (e.g. a user-defined type)
        raise TransformError(f"the transform's output cannot be written as Parquet: "
                             f"{one_line(exc)}") from None


@contextmanager
def spark_writes(spark: Any, out_dir: str) -> Iterator[tuple[str, str]]:
    """Where Spark's writer writes a range's rows and dead letters: ``out_dir`` itself when the
    session reaches it (a local path, or a URI its Hadoop connectors serve), else a local directory
    whose files are copied to ``out_dir`` through ``pyarrow.fs`` afterwards (``s3://`` on a session
    without the Hadoop S3 connector, as the raw landing's Arrow writer reaches it)."""
    from streamledger import fs
    from streamledger.spark.fs import for_session

    if not fs.scheme(out_dir) or not isinstance(for_session(spark, out_dir), fs.ArrowFS):
        yield out_dir, fs.join(out_dir, DEAD_LETTER_DIR)
        return
    import shutil
    import tempfile
    from pathlib import Path

    local = Path(tempfile.mkdtemp(prefix="streamledger-transform-"))
    try:
        yield str(local / "rows"), str(local / "rows" / DEAD_LETTER_DIR)
        store = fs.ArrowFS()
        store.delete(out_dir)
        for path in sorted(p for p in (local / "rows").rglob("*") if p.is_file()):
            store.write_bytes(fs.join(out_dir, str(path.relative_to(local / "rows"))), path.read_bytes())
    finally:
        shutil.rmtree(local, ignore_errors=True)


def transform_range(spark: Any, t: Transform, *, raw_files: Sequence[str], source_ddl: str, stream: str,
                    start: int, end: int, out_dir: str, fmt: str) -> RangeOutput:
    """Run ``t`` on one range's raw files; write its rows (lineage stamped) to
    ``out_dir`` and the records that did not decode to its ``_dead_letter`` directory. The counts are
    observed on the rows as they are
    written (the write's own stage), not counted again."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    # Timestamps as the Parquet standard's TIMESTAMP_MICROS, not Spark's legacy INT96: the table sinks
    # add these files to Iceberg / Delta tables as they are, and Iceberg has no INT96.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    # Spark's JSON optimizer splits one from_json into one per field read (measured: 4 parses of every
    # body for a 5-field schema, 2.4x the time); the body is parsed once per pass without it.
    spark.conf.set("spark.sql.optimizer.enableJsonExpressionOptimization", "false")
    raw = (spark.read.schema(source_ddl).parquet(*raw_files) if raw_files
           else spark.createDataFrame([], source_ddl))
    records, dead = decoded(raw, t)
    rows_seen = Observation(f"streamledger_rows_{uuid.uuid4().hex}")
    try:
        with user_view(spark, records), spark_writes(spark, out_dir) as (where, dead_where):
            out = stamped(apply_user(spark, records, t), stream, start, end)
            counted = out.observe(rows_seen, F.count(F.lit(1)).alias("rows"))
            counted.write.mode("overwrite").format(fmt).save(where)
            dead_count = 0
            if dead is not None:
                dead_seen = Observation(f"streamledger_dead_{uuid.uuid4().hex}")
                dead.observe(dead_seen, F.count(F.lit(1)).alias("rows")).write.mode("overwrite").parquet(
                    dead_where)
                dead_count = int(dead_seen.get["rows"])
    except TransformError:
        raise
    except Exception as exc:
        said = one_line(exc)
        if said.startswith(BAD_RECORD_MARK):  # it names the stream and offset itself
            raise TransformError(said[len(BAD_RECORD_MARK):].strip() + " (on_bad_record 'fail')") from None
        raise TransformError(f"stream {stream!r} range [{start}, {end}): the transform failed: "
                             f"{said}") from None
    return RangeOutput(rows=int(rows_seen.get["rows"]), dead_letter=dead_count)


_MARKED = re.compile(re.escape(BAD_RECORD_MARK) + r"[^\n\r\"]*")
_SPARK_CLASS = re.compile(r"^\[[A-Z_.]+\]\s*")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+")


def one_line(exc: BaseException) -> str:
    """A Spark failure as one line: a bad record's own message when one is inside, else the first
    line of the error without its JVM stack."""
    text = str(exc)
    found = _MARKED.search(text)
    if found:
        return _SQLSTATE.sub("", found.group(0)).strip().rstrip(".")
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return _SQLSTATE.sub("", _SPARK_CLASS.sub("", first))[:300]
