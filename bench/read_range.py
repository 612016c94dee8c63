"""Range-read throughput: streamledger's read_range vs rstream on the same stream, same run.

Publishes COUNT messages of SIZE bytes (once AMQP 1.0 encoded, once raw) to a local broker (4.3 by
default), reads the whole range with our client and with rstream, and prints messages/s for each
and the ratio. Also prints decode-only figures (chunks already in memory) from bench/decode.py.
Then, for the AMQP stream, the files case: ``streamledger read STREAM --output X.parquet`` timed as a
separate process (interpreter start, imports, read, Parquet) against rstream + pyarrow writing the same
Parquet in this process (bench/spark_read.py's baseline), ratio printed (target >= 8x).
Figures are noisy on a shared 2-core machine: compare the ratio within one run.

    .venv/bin/python bench/read_range.py [--count 1000000] [--size 100] [--url URL] [--runs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

from streamledger.protocol.rabbitmq import StreamClient, parse_url

DEFAULT_URL = os.environ.get("STREAMLEDGER_RABBITMQ_URL", "rabbitmq-stream://guest:guest@127.0.0.1:5552/")


def publish(client: StreamClient, stream: str, count: int, size: int, *, amqp: bool) -> float:
    pad = b"x" * size

    def bodies() -> Any:
        for i in range(count):
            yield (b"%d:" % i + pad)[:size]

    started = time.perf_counter()
    result = client.publish(stream, bodies(), amqp=amqp, batch_size=1000)
    elapsed = time.perf_counter() - started
    assert result.confirmed == count, result
    return count / elapsed


def ours(client: StreamClient, stream: str, count: int, decode: Literal["amqp", "raw"]) -> float:
    tail = client.committed_tail(stream)
    started = time.perf_counter()
    n = 0
    for batch in client.read_range(stream, 0, tail, decode=decode):
        n += len(batch)
    elapsed = time.perf_counter() - started
    assert n == count, (n, count)
    return n / elapsed


async def _rstream(url: str, stream: str, count: int, amqp: bool) -> float:
    p = parse_url(url)
    received = 0
    done = asyncio.Event()

    async def on_msg(msg: Any, ctx: Any) -> None:
        nonlocal received
        received += 1
        if received >= count:
            done.set()

    consumer = Consumer(p.host, p.port, username=p.username, password=p.password, vhost=p.vhost)
    await consumer.start()
    started = time.perf_counter()
    await consumer.subscribe(stream, on_msg, decoder=amqp_decoder if amqp else None,
                             offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - started
    await consumer.close()
    return received / elapsed


def theirs(url: str, stream: str, count: int, amqp: bool) -> float:
    return asyncio.run(_rstream(url, stream, count, amqp))


def cli_to_parquet(url: str, stream: str, count: int, work: Path) -> tuple[float, float]:
    """(seconds for ``streamledger read`` as its own process, seconds for rstream + pyarrow)."""
    import subprocess
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from spark_read import baseline  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory(dir=work) as tmp:
        out = Path(tmp) / "cli.parquet"
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "streamledger.cli", "--url", url, "read", stream, "--start", "first",
             "--end", "tail", "--output", str(out)],
            capture_output=True, text=True, check=False,
        )
        t_cli = time.perf_counter() - started
        assert proc.returncode == 0, proc.stderr[-2000:]
        import pyarrow.parquet as pq

        assert pq.read_metadata(out).num_rows == count
        (Path(tmp) / "rstream").mkdir()
        n, t_base = baseline(url, {stream: count}, Path(tmp) / "rstream", "amqp")
        assert n == count, (n, count)
    return t_cli, t_base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=2, help="read passes per client; the best counts")
    parser.add_argument("--decode-count", type=int, default=1_000_000, help="records for decode-only figures")
    parser.add_argument("--no-decode-only", action="store_true")
    parser.add_argument("--no-parquet", action="store_true", help="skip `streamledger read` to Parquet")
    args = parser.parse_args()

    print(f"publishing {args.count:,} x {args.size}-byte messages to {parse_url(args.url).redacted()}")
    with StreamClient.connect(args.url, timeout=60) as client:
        print(f"broker RabbitMQ {client.server_version}")
        for mode in ("amqp", "raw"):
            stream = f"bench-read-range-{mode}-{uuid.uuid4().hex[:8]}"
            client.create_stream(stream)
            try:
                rate = publish(client, stream, args.count, args.size, amqp=mode == "amqp")
                print(f"[{mode}] publish (ours, all confirmed): {rate:,.0f} msgs/s")
                best_ours = best_theirs = 0.0
                for _ in range(args.runs):
                    best_ours = max(best_ours, ours(client, stream, args.count, mode))  # type: ignore[arg-type]
                    best_theirs = max(best_theirs, theirs(args.url, stream, args.count, mode == "amqp"))
                print(f"[{mode}] read_range streamledger: {best_ours:,.0f} msgs/s")
                print(f"[{mode}] rstream consumer:        {best_theirs:,.0f} msgs/s")
                print(f"[{mode}] ratio streamledger/rstream: {best_ours / best_theirs:.2f}x "
                      f"(target {'3' if mode == 'amqp' else '1.5'}x)")
                if mode == "amqp" and not args.no_parquet:
                    work = Path(os.environ.get("STREAMLEDGER_HOME", "/var/tmp/streamledger")) / "bench"
                    work.mkdir(parents=True, exist_ok=True)
                    t_cli, t_base = cli_to_parquet(args.url, stream, args.count, work)
                    print(f"[amqp] `streamledger read` -> Parquet (own process): {t_cli:.2f}s "
                          f"({args.count / t_cli:,.0f} msgs/s)")
                    print(f"[amqp] rstream + pyarrow -> Parquet:               {t_base:.2f}s "
                          f"({args.count / t_base:,.0f} msgs/s)")
                    print(f"[amqp] ratio rstream time / streamledger read time: {t_base / t_cli:.2f}x "
                          "(target >= 8x)")
            finally:
                client.delete_stream(stream, missing_ok=True)

    if not args.no_decode_only:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        try:
            from decode import decode_only_figures  # type: ignore[import-not-found]
        except ImportError:
            print("decode-only: bench/decode.py not available")
            return
        figures = decode_only_figures(args.decode_count, ["raw", "amqp", "amqp_gzip_sub_batches"])
        for name, value in figures.items():
            print(f"decode-only {name}: {value:,.0f} records/s")


if __name__ == "__main__":
    main()
