"""Fixtures for the Dagster integration tests: a fresh super stream on the real 4.3 broker, the
shared local Spark session (the resources' runner reuses it through ``getOrCreate``), a SQLite
ledger per test, and helpers to publish known events and read back what the batches wrote; and
:class:`MinuteWaves`, the events of the one-minute time-window tests, published in the background from
the first Dagster test on, so that the minutes those tests need have passed by the time they run."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger.dagster import RabbitMQStreamResource, StreamLedgerResource, StreamSparkResource
from streamledger.protocol.rabbitmq import StreamClient

PARTITIONS = 2


def publish_spread(url: str, partitions: Sequence[str], ids: Sequence[int]) -> None:
    """Events ``{"id": i}`` spread round robin over ``partitions``, all confirmed."""
    by_part: dict[str, list[bytes]] = {p: [] for p in partitions}
    for i in ids:
        by_part[partitions[i % len(partitions)]].append(json.dumps({"id": i}).encode())
    with StreamClient.connect(url) as client:
        for stream, bodies in by_part.items():
            if bodies:
                assert client.publish(stream, bodies).confirmed == len(bodies)


@dataclass
class Setup:
    url: str
    super_stream: str
    pipeline: str
    output_root: str
    ledger_url: str
    partitions: list[str]

    def resources(self, **overrides: Any) -> dict[str, Any]:
        res: dict[str, Any] = {
            "rabbitmq": RabbitMQStreamResource(url=self.url),
            "ledger": StreamLedgerResource(url=self.ledger_url),
            "spark": StreamSparkResource(),
        }
        res.update(overrides)
        return res

    def env(self) -> dict[str, str]:
        """The example code location's environment for this setup."""
        return {
            "STREAMLEDGER_RABBITMQ_URL": self.url,
            "STREAMLEDGER_LEDGER_URL": self.ledger_url,
            "STREAMLEDGER_OUTPUT_ROOT": self.output_root,
            "STREAMLEDGER_SUPER_STREAM": self.super_stream,
            "STREAMLEDGER_PIPELINE": self.pipeline,
        }

    def publish(self, ids: Sequence[int]) -> None:
        """Events ``{"id": i}`` spread round robin over the partitions, all confirmed."""
        publish_spread(self.url, self.partitions, ids)

    def written_ids(self) -> list[int]:
        """Every event id in the Parquet output of the pipeline (duplicates kept)."""
        root = Path(self.output_root) / self.pipeline
        return [
            json.loads(b)["id"]
            for f in sorted(root.glob("*/*/*/*.parquet"))
            for b in pq.read_table(f, columns=["body"]).column("body").to_pylist()
        ]

    def ranges(self) -> list[Any]:
        from streamledger.ledger import Ledger

        return Ledger(self.ledger_url).ranges(self.pipeline)


@pytest.fixture
def setup(rabbitmq_url: str, stream_name: Any, tmp_path: Path, spark: Any) -> Iterator[Setup]:
    name = stream_name.super_stream("dg")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(name, partitions=PARTITIONS)
        partitions = client.partitions(name)
    yield Setup(
        url=rabbitmq_url,
        super_stream=name,
        pipeline=f"p-{name}",
        output_root=str(tmp_path / "out"),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        partitions=partitions,
    )
    with StreamClient.connect(rabbitmq_url) as client:  # also when the broker came from the environment
        client.delete_super_stream(name, missing_ok=True)


def materializations(result: Any) -> list[Any]:
    """The AssetMaterialization events of an in-process result."""
    return [
        e.event_specific_data.materialization
        for e in result.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    ]


def minute_of(moment: float) -> datetime:
    """The one-minute window (its start) that holds ``moment``."""
    return datetime.fromtimestamp(moment - moment % 60, UTC)


#: The test modules whose one-minute windows :class:`MinuteWaves` publishes.
WAVE_MODULES = ("test_partitions.py", "test_dg.py")


