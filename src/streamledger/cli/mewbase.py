"""`streamledger mewbase publish|read`: publish test events to a mewbase channel, or write an exact
range of one to a file.

The server comes from ``--broker-url mewbase://[user:pass@]host:port`` (old name ``--mewbase-url``) or
``$STREAMLEDGER_MEWBASE_URL``. Both commands print one JSON summary line; every deliberate failure is a
``StreamledgerError`` that the CLI main turns into one line on stderr (never with the password).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from streamledger.cli.options import Position, add_broker, add_json, broker_url, position_arg

URL_ENV = "STREAMLEDGER_MEWBASE_URL"


def register(sub: Any) -> None:
    """Add this group's sub-commands to the top-level parser."""
    group = sub.add_parser("mewbase", help="publish to or read exact ranges of a mewbase channel")
    cmds = group.add_subparsers(dest="mewbase_command", required=True, metavar="SUBCOMMAND")

    p = cmds.add_parser("publish", help="publish N test events of about B bytes, print a JSON summary")
    p.add_argument("channel")
    p.add_argument("--count", type=int, required=True, help="number of events")
    p.add_argument("--size", type=int, default=100, help="approximate BSON size of each event (default 100)")
    p.add_argument("--window", type=int, default=256, help="unconfirmed events in flight (default 256)")
    _common(p)
    p.set_defaults(func=_publish)

    p = cmds.add_parser("read", help="write exactly the events of [START, END) to a file")
    p.add_argument("channel")
    p.add_argument("--start", required=True, type=position_arg, metavar="POSITION",
                   help="first, last, next, a position or timestamp:MS (docs/cli.md)")
    p.add_argument("--end", required=True, type=position_arg, metavar="POSITION",
                   help="exclusive end: next (the tail), a position or timestamp:MS")
    p.add_argument("--output", required=True, help="FILE.jsonl or FILE.parquet")
    _common(p)
    p.set_defaults(func=_read)


def _common(parser: argparse.ArgumentParser) -> None:
    add_broker(parser, help_extra=f"; here mewbase://[user:pass@]host:port, default ${URL_ENV}")
    add_json(parser)  # both commands print one JSON line anyway
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds per request and per silence (default 10)"
    )


def _connect(args: argparse.Namespace) -> Any:
    from streamledger.protocol.mewbase import MewbaseLog

    url = broker_url(args, env=(URL_ENV,), default=None)
    return MewbaseLog.connect(url, timeout=args.timeout)


def _events(count: int, size: int) -> Iterator[dict[str, Any]]:
    # {"n": int32, "data": string}: 23 bytes of BSON around the string, so pad to reach `size`.
    for i in range(count):
        yield {"n": i, "data": "x" * max(0, size - 23)}


def _publish(args: argparse.Namespace) -> int:
    from streamledger.protocol.mewbase import InvalidRequest

    if args.count < 0 or args.size < 0:
        raise InvalidRequest("--count and --size must not be negative")
    with _connect(args) as log:
        started = time.perf_counter()
        confirmed = log.client.publish_many(args.channel, _events(args.count, args.size), window=args.window)
        elapsed = time.perf_counter() - started
    rate = confirmed / elapsed if elapsed > 0 else 0.0
    print(
        json.dumps(
            {
                "channel": args.channel,
                "published": args.count,
                "confirmed": confirmed,
                "seconds": round(elapsed, 3),
                "events_per_s": round(rate),
            }
        )
    )
    return 0


def _bound(log: Any, channel: str, position: Position) -> int:
    return int(log.resolve_offset(channel, str(position)))


def _write_jsonl(path: Path, batches: Iterator[Any]) -> tuple[int, int | None, int | None]:
    from streamledger.protocol.mewbase.events import event_json

    records, first, last = 0, None, None
    with path.open("w", encoding="utf-8") as fh:
        for batch in batches:
            for pos, stamp, raw in zip(batch.positions, batch.timestamps, batch.events, strict=True):
                event = event_json(raw)
                fh.write(f'{{"pos": {pos}, "timestamp": {stamp}, "event": {event}}}\n')
            if len(batch):
                first = batch.positions[0] if first is None else first
                last = batch.positions[-1]
                records += len(batch)
    return records, first, last


PARQUET_COLUMNS = ("channel", "pos", "timestamp", "event", "event_json")


def _write_parquet(path: Path, batches: Iterator[Any]) -> tuple[int, int | None, int | None]:
    """Columns: channel, pos (int64), timestamp (ms, UTC), event (BSON bytes), event_json (relaxed JSON)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            pa.field("channel", pa.string(), nullable=False),
            pa.field("pos", pa.int64(), nullable=False),
            pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
            pa.field("event", pa.binary(), nullable=False),
            pa.field("event_json", pa.string(), nullable=False),
        ]
    )
    records, first, last = 0, None, None
    with pq.ParquetWriter(str(path), schema) as writer:
        for batch in batches:
            n = len(batch)
            if not n:
                continue
            texts = batch.json_texts()
            writer.write_batch(
                pa.record_batch(
                    [
                        pa.array([batch.channel] * n, pa.string()),
                        pa.array(batch.positions, pa.int64()),
                        pa.array(batch.timestamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                        pa.array(batch.events, pa.binary()),
                        pa.array(texts, pa.string()),
                    ],
                    schema=schema,
                )
            )
            first = batch.positions[0] if first is None else first
            last = batch.positions[-1]
            records += n
    return records, first, last


def _read(args: argparse.Namespace) -> int:
    from streamledger.cli.output_file import checked_output, write_atomically
    from streamledger.protocol.mewbase import InvalidRequest

    output = checked_output(args.output, InvalidRequest)
    suffix = output.suffix.lower()
    with _connect(args) as log:
        start = _bound(log, args.channel, args.start)
        end = _bound(log, args.channel, args.end)
        batches = log.read_range(args.channel, start, end)
        writer = _write_parquet if suffix == ".parquet" else _write_jsonl
        records, first, last = write_atomically(output, lambda tmp: writer(tmp, batches))
    print(
        json.dumps(
            {
                "channel": args.channel,
                "start": start,
                "end": end,
                "records": records,
                "first_pos": first,
                "last_pos": last,
                "output": str(output),
            }
        )
    )
    return 0
