"""Fixtures for the Dagster integration tests: a fresh super stream on the real 4.3 broker, the
shared local Spark session (the resources' runner reuses it through ``getOrCreate``), a SQLite
ledger per test, and helpers to publish known events and read back what the batches wrote."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger.dagster import RabbitMQStreamResource, StreamLedgerResource, StreamSparkResource
from streamledger.protocol.rabbitmq import StreamClient

PARTITIONS = 2


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
        by_part: dict[str, list[bytes]] = {p: [] for p in self.partitions}
        for i in ids:
            by_part[self.partitions[i % len(self.partitions)]].append(json.dumps({"id": i}).encode())
        with StreamClient.connect(self.url) as client:
            for stream, bodies in by_part.items():
                if bodies:
                    assert client.publish(stream, bodies).confirmed == len(bodies)

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
