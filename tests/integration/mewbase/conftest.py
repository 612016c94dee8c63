"""Fixtures: emulated mewbase servers (the test double in tests/support/mewbase_emulator.py).

There is no mewbase server here; every test in this directory talks TCP to the emulator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamledger.protocol.mewbase import MewbaseClient
from tests.support.mewbase_emulator import MewbaseServerEmulator


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., MewbaseServerEmulator]]:
    started: list[MewbaseServerEmulator] = []

    def make(**kwargs: Any) -> MewbaseServerEmulator:
        emulator = MewbaseServerEmulator(**kwargs).start()
        started.append(emulator)
        return emulator

    yield make
    for emulator in started:
        emulator.stop()


@pytest.fixture
def emulator(make_emulator: Callable[..., MewbaseServerEmulator]) -> MewbaseServerEmulator:
    return make_emulator()


@pytest.fixture
def client(emulator: MewbaseServerEmulator) -> Iterator[MewbaseClient]:
    with MewbaseClient.connect(emulator.url(), timeout=3.0) as c:
        yield c


@pytest.fixture
def closed_port() -> int:
    """A local port with nothing listening (connection refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
