"""How a table sink compares a table's column types with what the job (or its transform) writes
(``sinks._kind``): widths of strings, binaries and lists and nested nullability aside (pyiceberg reads
a table back as ``large_list``/``large_string``, Spark writes ``list``/``string``), what a nested
type holds compared all the way down, so a changed element type is refused before the claim (a
table library would otherwise refuse the files only at the publish, after the commit)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamledger.batch.sinks import transform_schema_problem
from streamledger.transform import LINEAGE_COLUMNS


def table(*fields: pa.Field) -> pa.Schema:
    """A transform's table as pyiceberg reads it back (lineage columns, then the transform's)."""
    lineage = [pa.field(n, pa.large_string() if i == 0 else pa.int64())
               for i, n in enumerate(LINEAGE_COLUMNS)]
    return pa.schema([*lineage, *fields])


def writes(*fields: pa.Field) -> pa.Schema:
    lineage = [pa.field(n, pa.string() if i == 0 else pa.int64()) for i, n in enumerate(LINEAGE_COLUMNS)]
    return pa.schema([*lineage, *fields])


def test_a_map_read_back_in_large_widths_takes_the_same_map_again() -> None:
    element = pa.field("e", pa.int64(), False)
    have = table(pa.field("by", pa.map_(pa.large_string(), pa.large_list(element))))
    same = writes(pa.field("by", pa.map_(pa.string(), pa.list_(pa.int64()))))
    assert transform_schema_problem(have, same) is None


@pytest.mark.parametrize("now", [pa.map_(pa.string(), pa.list_(pa.string())),
                                 pa.map_(pa.int64(), pa.list_(pa.int64())),
                                 pa.map_(pa.string(), pa.int64())],
                         ids=["value-element", "key", "value"])
def test_a_map_whose_key_or_value_type_changes_is_refused(now: pa.DataType) -> None:
    have = table(pa.field("by", pa.map_(pa.large_string(), pa.large_list(pa.int64()))))
    problem = transform_schema_problem(have, writes(pa.field("by", now)))
    assert problem is not None and "by is map<" in problem, problem


def test_a_changed_map_inside_a_list_or_struct_is_refused() -> None:
    have = table(pa.field("xs", pa.large_list(pa.map_(pa.large_string(), pa.int64()))),
                 pa.field("st", pa.struct([pa.field("m", pa.map_(pa.large_string(), pa.int64()))])))
    problem = transform_schema_problem(have, writes(
        pa.field("xs", pa.list_(pa.map_(pa.string(), pa.string()))),
        pa.field("st", pa.struct([pa.field("m", pa.map_(pa.string(), pa.string()))]))))
    assert problem is not None and "xs is" in problem and "st is" in problem, problem


def test_a_type_changed_inside_a_struct_is_refused_and_its_nullability_is_not() -> None:
    have = table(pa.field("st", pa.struct([pa.field("a", pa.int64(), False),
                                           pa.field("s", pa.large_string())])))
    same = writes(pa.field("st", pa.struct([pa.field("a", pa.int64()), pa.field("s", pa.string())])))
    assert transform_schema_problem(have, same) is None
    changed = writes(pa.field("st", pa.struct([pa.field("a", pa.string()), pa.field("s", pa.string())])))
    problem = transform_schema_problem(have, changed)
    assert problem is not None and "st is struct<a: integer" in problem, problem


def test_a_decimal_whose_precision_or_scale_changes_is_refused() -> None:
    have = table(pa.field("amount", pa.decimal128(10, 2)))
    assert transform_schema_problem(have, writes(pa.field("amount", pa.decimal128(10, 2)))) is None
    for now in (pa.decimal128(12, 2), pa.decimal128(10, 3)):
        assert transform_schema_problem(have, writes(pa.field("amount", now))) is not None, now


def test_narrower_integers_than_the_table_holds_are_taken() -> None:
    """pyiceberg's add_files takes int32 files into a long column (read back as int64)."""
    have = table(pa.field("n", pa.int64()))
    assert transform_schema_problem(have, writes(pa.field("n", pa.int32()))) is None


def test_wider_integers_than_the_table_holds_are_refused_before_the_claim() -> None:
    have = table(pa.field("n", pa.int32()))
    assert transform_schema_problem(have, writes(pa.field("n", pa.int64()))) is not None


@pytest.mark.parametrize(("was", "now"), [(pa.timestamp("us", tz="UTC"), pa.timestamp("us")),
                                          (pa.timestamp("us"), pa.timestamp("us", tz="UTC"))],
                         ids=["loses-zone", "gains-zone"])
def test_a_timestamp_that_gains_or_loses_its_time_zone_is_refused_before_the_claim(
        was: pa.DataType, now: pa.DataType) -> None:
    assert transform_schema_problem(table(pa.field("at", was)), writes(pa.field("at", now))) is not None
