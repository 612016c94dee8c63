"""Fixtures of the batch tests: the real broker's client, a counting local Spark runner, ledgers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner


@pytest.fixture
def runner(spark: Any) -> CountingRunner:
    return CountingRunner(spark)


@pytest.fixture
def client(rabbitmq_url: str) -> Iterator[StreamClient]:
    with StreamClient.connect(rabbitmq_url) as c:
        yield c


@pytest.fixture(params=["sqlite", "postgres"])
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with Ledger(url, create=True) as led:
        yield led


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", create=True) as led:
        yield led
