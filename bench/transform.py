"""What a transform costs: a JSON decode + SQL transform against the raw landing of the same records.

    PYTHONPATH=src python bench/transform.py [--records 200000] [--rounds 3] [--url URL]

One stream of ``--records`` JSON order events (about 150 bytes each, one in 50 malformed) is
published once. Each round runs two first batches over the whole stream with ``run_batch``, local
Spark ``local[2]`` (JVM and Python workers warmed first with an untimed batch of each kind), SQLite
ledger, directory sink, each into a fresh pipeline so both read the same records:

* ``raw``: the raw landing (the Arrow writer, ``body`` as bytes);
* ``json+sql``: ``body_format="json"`` with a five-field schema, ``on_bad_record="dead_letter"``,
  and ``SELECT order_id, customer, amount, currency, amount * 100 AS cents FROM records WHERE
  status <> 'refunded'`` (the raw landing, then Spark reads it back, decodes, filters, writes).

Prints the median seconds of each, records per second, and the ratio json+sql / raw measured in the
same run. No target is asserted; the closing note quotes the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from streamledger.batch import BatchConfig, LocalSparkRunner, RunId, run_batch
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
SCHEMA = "order_id STRING, customer STRING, amount DECIMAL(12,2), currency STRING, status STRING"
SQL = ("SELECT order_id, customer, amount, currency, amount * 100 AS cents FROM records "
       "WHERE status <> 'refunded'")


def order(i: int) -> bytes:
    if i % 50 == 7:
        return b'{"order_id": "broken'
    return json.dumps({"order_id": f"o-{i:08d}", "customer": f"c-{i % 997}",
                       "amount": f"{i % 10000}.{i % 100:02d}", "currency": ("EUR", "USD", "GBP")[i % 3],
                       "status": ("paid", "open", "refunded")[i % 3],
                       "ts": 1764400000000 + i}).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default=DEFAULT_URL)
    args = parser.parse_args()
    stream = f"bench-transform-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="bench-transform-"))
    runner = LocalSparkRunner()
    try:
        with StreamClient.connect(args.url) as client:
            client.create_stream(stream)
            started = time.perf_counter()
            done = client.publish(stream, (order(i) for i in range(args.records)), batch_size=500)
            assert done.confirmed == args.records, done
            print(f"published {args.records} JSON orders in {time.perf_counter() - started:.1f} s")
            with Ledger(f"sqlite:///{work / 'ledger.sqlite'}", create=True) as ledger:
                kinds = {
                    "raw": {},
                    "json+sql": {"body_format": "json", "body_schema": SCHEMA, "on_bad_record": "dead_letter",
                                 "sql": SQL},
                }
                times: dict[str, list[float]] = {k: [] for k in kinds}
                rows: dict[str, int] = {}
                for round_ in range(args.rounds + 1):  # round 0 warms the JVM and the workers
                    for kind, extra in kinds.items():
                        pipe = f"bench-{kind.replace('+', '-')}-{round_}"
                        cfg = BatchConfig(pipeline=pipe, url=args.url, output_root=str(work / "out"),
                                          stream=stream, store_offset=False, **extra)  # type: ignore[arg-type]
                        began = time.perf_counter()
                        result = run_batch(cfg, run=RunId("bench", pipe, "t"), ledger=ledger, broker=client,
                                           runner=runner)
                        took = time.perf_counter() - began
                        if round_:
                            times[kind].append(took)
                        part = result.partitions[0]
                        rows[kind] = part.rows if part.rows is not None else part.records
                        shutil.rmtree(work / "out" / pipe, ignore_errors=True)
            raw, transformed = (statistics.median(times[k]) for k in kinds)
            print(f"{'kind':10} {'median s':>9} {'records/s':>10} {'rows out':>9}")
            for kind in kinds:
                t = statistics.median(times[kind])
                print(f"{kind:10} {t:9.2f} {args.records / t:10.0f} {rows[kind]:9d}")
            print(f"json+sql / raw: {transformed / raw:.2f}x the raw landing's time "
                  f"({args.rounds} rounds, {args.records} records, local[2])")
            client.delete_stream(stream)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
