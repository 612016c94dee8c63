"""The log-neutral vocabulary (issue 20, item 5): both protocol packages satisfy it."""

from __future__ import annotations

import time

import pytest

from streamledger import offsets
from streamledger.protocol import mewbase, rabbitmq


def test_protocol_names_are_the_neutral_ones() -> None:
    spec = rabbitmq.OffsetSpec.timestamp(5)
    assert isinstance(spec, offsets.OffsetSpec)
    assert spec == rabbitmq.OffsetSpec.of(offsets.OffsetSpec("timestamp", 5))
    assert rabbitmq.OffsetSpec.of(offsets.OffsetSpec.parse("latest")).wire_type == spec.next().wire_type
    with pytest.raises(rabbitmq.InvalidRequest, match="invalid offset spec"):
        rabbitmq.OffsetSpec.parse("soon")
    with pytest.raises(offsets.OffsetSpecError, match="invalid offset spec"):
        offsets.OffsetSpec.parse("soon")
    lost = rabbitmq.DataLossError("s", 3, 10)
    assert isinstance(lost, offsets.DataLossError) and isinstance(lost, rabbitmq.StreamError)
    assert str(lost) == str(offsets.DataLossError("s", 3, 10))
    assert issubclass(rabbitmq.StoreNotVerified, offsets.OffsetNotVerified)
    assert issubclass(mewbase.StoreNotVerified, offsets.OffsetNotVerified)


def test_store_verified_reads_back_until_the_value_or_the_timeout() -> None:
    answers = iter([None, 4, 7])
    offsets.store_verified(lambda: next(answers), 7, timeout=5, describe=str)
    began = time.monotonic()
    with pytest.raises(offsets.OffsetNotVerified, match=r"^stream 's' reads 4$"):
        offsets.store_verified(lambda: 4, 7, timeout=0.2, describe=lambda last: f"stream 's' reads {last}")
    assert 0.2 <= time.monotonic() - began < 1.0


def test_one_offset_vocabulary_with_the_spark_words_as_aliases() -> None:
    """Issue 31: the Spark options' bounds are OffsetSpecs; earliest/latest name first/next."""
    from streamledger.offsets import WORDS, OffsetSpec
    from streamledger.spark.planning import OffsetBound, bound_text, parse_bound

    assert OffsetBound is OffsetSpec
    assert parse_bound("earliest", what="s") == OffsetSpec.first() == OffsetSpec.parse("earliest")
    assert parse_bound("latest", what="s") == OffsetSpec.next() == OffsetSpec.parse("latest")
    assert OffsetSpec.parse("tail") == OffsetSpec.parse("end") == OffsetSpec.next()
    assert parse_bound("last", what="s") == OffsetSpec.next()  # a bound's last is the tail, as before
    assert OffsetSpec.parse("last") == OffsetSpec.last()
    bounds = (OffsetSpec.first(), OffsetSpec.next(), OffsetSpec.offset(7), OffsetSpec.timestamp(5))
    assert [bound_text(b) for b in bounds] == ["earliest", "latest", "7", '{"timestamp": 5}']
    assert set(WORDS.values()) == {"first", "last", "next"}
