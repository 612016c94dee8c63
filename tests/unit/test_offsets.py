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
