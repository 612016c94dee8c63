"""``streamledger stream|superstream|offset|publish|read`` commands for RabbitMQ streams.

Thin wrappers over :class:`StreamClient`; stream and super stream create/delete/partitions are the
transport-neutral commands of :mod:`streamledger.cli.topology` (stream protocol by default). Every
deliberate failure is a ``StreamledgerError``, which the CLI main turns into one line on stderr and a
non-zero exit status.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from streamledger.cli.options import Position, add_broker, add_json, broker_url, position_arg
from streamledger.cli.progress import Progress
from streamledger.cli.topology import add_stream_commands, add_super_stream_commands
from streamledger.protocol.rabbitmq import InvalidRequest, OffsetSpec, OutboundMessage, StreamClient


def _client(args: argparse.Namespace) -> StreamClient:
    return StreamClient.connect(broker_url(args), timeout=args.timeout)


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, sort_keys=True) if getattr(args, "json", False) else text)


# -- stream ---------------------------------------------------------------------------------------


def _stream_stats(args: argparse.Namespace) -> int:
    with _client(args) as client:
        stats = client.stream_stats(args.name)
        tail = client.committed_tail(args.name, stats=stats)
        first = stats.first_chunk_id if stats.first_chunk_id is not None else tail
        data: dict[str, Any] = {
            "stream": args.name,
            "broker_version": client.server_version,
            "first_offset": first,
            "committed_tail": tail,
            "first_chunk_id": stats.first_chunk_id,
            "committed_chunk_id": stats.committed_chunk_id,
            "last_chunk_id": stats.last_chunk_id,
            "committed_offset": stats.committed_offset,
        }
    _emit(args, data, "\n".join(f"{k}: {'-' if v is None else v}" for k, v in data.items()))
    return 0


# -- offsets --------------------------------------------------------------------------------------


def _offset_store(args: argparse.Namespace) -> int:
    if args.offset is None:
        raise InvalidRequest("offset store needs STREAM REF OFFSET")
    with _client(args) as client:
        client.store_offset_verified(args.stream, args.reference, args.offset)
    _emit(args, {"stream": args.stream, "reference": args.reference, "offset": args.offset},
          f"stored offset {args.offset} for {args.reference} on {args.stream}")
    return 0


def _offset_query(args: argparse.Namespace) -> int:
    with _client(args) as client:
        offset = client.query_offset(args.stream, args.reference)
    _emit(args, {"stream": args.stream, "reference": args.reference, "offset": offset},
          "no offset stored" if offset is None else str(offset))
    return 0


# -- publish / read -------------------------------------------------------------------------------


def _bodies(count: int, size: int) -> Iterator[bytes]:
    pad = b"x" * size
    for i in range(count):
        head = b"%d:" % i
        yield (head + pad)[:size] if size >= len(head) else head


def _lines(path: str) -> Iterator[bytes]:
    """The non-empty lines of ``path`` (``-``: stdin) as message bodies, without their line ends."""
    import sys

    try:
        stream = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise InvalidRequest(f"publish: --from-file {path}: {exc.strerror or exc}") from None
    try:
        for line in stream:
            body = line.rstrip(b"\r\n")
            if body:
                yield body
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _filtered(bodies: Iterator[bytes], name: str, values: list[str]) -> Iterator[OutboundMessage]:
    """Message ``i`` carries application property ``name`` = ``values[i % len(values)]``, which
    ``publish(filter_property=name)`` also makes its filter value."""
    for i, body in enumerate(bodies):
        yield OutboundMessage(body, {name: values[i % len(values)]})


def _publish(args: argparse.Namespace) -> int:
    values = [v.strip() for v in (args.filter_values or "").split(",") if v.strip()]
    if bool(values) != bool(args.filter_property):
        raise InvalidRequest("publish: --filter-property and --filter-values go together")
    if values and args.raw:
        raise InvalidRequest("publish: --raw records have no application properties to filter on")
    with _client(args) as client:
        started = time.perf_counter()
        bodies: Iterator[Any] = (_lines(args.from_file) if args.from_file is not None
                                 else _bodies(args.count, args.size))
        if values:
            bodies = _filtered(bodies, args.filter_property, values)
        result = client.publish(args.stream, bodies, amqp=not args.raw, batch_size=args.batch_size,
                                filter_property=args.filter_property or None)
        elapsed = time.perf_counter() - started
    rate = result.confirmed / elapsed if elapsed > 0 else 0.0
    data = {"stream": args.stream, "published": result.published, "confirmed": result.confirmed,
            "seconds": round(elapsed, 3), "msgs_per_s": round(rate)}
    _emit(args, data, f"published {result.confirmed} messages in {elapsed:.2f}s: {rate:,.0f} msgs/s")
    return 0


def _bound(client: StreamClient, stream: str, position: Position) -> int:
    """The offset a position names on ``stream`` (docs/cli.md, "Offsets")."""
    if position.offset is not None:
        return position.offset
    if position.word == "next":
        return client.committed_tail(stream)
    if position.word == "first":
        return client.resolve_offset(stream, OffsetSpec.first())
    if position.word == "last":
        return client.resolve_offset(stream, OffsetSpec.last())
    assert position.timestamp_ms is not None
    return client.resolve_offset(stream, OffsetSpec.timestamp(position.timestamp_ms))


def _write_jsonl(path: Path, batches: Iterator[Any]) -> tuple[int, int | None, int | None]:
    from streamledger.protocol.amqp10.text import stringify

    records, first, last = 0, None, None
    with path.open("w", encoding="utf-8") as fh:
        for batch in batches:
            n = len(batch)
            props = batch.properties or [None] * n
            apps = batch.application_properties or [None] * n
            for i in range(n):
                row = {
                    "stream": batch.stream,
                    "offset": batch.offsets[i],
                    "chunk_timestamp": batch.chunk_timestamps[i],
                    "body": stringify(batch.bodies[i]),
                    "properties": _strmap(props[i]),
                    "application_properties": _strmap(apps[i]),
                }
                fh.write(json.dumps(row) + "\n")
            if n:
                first = batch.offsets[0] if first is None else first
                last = batch.offsets[-1]
                records += n
    return records, first, last


def _strmap(value: dict[Any, Any] | None) -> dict[str, str | None] | None:
    from streamledger.protocol.amqp10.text import stringify

    if value is None:
        return None
    return {k if isinstance(k, str) else str(stringify(k)): stringify(v) for k, v in value.items()}


def _write_parquet(path: Path, batches: Iterator[Any]) -> tuple[int, int | None, int | None]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamledger.spark.arrow import ARROW_SCHEMA, buffers_to_arrow

    # Batches in the buffer layout (read_range(layout="buffers")): wrapped by Arrow as they are.
    columns = ["stream", "offset", "chunk_timestamp", "body", "properties", "application_properties"]
    schema = pa.schema([ARROW_SCHEMA.field(name) for name in columns])
    records, first, last = 0, None, None
    # Encode batch k in a second thread while batch k+1 is read: both release the GIL (socket reads,
    # Parquet's C++ encoder), so on two cores they overlap. At most two batches are in memory.
    with pq.ParquetWriter(str(path), schema) as writer, ThreadPoolExecutor(1) as encoder:
        pending: Future[None] | None = None
        for batch in batches:
            if not len(batch):
                continue
            arrow = buffers_to_arrow(batch, ("properties", "application_properties")).select(columns)
            if pending is not None:
                pending.result()
            pending = encoder.submit(writer.write_batch, arrow)
            first = batch.run_starts[0] if first is None else first
            last = batch.run_starts[-1] + batch.run_lengths[-1] - 1
            records += len(batch)
        if pending is not None:
            pending.result()
    return records, first, last


def _read(args: argparse.Namespace) -> int:
    from streamledger.cli.output_file import checked_output, write_atomically

    output = checked_output(args.output, InvalidRequest)
    suffix = output.suffix.lower()
    with _client(args) as client:
        start = _bound(client, args.stream, args.start)
        end = _bound(client, args.stream, args.end)
        decode: Literal["amqp", "raw"] = "raw" if args.raw else "amqp"
        batches: Iterator[Any]
        if suffix == ".parquet":
            batches = client.read_range(args.stream, start, end, decode=decode, layout="buffers")
        else:
            batches = client.read_range(args.stream, start, end, decode=decode)
        progress = Progress(f"read {args.stream} [{start}, {end})", total=max(0, end - start), unit="offsets")
        counted = progress.track(batches, size=_span)
        writer = _write_parquet if suffix == ".parquet" else _write_jsonl
        records, first, last = write_atomically(output, lambda tmp: writer(tmp, counted))
        progress.done(records)
    print(json.dumps({"stream": args.stream, "start": start, "end": end, "records": records,
                      "first_offset": first, "last_offset": last, "output": str(output)}))
    return 0


def _span(batch: Any) -> int:
    """Offsets a batch covers (what the planned range counts; tracking chunks take offsets too)."""
    if not len(batch):
        return 0
    if getattr(batch, "run_starts", None):
        return int(batch.run_starts[-1] + batch.run_lengths[-1] - batch.run_starts[0])
    return int(batch.offsets[-1] - batch.offsets[0] + 1)


# -- wiring ---------------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    add_broker(parser)
    add_json(parser)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")


def register(sub: Any) -> None:
    """Add this group's sub-commands to the top-level parser."""
    stream = sub.add_parser("stream", help="create, delete or inspect a stream")
    ss = stream.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_stream_commands(ss, transport="stream")
    p = ss.add_parser("stats", help="first offset, committed tail and StreamStats (RabbitMQ 3.12+)")
    p.add_argument("name")
    _common(p)
    p.set_defaults(func=_stream_stats)

    sup = sub.add_parser("superstream", help="create, delete or list a super stream")
    add_super_stream_commands(sup.add_subparsers(dest="action", required=True, metavar="ACTION"),
                              transport="stream")

    off = sub.add_parser("offset", help="store or query a consumer's stored offset")
    op = off.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = op.add_parser("store", help="store OFFSET (last processed) for REF and read it back")
    p.add_argument("stream")
    p.add_argument("reference")
    p.add_argument("offset", type=int, nargs="?")
    _common(p)
    p.set_defaults(func=_offset_store)
    p = op.add_parser("query", help="print the stored offset for REF")
    p.add_argument("stream")
    p.add_argument("reference")
    _common(p)
    p.set_defaults(func=_offset_query)

    p = sub.add_parser("publish", help="publish N test messages of B bytes (or a file's lines) and print "
                       "msgs/s")
    p.add_argument("stream")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--count", type=_count, help="N test messages of --size bytes")
    given.add_argument("--from-file", metavar="FILE",
                       help="one message per line of FILE (e.g. JSON lines; '-' reads stdin), without "
                            "the line end")
    p.add_argument("--size", type=_count, default=100)
    p.add_argument("--raw", action="store_true", help="raw records instead of AMQP 1.0 messages")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--filter-property", metavar="NAME",
                   help="an application property each message carries and publishes as its stream filter "
                        "value (RabbitMQ 3.13+)")
    p.add_argument("--filter-values", metavar="V1,V2,...",
                   help="the values of --filter-property, message i taking value i mod their count")
    _common(p)
    p.set_defaults(func=_publish)

    p = sub.add_parser("read", help="write exactly the records of [START, END) to a file")
    p.add_argument("stream")
    p.add_argument("--start", required=True, type=position_arg, metavar="POSITION",
                   help="first, last, next, an offset or timestamp:MS (docs/cli.md)")
    p.add_argument("--end", required=True, type=position_arg, metavar="POSITION",
                   help="exclusive end: next (the tail), an offset or timestamp:MS")
    p.add_argument("--output", required=True, help="FILE.parquet or FILE.jsonl")
    p.add_argument("--raw", action="store_true", help="do not decode AMQP (bodies as stored)")
    _common(p)
    p.set_defaults(func=_read)


