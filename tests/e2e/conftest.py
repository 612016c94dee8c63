"""End-to-end fixtures: a real broker (4.3), a migrated Airflow home running the repo's DAGs with
``airflow dags test``, local Spark in the task process, and a SQLite ledger file per test.

Chunk timestamps are the broker's clock at publish, so data intervals are made honest by publishing
in *waves*, one per interval of a few seconds, and running the backfill DAG with a delta timetable
(``STREAMLEDGER_INTERVAL=<n>s``); ``dags test <date>`` then processes ``[date - n s, date)``.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.support.airflow import AirflowHome, airflow_home, make_airflow_home  # noqa: F401

INTERVAL_S = 4


def connection_json(url: str) -> str:
    """Airflow connection (JSON form) for a plain ``rabbitmq-stream://`` URL."""
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if parts.path not in ("", "/") else "/"
    return json.dumps({
        "conn_type": "rabbitmq_stream", "host": parts.hostname, "port": parts.port or 5552,
        "login": unquote(parts.username or "guest"), "password": unquote(parts.password or "guest"),
        "schema": vhost,
    })


def warm_spark_env(connect_url: str) -> dict[str, str]:
    """Environment that sends the example DAGs' batch jobs to the session's Spark Connect server.

    Why: a local Spark JVM started in each task process costs ~10-15 s of CPU on 2 busy cores, most of
    the suite's e2e time. Local Spark inside the task stays covered where it is the point: the
    runs ``test_backfill_dags``' kill tests kill (``dags test``) and the chaos run (the real scheduler,
    task processes SIGKILLed with Spark up)."""
    server = urlsplit(connect_url)
    return {
        "STREAMLEDGER_SPARK_CONNECT_CONN_ID": "spark_connect_e2e",
        "AIRFLOW_CONN_SPARK_CONNECT_E2E": json.dumps({"conn_type": "spark_connect", "host": server.hostname,
                                                      "port": server.port}),
    }


@dataclass
class Scenario:
    """One pipeline on one fresh super stream, with its own ledger file and output root."""

    af: AirflowHome
    url: str
    super_stream: str
    partitions: int
    pipeline: str
    ledger_url: str
    output_root: Path
    published: dict[int, int] = field(default_factory=dict)  # event id -> wave
    spark: dict[str, str] = field(default_factory=dict)  # where the jobs run (default: local Spark)

    @property
    def env(self) -> dict[str, str]:
        return self.spark | {
            "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": connection_json(self.url),
            "STREAMLEDGER_SUPER_STREAM": self.super_stream,
            "STREAMLEDGER_PARTITIONS": str(self.partitions),
            "STREAMLEDGER_PIPELINE": self.pipeline,
            "STREAMLEDGER_INTERVAL": f"{INTERVAL_S}s",
            # every wave is confirmed before its interval ends, so an interval with no later chunk
            # (the last one) may resolve to the tail right away instead of after a minute of waiting
            "STREAMLEDGER_INTERVAL_GRACE": "2",
            "STREAMLEDGER_LEDGER_URL": self.ledger_url,
            "STREAMLEDGER_OUTPUT_ROOT": str(self.output_root),
        }

    def dags_test(self, dag_id: str, when: datetime, *, check: bool = True,
                  extra: dict[str, str] | None = None) -> str:
        env = {**self.env, **(extra or {})}
        return self.af.dags_test(dag_id, when.isoformat(), env=env, check=check).stdout

    def publish_waves(self, waves: int, per_wave: int,
                      body: Callable[[int, int], bytes] | None = None) -> list[datetime]:
        """Publish ``waves`` waves, one inside each interval; returns the interval ends (logical dates).

        Interval k is ``[t0 + k*n, t0 + (k+1)*n)``; every wave is published well inside its interval.
        ``body(event, k)``: event ``event``'s body in wave ``k`` (default ``{"id": event, "wave": k}``).
        """
        from streamledger.protocol.rabbitmq import StreamClient

        t0 = math.ceil(time.time()) + 1
        ends = []
        next_id = max(self.published, default=-1) + 1
        with StreamClient.connect(self.url) as client:
            streams = client.partitions(self.super_stream)
            for k in range(waves):
                begin = t0 + k * INTERVAL_S
                time.sleep(max(0.0, begin + 0.3 - time.time()))
                per_stream: dict[str, list[bytes]] = {s: [] for s in streams}
                for i in range(per_wave):
                    event = next_id + i
                    data = body(event, k) if body else json.dumps({"id": event, "wave": k}).encode()
                    per_stream[streams[event % len(streams)]].append(data)
                    self.published[event] = k
                next_id += per_wave
                for stream, bodies in per_stream.items():
                    if bodies:
                        result = client.publish(stream, bodies)
                        assert result.confirmed == len(bodies), result
                assert time.time() < begin + INTERVAL_S - 0.3, "publishing overran its interval"
                ends.append(datetime.fromtimestamp(begin + INTERVAL_S, UTC))
        time.sleep(max(0.0, t0 + waves * INTERVAL_S - time.time()))
        return ends

    def output_rows(self) -> list[tuple[str, int, int]]:
        """``(stream, offset, event id)`` of every record in every range directory written."""
        import pyarrow.parquet as pq

        rows = []
        for part in sorted((self.output_root / self.pipeline).glob("*/*/*/*.parquet")):
            table = pq.read_table(part, columns=["stream", "offset", "body"])
            columns = [table.column(c).to_pylist() for c in ("stream", "offset", "body")]
            for stream, offset, body in zip(*columns, strict=True):
                rows.append((stream, offset, json.loads(body)["id"]))
        return rows

    def assert_exactly_once(self, expected_ids: set[int]) -> None:
        rows = self.output_rows()
        offsets = Counter((s, o) for s, o, _ in rows)
        dupes = [k for k, n in offsets.items() if n > 1]
        assert not dupes, f"offsets written more than once: {dupes[:10]}"
        ids = Counter(i for _, _, i in rows)
        missing, unexpected = sorted(expected_ids - set(ids)), sorted(set(ids) - expected_ids)
        assert not missing and not unexpected, f"missing {missing[:10]}, unexpected {unexpected[:10]}"
        assert all(n == 1 for n in ids.values())

    def create_super_stream(self) -> None:
        from streamledger.protocol.rabbitmq import StreamClient

        with StreamClient.connect(self.url) as client:
            client.create_super_stream(self.super_stream, partitions=self.partitions)

    def ledger(self):  # type: ignore[no-untyped-def]
        from streamledger.ledger import Ledger

        return Ledger(self.ledger_url)


@pytest.fixture
def scenario(airflow_home: AirflowHome, rabbitmq_url: str, stream_name, tmp_path: Path,  # noqa: F811
             request: pytest.FixtureRequest) -> Iterator[Scenario]:
    partitions = getattr(request, "param", 2)
    name = stream_name.super_stream("af")
    warm = request.node.get_closest_marker("warm_spark") is not None
    spark = warm_spark_env(request.getfixturevalue("spark_connect")) if warm else {}
    yield Scenario(
        spark=spark,
        af=airflow_home, url=rabbitmq_url, super_stream=name, partitions=partitions,
        pipeline=f"p-{name}", ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        output_root=tmp_path / "output",
    )