@dataclass
class MinuteWaves:
    """Two waves of events in two consecutive minutes of broker time (chunk timestamps: one-minute
    time-window partitions, cron's finest step, cannot be made shorter), published by a thread.

    Wave A (``{"id": 0..39}``) goes to every super stream of :attr:`super_streams` (round robin over
    their partitions) and to :attr:`stream`, never straddling a minute boundary; wave B
    (``{"id": 40..69}``) goes to the super streams just after the next boundary. The thread starts
    with the first Dagster test (:func:`_minute_waves_early`), so the minutes the window tests need to
    pass run beside the tests before them instead of inside them. Each super stream serves one test
    (its own pipeline and ledger), as a fresh stream per test did."""

    url: str
    names: tuple[str, ...]  # one super stream per user: the name of its test
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    super_streams: dict[str, str] = field(default_factory=dict)
    partitions: dict[str, list[str]] = field(default_factory=dict)
    stream: str = ""
    wave_a: datetime | None = None
    wave_b: datetime | None = None
    error: BaseException | None = None
    a_done: threading.Event = field(default_factory=threading.Event)
    b_done: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)  # the session ends first

    def start(self) -> threading.Thread:
        self.super_streams = {n: f"t-dg-waves-{n}-{self.tag}" for n in self.names}
        self.stream = f"t-dg-waves-win-{self.tag}"
        thread = threading.Thread(target=self._run, name="dagster-minute-waves", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        try:
            with StreamClient.connect(self.url) as client:
                for name, super_stream in self.super_streams.items():
                    client.create_super_stream(super_stream, partitions=PARTITIONS)
                    self.partitions[name] = client.partitions(super_stream)
                client.create_stream(self.stream)
            if time.time() % 60 > 50 and self._into_next_minute():  # keep wave A within its minute
                return
            wave_a = minute_of(time.time())
            for partitions in self.partitions.values():
                publish_spread(self.url, partitions, range(40))
            publish_spread(self.url, [self.stream], range(40))
            assert minute_of(time.time()) == wave_a, "wave A straddled a minute boundary"
            self.wave_a = wave_a
            self.a_done.set()
            if self._into_next_minute():
                return
            self.wave_b = minute_of(time.time())
            for partitions in self.partitions.values():
                publish_spread(self.url, partitions, range(40, 70))
        except BaseException as exc:  # raised in the test that waits for the waves
            self.error = exc
        finally:
            self.a_done.set()
            self.b_done.set()

    def _into_next_minute(self) -> bool:
        """Half a second into the next minute; True when the session ended meanwhile."""
        return self.stopped.wait(60 - time.time() % 60 + 0.5)

    def _wait(self, done: threading.Event) -> None:
        assert done.wait(timeout=200), "the minute waves were not published in time"
        if self.error is not None:
            raise self.error

    def first(self) -> datetime:
        """Wave A's minute, once wave A is published."""
        self._wait(self.a_done)
        assert self.wave_a is not None
        return self.wave_a

    def both(self) -> tuple[datetime, datetime]:
        """Wave A's and wave B's minutes, once both are published."""
        self._wait(self.b_done)
        assert self.wave_a is not None and self.wave_b is not None
        return self.wave_a, self.wave_b

    @staticmethod
    def sleep_until(moment: datetime) -> None:
        """Usually passed long ago, the tests before having run meanwhile."""
        time.sleep(max(0.0, moment.timestamp() - time.time()))

    def setup(self, name: str, tmp_path: Path) -> Setup:
        """The :class:`Setup` of test ``name`` on its own waves' super stream."""
        self._wait(self.a_done)
        super_stream = self.super_streams[name]
        return Setup(url=self.url, super_stream=super_stream, pipeline=f"p-{super_stream}",
                     output_root=str(tmp_path / "out"), ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                     partitions=self.partitions[name])


@pytest.fixture(scope="session")
def minute_waves(rabbitmq_url: str) -> Iterator[MinuteWaves]:
    waves = MinuteWaves(url=rabbitmq_url, names=("ordered", "pinned"))
    thread = waves.start()
    yield waves
    waves.stopped.set()
    thread.join(timeout=60)
    with StreamClient.connect(rabbitmq_url) as client:
        for super_stream in waves.super_streams.values():
            client.delete_super_stream(super_stream, missing_ok=True)
        try:
            client.delete_stream(waves.stream)
        except Exception:  # best effort: the thread may have failed before creating it
            pass


@pytest.fixture(scope="session", autouse=True)
def _minute_waves_early(request: pytest.FixtureRequest) -> None:
    """Start :func:`minute_waves` with the first Dagster test when a window test is to run later."""
    here = Path(__file__).parent
    if any(item.path.parent == here and item.path.name in WAVE_MODULES for item in request.session.items):
        request.getfixturevalue("minute_waves")
