"""The Dagster backlog sensor's tick time against super streams of 1, 8 and 64 partitions.

    PYTHONPATH=src python bench/dagster_sensor.py [--partitions 1,8,64] [--ticks 5] [--records 10]
                                                 [--url URL]

For each partition count a fresh super stream is created and a fresh SQLite ledger; the sensor of
:func:`streamledger.dagster.build_stream_backlog_sensor` is ticked through ``build_sensor_context``
(what the daemon calls) in two states:

* ``idle``: nothing published; every tick measures every partition and skips;
* ``backlog``: ``--records`` records in every partition, ``min_backlog`` = all of them, so the tick
  counts user records in every partition before requesting a run (the sensor's worst case).
* ``claimed``: one range claimed in the ledger by a live holder; the tick measures and skips
  without counting records.

It prints the median tick time (``--ticks`` ticks, after one untimed), the broker connections
opened per tick (``StreamClient.connect`` calls, counted; the sensor's contract is one per tick)
and the ratio to the 1-partition stream measured in the same run. Dagster's sensor timeout is 60 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, SensorResult, build_sensor_context

from streamledger.batch import RunId
from streamledger.dagster import (
    RabbitMQStreamResource,
    StreamLedgerResource,
    build_stream_backlog_sensor,
    build_stream_batch_asset,
)
from streamledger.protocol.rabbitmq import StreamClient

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
CONNECTS = [0]


def count_connections() -> None:
    """Count ``StreamClient.connect`` calls (every broker connection the sensor opens)."""
    real = StreamClient.connect.__func__  # type: ignore[attr-defined]

    def connect(cls: type[StreamClient], *args: Any, **kwargs: Any) -> StreamClient:
        CONNECTS[0] += 1
        return real(cls, *args, **kwargs)  # type: ignore[no-any-return]

    StreamClient.connect = classmethod(connect)  # type: ignore[method-assign,assignment]


def ticks(sensor: Any, resources: dict[str, Any], n: int) -> tuple[float, float, str]:
    """Median seconds per tick and connections per tick over ``n`` timed ticks (one untimed first)."""
    instance = DagsterInstance.ephemeral()
    times, cursor, outcome = [], None, ""
    for i in range(n + 1):
        context = build_sensor_context(instance=instance, cursor=cursor, resources=resources)
        before = CONNECTS[0]
        began = time.perf_counter()
        result = sensor(context)
        elapsed = time.perf_counter() - began
        assert isinstance(result, SensorResult)
        cursor = result.cursor
        outcome = "request" if result.run_requests else "skip"
        if i:
            times.append(elapsed)
            conns = CONNECTS[0] - before
    return statistics.median(times), conns, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="1,8,64")
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--url", default=DEFAULT_URL)
    args = parser.parse_args()
    counts = [int(x) for x in args.partitions.split(",")]
    count_connections()
    rows: list[tuple[int, str, float, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="sl-bench-sensor-") as tmp:
        for n in counts:
            name = f"bench-sensor-{n}-{uuid.uuid4().hex[:6]}"
            pipeline = f"p-{name}"
            with StreamClient.connect(args.url) as client:
                client.create_super_stream(name, partitions=n)
                partitions = client.partitions(name)
            try:
                ledger = StreamLedgerResource(url=f"sqlite:///{Path(tmp) / f'{name}.db'}")
                resources = {"rabbitmq": RabbitMQStreamResource(url=args.url), "ledger": ledger}
                asset = build_stream_batch_asset(pipeline=pipeline, super_stream=name, output_root=tmp,
                                                 key=f"b{n}")
                total = n * args.records
                sensor = build_stream_backlog_sensor(asset, pipeline=pipeline, super_stream=name,
                                                     min_backlog=total)
                rows.append((n, "idle", *ticks(sensor, resources, args.ticks)))
                with StreamClient.connect(args.url) as client:
                    for p in partitions:
                        bodies = [json.dumps({"i": i}).encode() for i in range(args.records)]
                        assert client.publish(p, bodies).confirmed == args.records
                rows.append((n, "backlog", *ticks(sensor, resources, args.ticks)))
                claim_one(ledger.get_ledger(), args.url, pipeline, name, partitions[0])
                rows.append((n, "claimed", *ticks(sensor, resources, args.ticks)))
            finally:
                with StreamClient.connect(args.url) as client:
                    client.delete_super_stream(name, missing_ok=True)
    base = {state: t for n, state, t, _c, _o in rows if n == counts[0]}
    print(f"backlog sensor tick (median of {args.ticks}; {args.records} records per partition "
          "when backlogged)")
    print(f"{'partitions':>10} {'state':<8} {'tick ms':>9} {'conn/tick':>9} {'outcome':<8} "
          f"vs {counts[0]} partition(s)")
    for n, state, t, conns, outcome in rows:
        print(f"{n:>10} {state:<8} {t * 1000:>9.1f} {conns:>9.0f} {outcome:<8} x{t / base[state]:.1f}")


def claim_one(ledger: Any, url: str, pipeline: str, super_stream: str, stream: str) -> None:
    """A live claim on ``stream`` [0, 1) (no Dagster run behind it: an unknown holder is alive)."""
    from streamledger.batch.position import PipelineSource

    with StreamClient.connect(url) as client:
        source = PipelineSource(pipeline, url, super_stream=super_stream)
        ref = source.ref(source.identity(client), stream)
    ledger.claim(pipeline, ref, 1, RunId("bench", "bench-run", "claim"), initial_start=0)


if __name__ == "__main__":
    main()
