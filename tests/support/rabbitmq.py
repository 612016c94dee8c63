"""Real RabbitMQ brokers for the test suite, provisioned and started on demand.

Why a plugin of fixtures rather than a "start the brokers first" step: a test names the broker it
needs (``broker_43``, ``any_broker`` ...) and only that one is provisioned and started, the first
time it is asked for. ``scripts/rabbitmq.sh`` does the work (it is idempotent and skip-fast once
provisioned); here we only serialise it across pytest processes with an ``fcntl`` lock in
``$STREAMLEDGER_HOME`` and hand out connection details. Brokers are left running at the end of the
session, so the next run starts in well under a second.

A fresh machine works too: the first request provisions the broker (about a minute for a chroot
broker, see docs/servers.md), so the suite needs root, as ``make test`` on CI has.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "rabbitmq.sh"
HOST = "127.0.0.1"
URL_ENV = "STREAMLEDGER_RABBITMQ_URL"
EXTERNAL_USER = "streamledger-client"


def streamledger_home() -> Path:
    """Where brokers, certificates and locks live (outside the repo)."""
    return Path(os.environ.get("STREAMLEDGER_HOME", "/var/tmp/streamledger"))


@dataclass(frozen=True)
class _Ports:
    stream: int
    amqp: int
    mgmt: int
    tls: int | None = None


# Must match select_version() in scripts/rabbitmq.sh.
PORTS: dict[str, _Ports] = {
    "4.3": _Ports(stream=5552, amqp=5672, mgmt=15672, tls=5551),
    "4.0": _Ports(stream=5562, amqp=5682, mgmt=15682),
    "3.10": _Ports(stream=5572, amqp=5692, mgmt=15692),
}
VERSIONS = tuple(PORTS)


class BrokerSetupError(RuntimeError):
    """A broker could not be provisioned/started, or a CLI command on it failed."""


@dataclass(frozen=True)
class Broker:
    """A running local broker. ``cli("rabbitmqctl", "list_queues")`` runs a broker CLI command
    as the broker's rabbitmq user (inside its chroot where it has one) and returns stdout."""

    version: str
    host: str
    stream_port: int
    amqp_port: int
    mgmt_port: int
    url: str
    cli: Callable[..., str] = field(repr=False, compare=False)


@dataclass(frozen=True)
class TlsSetup:
    """The 4.3 broker's TLS stream listener and the test PKI made by ``scripts/tls.sh``."""

    tls_url: str
    host: str
    port: int
    ca_file: Path
    client_cert: Path
    client_key: Path
    wrong_ca_file: Path
    external_user: str


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _run_script(*args: str, timeout: float = 900.0) -> str:
    """Run scripts/rabbitmq.sh; on failure raise with its output (which never holds secrets)."""
    proc = subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "STREAMLEDGER_HOME": str(streamledger_home())},
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        what = f"scripts/rabbitmq.sh {' '.join(args[:2])}"
        raise BrokerSetupError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


