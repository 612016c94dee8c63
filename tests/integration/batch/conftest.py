"""Fixtures of the batch tests: the real broker's client, a counting local Spark runner, ledgers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner


@pytest.fixture
def runner(spark: Any) -> CountingRunner:
    return CountingRunner(spark)


@pytest.fixture
def client(rabbitmq_url: str) -> Iterator[StreamClient]:
    with StreamClient.connect(rabbitmq_url) as c:
        yield c


