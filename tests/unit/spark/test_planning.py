"""Option parsing and range splitting: the pure half of planning."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamledger.spark.datasource import ReadOptions, StreamSlice, slices_for
from streamledger.spark.planning import (
    OffsetBound,
    PlannedRange,
    PlanningError,
    parse_bool,
    parse_bound,
    parse_bounds,
    parse_ranges,
    parse_stream_list,
    split_range,
)


@pytest.mark.parametrize(
    ("value", "bound"),
    [
        ("earliest", OffsetBound.earliest()),
        ("LATEST", OffsetBound.latest()),
        ("42", OffsetBound.offset(42)),
        (7, OffsetBound.offset(7)),
        ('{"timestamp": 1700000000000}', OffsetBound.timestamp(1_700_000_000_000)),
        ({"offset": 3}, OffsetBound.offset(3)),
    ],
)
def test_parse_bound(value: object, bound: OffsetBound) -> None:
    assert parse_bound(value, what="x") == bound


@pytest.mark.parametrize("value", ["-1", "soon", "{}", '{"timestamp": "x"}', True, "{bad"])
def test_parse_bound_rejects(value: object) -> None:
    with pytest.raises(PlanningError, match="startingOffsets"):
        parse_bound(value, what="startingOffsets")


def test_parse_bounds_global_and_per_stream() -> None:
    streams = ["a", "b"]
    assert parse_bounds(None, streams, default=OffsetBound.latest(), what="e") == {
        "a": OffsetBound.latest(),
        "b": OffsetBound.latest(),
    }
    assert parse_bounds('{"timestamp": 5}', streams, default=OffsetBound.latest(), what="e") == {
        "a": OffsetBound.timestamp(5),
        "b": OffsetBound.timestamp(5),
    }
    assert parse_bounds('{"a": 10, "b": "earliest"}', streams, default=OffsetBound.latest(), what="e") == {
        "a": OffsetBound.offset(10),
        "b": OffsetBound.earliest(),
    }
    assert parse_bounds('{"a": {"timestamp": 9}}', streams, default=OffsetBound.latest(), what="e") == {
        "a": OffsetBound.timestamp(9),
        "b": OffsetBound.latest(),
    }
    with pytest.raises(PlanningError, match=r"unknown stream\(s\) \['c'\]"):
        parse_bounds('{"c": 1}', streams, default=OffsetBound.latest(), what="e")


def test_parse_ranges() -> None:
    assert parse_ranges('{"s": [0, 10], "t": [5, 5]}') == {"s": (0, 10), "t": (5, 5)}
    for bad, msg in [
        ('{"s": [10, 0]}', "start 10 is after end 0"),
        ('{"s": [1]}', "expected \\[start, end\\]"),
        ("{}", "non-empty"),
        ('{"s": [0, -2]}', ">= 0"),
        ("[", "not valid JSON"),
    ]:
        with pytest.raises(PlanningError, match=msg):
            parse_ranges(bad)


def test_small_parsers() -> None:
    assert parse_stream_list(" a, b,,a ,c") == ["a", "b", "c"]
    assert parse_bool("TRUE", what="f", default=False) is True
    assert parse_bool(None, what="f", default=True) is True
    with pytest.raises(PlanningError, match="failOnDataLoss"):
        parse_bool("maybe", what="failOnDataLoss", default=True)


def test_split_range_examples() -> None:
    assert split_range(0, 10) == [(0, 10)]
    assert split_range(0, 10, parts=3) == [(0, 4), (4, 7), (7, 10)]
    assert split_range(5, 12, max_records=3) == [(5, 8), (8, 11), (11, 12)]
    assert split_range(0, 10, parts=2, max_records=3) == [(0, 3), (3, 5), (5, 8), (8, 10)]
    assert split_range(7, 7, parts=4) == []
    assert split_range(0, 2, parts=5) == [(0, 1), (1, 2)]


@given(
    start=st.integers(0, 10_000),
    width=st.integers(0, 5_000),
    parts=st.none() | st.integers(1, 64),
    max_records=st.none() | st.integers(1, 6_000),
)
def test_slices_tile_the_range_exactly(
    start: int, width: int, parts: int | None, max_records: int | None
) -> None:
    end = start + width
    slices = split_range(start, end, max_records=max_records, parts=parts)
    covered = [o for a, b in slices for o in range(a, b)]
    assert covered == list(range(start, end))  # contiguous, no overlap, no gap
    assert all(a < b for a, b in slices)
    if max_records is not None:
        assert all(b - a <= max_records for a, b in slices)
    if parts is not None and max_records is None and width:
        assert len(slices) == min(parts, width)
        assert max(b - a for a, b in slices) - min(b - a for a, b in slices) <= 1


def test_planned_range_lost_span() -> None:
    assert PlannedRange("s", 100, 200, 40).lost == (40, 100)
    assert PlannedRange("s", 40, 200, 40).lost is None
    assert PlannedRange("s", 50, 50, 10).empty


def test_read_options_validation() -> None:
    ok = ReadOptions.parse(
        {"url": "rabbitmq-stream://h:5552/", "superStream": "x", "maxRecordsPerPartition": "5"}
    )
    assert ok.super_stream == "x" and ok.max_records_per_partition == 5 and ok.fail_on_data_loss
    assert ok.read_from == "replica"
    assert ReadOptions.parse({"url": "u", "stream": "a", "readFrom": "URL"}).read_from == "url"
    secret = ReadOptions.parse({"url": "rabbitmq-stream://u:s3cret@h:5552/", "stream": "a"})
    assert "s3cret" not in repr(secret)
    bad = [
        ({"stream": "a"}, "'url' is required"),
        ({"url": "u"}, "give 'stream', 'superStream' or 'ranges'"),
        ({"url": "u", "stream": "a", "superStream": "b"}, "not both"),
        ({"url": "u", "ranges": '{"a": [0, 1]}', "startingOffsets": "earliest"}, "fixes both ends"),
        ({"url": "u", "stream": "a", "decode": "json"}, "amqp or raw"),
        ({"url": "u", "stream": "a", "ranges": '{"a": [0, 1]}'}, "names its streams"),
        ({"url": "u", "stream": "a", "maxRecordsPerPartition": "0"}, "positive integer"),
        ({"url": "u", "stream": "a", "readFrom": "nearest"}, "'readFrom' must be replica, leader or url"),
    ]
    for opts, msg in bad:
        with pytest.raises(PlanningError, match=msg):
            ReadOptions.parse(opts)


def test_slices_for_skips_empty_ranges() -> None:
    opts = ReadOptions.parse({"url": "u", "stream": "a", "maxRecordsPerPartition": "4"})
    planned = [PlannedRange("a", 0, 10, 0), PlannedRange("b", 3, 3, 3)]
    expected = [StreamSlice("a", 0, 4), StreamSlice("a", 4, 8), StreamSlice("a", 8, 10)]
    assert slices_for(planned, opts) == expected


def test_small_slices_share_tasks_and_large_ones_keep_their_own() -> None:
    from streamledger.spark.datasource import SliceGroup, pack

    small = [StreamSlice(f"s-{i}", 0, 10) for i in range(25)]
    big = StreamSlice("big", 0, 1_000)
    parts = pack([*small[:10], big, *small[10:]], 100)
    assert [type(p).__name__ for p in parts] == ["SliceGroup", "StreamSlice", "SliceGroup", "SliceGroup"]
    flat = [s for p in parts for s in (p.slices if isinstance(p, SliceGroup) else [p])]
    assert flat == [*small[:10], big, *small[10:]]  # every slice once, in order
    assert all(sum(s.end - s.start for s in p.slices) <= 100 for p in parts if isinstance(p, SliceGroup))
    assert pack(small, 0) == small  # packOffsets=0: a task each
    split = [StreamSlice("a", 0, 4), StreamSlice("a", 4, 8)]
    assert pack([*split, *small[:2]], 100)[:2] == split  # a range the caller split keeps a task per piece
    assert pack(small[:1], 100) == small[:1]
    opts = ReadOptions.parse({"url": "rabbitmq-stream://h:5552/", "stream": "a", "packOffsets": "0"})
    assert opts.pack_offsets == 0


def test_small_slices_spread_over_at_least_the_tasks_asked_for() -> None:
    """The job's Arrow writer asks for two tasks per core: 1,000 ranges of 10 records make about
    that many tasks, not one; a few small ranges keep a task each; large ones are untouched."""
    from streamledger.spark.datasource import SliceGroup, pack

    many = [StreamSlice(f"s-{i}", 0, 10) for i in range(1_000)]
    parts = pack(many, 100_000, tasks=4)
    assert len(parts) == 4 and all(len(p.slices) == 250 for p in parts if isinstance(p, SliceGroup))
    assert [s for p in parts for s in p.slices] == many  # type: ignore[attr-defined]
    assert pack(many[:3], 100_000, tasks=4) == many[:3]
    assert len(pack(many, 100_000)) == 1  # no spread asked: one group up to the width
    big = [StreamSlice("a", 0, 500_000), StreamSlice("b", 0, 500_000)]
    assert pack([*big, *many[:8]], 100_000, tasks=4)[:2] == big
    assert len(pack([*big, *many[:8]], 100_000, tasks=4)) == 2 + 4
