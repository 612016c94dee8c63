"""The task's Arrow path without Spark: ``read_slice`` fills only the map columns that were asked for."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from streamledger.spark.datasource import ReadOptions, StreamSlice, read_slice
from streamledger.spark.planning import PlanningError
from tests.integration.spark.helpers import body, create_stream

pytestmark = pytest.mark.rabbitmq


def read(url: str, stream: str, end: int, **options: str) -> pa.Table:
    opts = ReadOptions.parse({"url": url, "stream": stream, **options})
    return pa.Table.from_batches(list(read_slice(opts, StreamSlice(stream, 0, end))))


def test_properties_option_fills_only_the_asked_map_columns(rabbitmq_url: str, stream_name: Any) -> None:
    s = stream_name("props")
    create_stream(rabbitmq_url, s, 300)
    full = read(rabbitmq_url, s, 300)
    none = read(rabbitmq_url, s, 300, properties="none")
    app = read(rabbitmq_url, s, 300, properties="application_properties")
    for table in (full, none, app):
        assert table.column("offset").to_pylist() == list(range(300))
        assert table.column("body").to_pylist() == [body(s, i) for i in range(300)]
    assert full.column("application_properties").to_pylist()[0] == [("source", "spark-tests")]
    wanted = full.column("application_properties").to_pylist()
    assert app.column("application_properties").to_pylist() == wanted
    for name in ("properties", "application_properties", "message_annotations"):
        assert none.column(name).null_count == 300
    assert app.column("message_annotations").null_count == 300
    assert none.schema == full.schema


def test_properties_option_rejects_unknown_columns() -> None:
    with pytest.raises(PlanningError, match="unknown columns \\['headers'\\]"):
        ReadOptions.parse({"url": "rabbitmq-stream://h/", "stream": "s", "properties": "headers"})
