"""Fixtures: emulated TubeMQ masters (the test double in tests/support/tubemq_emulator.py).

There is no real TubeMQ server here; every test in this directory talks TCP to the emulator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.tubemq_emulator import TubeMQMasterEmulator

# Fast client settings so failover/retry paths run in well under a second.
FAST: dict[str, Any] = {
    "rpc_timeout": 2.0,
    "connect_timeout": 1.0,
    "register_retry_wait": 0.05,
    "background_heartbeat": False,
}


@pytest.fixture
def master() -> Iterator[TubeMQMasterEmulator]:
    with TubeMQMasterEmulator() as emulator:
        yield emulator


@pytest.fixture
def master_pair() -> Iterator[tuple[TubeMQMasterEmulator, TubeMQMasterEmulator]]:
    """(standby, active): the standby is listed first, as when the leader moved."""
    with TubeMQMasterEmulator(role="standby") as standby, TubeMQMasterEmulator() as active:
        yield standby, active


@pytest.fixture
def auth_master() -> Iterator[TubeMQMasterEmulator]:
    with TubeMQMasterEmulator(users={"alice": "s3cret"}) as emulator:
        yield emulator


@pytest.fixture
def closed_port() -> int:
    """A local port with nothing listening (connection refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