class _FileLock:
    """Exclusive ``fcntl`` lock so concurrent pytest processes provision/start a broker once."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

    def __enter__(self) -> _FileLock:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _is_up(version: str) -> bool:
    ports = PORTS[version]
    stamp = streamledger_home() / "rabbitmq" / version / "provisioned.stamp"
    needed = [ports.stream] + ([ports.tls] if ports.tls else [])
    return stamp.exists() and all(port_open(HOST, p, 0.5) for p in needed)


# A broker that could not be started in this process: later requests fail at once with the first
# reason, instead of each test waiting out the same 180 s (CI stop 40 spent an hour that way).
_SETUP_FAILED: dict[str, BrokerSetupError] = {}


def ensure_broker(version: str) -> Broker:
    """Provision and start ``version`` unless it is already up; return its details."""
    if version not in PORTS:
        raise ValueError(f"unknown broker version {version!r}; expected one of {', '.join(VERSIONS)}")
    if version in _SETUP_FAILED:
        first = _SETUP_FAILED[version]
        raise BrokerSetupError(f"rabbitmq {version} failed to start earlier in this run: {first}")
    home = streamledger_home()
    with _FileLock(home / "rabbitmq" / f".pytest-{version}.lock"):
        if not _is_up(version):
            t0 = time.monotonic()
            try:
                _run_script("provision", version)
                _run_script("start", version)
                try:
                    _run_script("wait", version)
                except BrokerSetupError as hung:  # a boot that hangs is stopped and made once more
                    warnings.warn(f"rabbitmq {version}: starting again after: {hung}", stacklevel=1)
                    _run_script("stop", version)
                    _run_script("start", version)
                    _run_script("wait", version)
            except BrokerSetupError as exc:
                _SETUP_FAILED[version] = exc
                raise
            print(f"rabbitmq {version}: ready after {time.monotonic() - t0:.1f}s")
    return _broker(version)


def _broker(version: str) -> Broker:
    ports = PORTS[version]

    def cli(*args: str, timeout: float = 120.0) -> str:
        if not args:
            raise ValueError("cli() needs a command, e.g. cli('rabbitmqctl', 'list_queues')")
        return _run_script("cli", version, *args, timeout=timeout)

    return Broker(
        version=version,
        host=HOST,
        stream_port=ports.stream,
        amqp_port=ports.amqp,
        mgmt_port=ports.mgmt,
        url=f"rabbitmq-stream://guest:guest@{HOST}:{ports.stream}/",
        cli=cli,
    )


def make_super_stream_310(broker: Broker, name: str, partitions: int) -> list[str]:
    """Create a super stream with the broker CLI (3.10 has no CreateSuperStream command on the
    wire); works on 4.x too. Returns the partition stream names in order."""
    if partitions < 1:
        raise ValueError(f"super stream {name!r}: partitions must be >= 1, got {partitions}")
    broker.cli("rabbitmq-streams", "add_super_stream", name, "--partitions", str(partitions))
    return [f"{name}-{i}" for i in range(partitions)]


def delete_streams(broker: Broker, streams: Sequence[str], super_streams: Sequence[str] = ()) -> None:
    """Best-effort cleanup; missing names are not an error. Over one stream-protocol connection: each
    broker CLI call starts an Erlang VM (~0.5 s of CPU, and a test can hand out dozens of streams).
    The CLI remains for what the wire cannot do (a super stream on a broker before 3.13, a name
    that is not a stream) and when the connection itself fails."""
    from streamledger.errors import StreamledgerError
    from streamledger.protocol.rabbitmq import StreamClient
    from streamledger.protocol.rabbitmq.constants import DELETE_SUPER_STREAM

    by_cli: list[tuple[str, str]] = []
    try:
        with StreamClient.connect(broker.url) as client:
            for name in super_streams:
                if client.supports(DELETE_SUPER_STREAM):
                    try:
                        client.delete_super_stream(name, missing_ok=True)
                        continue
                    except StreamledgerError:
                        pass
                by_cli.append(("super", name))
            for name in streams:
                try:
                    client.delete_stream(name, missing_ok=True)
                except StreamledgerError:
                    by_cli.append(("queue", name))
    except (OSError, StreamledgerError):
        by_cli = [("super", n) for n in super_streams] + [("queue", n) for n in streams]
    for kind, name in by_cli:
        try:
            if kind == "super":
                broker.cli("rabbitmq-streams", "delete_super_stream", name)
            else:
                broker.cli("rabbitmqctl", "-q", "delete_queue", name)
        except BrokerSetupError:
            pass


@pytest.fixture(scope="session")
def broker_43() -> Broker:
    return ensure_broker("4.3")


@pytest.fixture(scope="session")
def broker_40() -> Broker:
    return ensure_broker("4.0")


@pytest.fixture(scope="session")
def broker_310() -> Broker:
    return ensure_broker("3.10")


@pytest.fixture(params=VERSIONS, ids=list(VERSIONS))
def any_broker(request: pytest.FixtureRequest) -> Broker:
    """The matrix: each test using this runs against 4.3, 4.0 and 3.10."""
    return ensure_broker(request.param)


_external_url: str | None = None


@pytest.fixture(scope="session")
def rabbitmq_url(request: pytest.FixtureRequest) -> str:
    """$STREAMLEDGER_RABBITMQ_URL when it points at a reachable broker, else the local 4.3."""
    global _external_url
    env = os.environ.get(URL_ENV)
    if env:
        parts = urlsplit(env)
        tls = parts.scheme.endswith("+tls")
        host, port = parts.hostname or HOST, parts.port or (5551 if tls else 5552)
        if port_open(host, port, 2.0):
            _external_url = env
            return env
        # Name host and port only: the URL may carry credentials.
        warnings.warn(f"{URL_ENV} broker at {host}:{port} is not reachable; using the local 4.3 broker",
                      stacklevel=1)
    broker: Broker = request.getfixturevalue("broker_43")
    return broker.url


@pytest.fixture(scope="session")
def rabbitmq_tls(broker_43: Broker) -> TlsSetup:
    tls_dir = streamledger_home() / "tls"
    port = PORTS["4.3"].tls
    assert port is not None
    return TlsSetup(
        tls_url=f"rabbitmq-stream+tls://guest:guest@localhost:{port}/",
        host="localhost",
        port=port,
        ca_file=tls_dir / "ca.pem",
        client_cert=tls_dir / "client.pem",
        client_key=tls_dir / "client.key",
        wrong_ca_file=tls_dir / "wrong-ca.pem",
        external_user=EXTERNAL_USER,
    )


class StreamNames:
    """Hands out unique stream names for one test and remembers them for cleanup.

    ``stream_name()`` -> ``t-<test>-<uuid8>``; ``stream_name("orders")`` adds a hint;
    ``stream_name.super_stream()`` is the same for super streams (deleted with their partitions).
    Cleanup runs on ``broker=`` if given, else on the local brokers the test asked for.
    """

    def __init__(self, test_name: str, default_brokers: Callable[[], list[Broker]]) -> None:
        slug = re.sub(r"[^A-Za-z0-9]+", "-", test_name.removeprefix("test_")).strip("-").lower()
        self._slug = slug[:40] or "stream"
        self._default_brokers = default_brokers
        self.streams: list[str] = []
        self.super_streams: list[str] = []
        self.brokers: dict[str, Broker] = {}

    def _new(self, hint: str, broker: Broker | None) -> str:
        # Resolved while the test runs, when every fixture it uses is set up and cached.
        for b in [broker] if broker is not None else self._default_brokers():
            self.brokers.setdefault(b.version, b)
        hint = re.sub(r"[^A-Za-z0-9]+", "-", hint).strip("-")[:20]
        return "-".join(p for p in ("t", self._slug, hint, uuid.uuid4().hex[:8]) if p)

    def __call__(self, hint: str = "", *, broker: Broker | None = None) -> str:
        name = self._new(hint, broker)
        self.streams.append(name)
        return name

    def super_stream(self, hint: str = "", *, broker: Broker | None = None) -> str:
        name = self._new(hint, broker)
        self.super_streams.append(name)
        return name

    def cleanup(self) -> None:
        """Delete what was handed out so far (best effort); safe to call more than once."""
        for broker in self.brokers.values():
            if _is_up(broker.version):
                delete_streams(broker, self.streams, self.super_streams)
        self.streams.clear()
        self.super_streams.clear()


_BROKER_FIXTURES = {"broker_43": "4.3", "broker_40": "4.0", "broker_310": "3.10"}


def _brokers_of(request: pytest.FixtureRequest) -> list[Broker]:
    """The local brokers a test uses, so cleanup never starts a broker the test did not need."""
    found: dict[str, Broker] = {}
    names = request.fixturenames
    if "any_broker" in names:
        b: Broker = request.getfixturevalue("any_broker")
        found[b.version] = b
    for fixture, version in _BROKER_FIXTURES.items():
        if fixture in names:
            found[version] = request.getfixturevalue(fixture)
    uses_local_43 = "rabbitmq_tls" in names or ("rabbitmq_url" in names and _external_url is None)
    if uses_local_43 and "4.3" not in found:
        found["4.3"] = _broker("4.3")
    return list(found.values())


@pytest.fixture
def stream_name(request: pytest.FixtureRequest) -> Iterator[StreamNames]:
    """Factory of unique stream names; the streams handed out are deleted after the test."""
    names = StreamNames(request.node.name, lambda: _brokers_of(request))
    yield names
    names.cleanup()
