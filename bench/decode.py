"""Decode-only throughput of the RabbitMQ Streams data plane (chunks already in memory).

Builds chunks the way the broker stores them (``chunk.build_chunk``: header, entries, CRC) for
``n`` records of about 100 bytes and times ``decode_chunk`` over all of them, CRC check on,
one ``RecordBatch`` per chunk as ``read_range`` yields them. Prints records/s per scenario.

``decode_only_figures(n)`` returns the same figures as a dict for ``bench/read_range.py``;
its ``"raw"`` and ``"amqp"`` keys are the headline cases (100-byte records/bodies, simple entries).

Run: ``.venv/bin/python bench/decode.py [N] [--only SCENARIO] [--profile SCENARIO]``; set
``STREAMLEDGER_PURE_PYTHON=1`` for the figures without the optional C accelerator.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable
from typing import Literal

from streamledger.protocol.rabbitmq.amqp import encode_message
from streamledger.protocol.rabbitmq.chunk import ACCELERATED, SubBatch, build_chunk, decode_chunk
from streamledger.protocol.rabbitmq.compression import CODEC_GZIP
from streamledger.protocol.rabbitmq.records import RecordBatch

RECORDS_PER_CHUNK = 500  # order of what a busy publisher's batches give
SUB_BATCH_RECORDS = 100
Mode = Literal["amqp", "raw"]


def _payloads(n: int, size: int, vary: int, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    base = bytes(rnd.randrange(256) for _ in range(size + vary + 16))
    out = []
    for i in range(n):
        length = size + (rnd.randint(-vary, vary) if vary else 0)
        start = i % 16
        out.append(base[start : start + length])
    return out


def _chunks(records: list[bytes], *, sub_batch_codec: int | None) -> list[bytes]:
    chunks = []
    offset = 0
    ts = 1_700_000_000_000
    for a in range(0, len(records), RECORDS_PER_CHUNK):
        part = records[a : a + RECORDS_PER_CHUNK]
        entries: list[bytes | SubBatch]
        if sub_batch_codec is None:
            entries = list(part)
        else:
            entries = [SubBatch(part[i : i + SUB_BATCH_RECORDS], sub_batch_codec)
                       for i in range(0, len(part), SUB_BATCH_RECORDS)]
        chunks.append(build_chunk(entries, first_offset=offset, timestamp=ts))
        offset += len(part) + 1  # a tracking chunk between chunks: offsets have gaps
        ts += 1
    return chunks


def _scenarios(n: int) -> dict[str, tuple[Callable[[], list[bytes]], Mode]]:
    def amqp(payloads: list[bytes]) -> list[bytes]:
        return [encode_message(p) for p in payloads]

    def amqp_props(payloads: list[bytes]) -> list[bytes]:
        return [encode_message(p, properties={"message-id": i, "content-type": "application/octet-stream"},
                               application_properties={"source": "bench", "seq": i})
                for i, p in enumerate(payloads)]

    fixed = lambda: _payloads(n, 100, 0, 1)  # noqa: E731
    varied = lambda: _payloads(n, 100, 10, 2)  # noqa: E731
    return {
        "raw": (lambda: _chunks(fixed(), sub_batch_codec=None), "raw"),
        "raw_varied_size": (lambda: _chunks(varied(), sub_batch_codec=None), "raw"),
        "raw_gzip_sub_batches": (lambda: _chunks(varied(), sub_batch_codec=CODEC_GZIP), "raw"),
        "amqp": (lambda: _chunks(amqp(fixed()), sub_batch_codec=None), "amqp"),
        "amqp_varied_size": (lambda: _chunks(amqp(varied()), sub_batch_codec=None), "amqp"),
        "amqp_gzip_sub_batches": (lambda: _chunks(amqp(varied()), sub_batch_codec=CODEC_GZIP), "amqp"),
        "amqp_with_properties": (lambda: _chunks(amqp_props(varied()), sub_batch_codec=None), "amqp"),
    }


def _time_decode(chunks: list[bytes], mode: Mode) -> tuple[int, float, float]:
    """(records, wall seconds, CPU seconds of this process)."""
    gc.collect()
    records = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    for c in chunks:
        out = RecordBatch.empty("bench", mode)
        decode_chunk(c, 0, start=0, end=1 << 62, decode=mode, verify_crc=True, out=out)
        records += len(out)
    return records, time.perf_counter() - t0, time.process_time() - c0


def decode_only_figures(n: int = 1_000_000, scenarios: list[str] | None = None) -> dict[str, float]:
    """Records/s of ``decode_chunk`` per scenario, best of two passes (the machine is shared).

    ``name`` is records per wall-clock second; ``name + "/cpu"`` records per CPU second of this
    process, which is steadier when other work competes for the cores.
    """
    figures: dict[str, float] = {}
    for name, (make, mode) in _scenarios(n).items():
        if scenarios is not None and name not in scenarios:
            continue
        chunks = make()
        best = best_cpu = 0.0
        for _ in range(2):
            records, wall, cpu = _time_decode(chunks, mode)
            if records != n:
                raise AssertionError(f"{name}: decoded {records} records, built {n}")
            best = max(best, records / wall)
            best_cpu = max(best_cpu, records / max(cpu, 1e-9))
        figures[name] = best
        figures[name + "/cpu"] = best_cpu
        del chunks
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=1_000_000)
    parser.add_argument("--only", action="append", help="scenario name (repeatable)")
    parser.add_argument("--profile", help="cProfile one scenario instead of timing all")
    args = parser.parse_args()
    if args.profile:
        import cProfile
        import pstats

        make, mode = _scenarios(args.n)[args.profile]
        chunks = make()
        env = {"chunks": chunks, "mode": mode}
        cProfile.runctx("_time_decode(chunks, mode)", globals(), env, "/tmp/decode.prof")
        pstats.Stats("/tmp/decode.prof").sort_stats("tottime").print_stats(12)
        return
    accel = "C accelerator" if ACCELERATED else "pure Python (STREAMLEDGER_PURE_PYTHON or _accel not built)"
    print(f"decode-only, {args.n:,} records of ~100 bytes, {RECORDS_PER_CHUNK} records/chunk, CRC checked, "
          f"{accel}")
    figures = decode_only_figures(args.n, args.only)
    print(f"  {'scenario':24s} {'M rec/s (wall)':>15s} {'M rec/s (CPU)':>14s}")
    for name, rate in figures.items():
        if not name.endswith("/cpu"):
            print(f"  {name:24s} {rate / 1e6:15.2f} {figures[name + '/cpu'] / 1e6:14.2f}")


if __name__ == "__main__":
    main()
