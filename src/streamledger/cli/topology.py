"""``stream`` and ``superstream`` create/delete/partitions: one command tree for both transports.

``streamledger stream|superstream ...`` uses the stream protocol by default, ``streamledger amqp
stream|superstream ...`` AMQP 1.0 (its old name, kept as an alias); ``--transport`` picks either
anywhere. The commands speak only :class:`streamledger.topology.Topology`.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from streamledger.cli.exits import BadInput
from streamledger.cli.options import add_broker, add_json, broker_url
from streamledger.topology import TRANSPORTS, StreamSettings, open_topology

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def amqp_url(args: argparse.Namespace) -> str:
    return str(getattr(args, "amqp_url", None) or os.environ.get("STREAMLEDGER_AMQP_URL") or DEFAULT_AMQP_URL)


def emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, sort_keys=True) if getattr(args, "json", False) else text)


def _topology(args: argparse.Namespace) -> Any:
    return open_topology(args.transport, url=broker_url(args), amqp_url=amqp_url(args), timeout=args.timeout)


def _settings(args: argparse.Namespace) -> StreamSettings:
    return StreamSettings(
        max_age=args.max_age, max_length_bytes=args.max_length_bytes,
        max_segment_size_bytes=args.max_segment_size_bytes, initial_cluster_size=args.initial_cluster_size,
        leader_locator=args.leader_locator, filter_size_bytes=args.filter_size_bytes,
    )


def _keys(args: argparse.Namespace) -> list[str] | None:
    return [k.strip() for k in args.binding_keys.split(",")] if args.binding_keys else None


def _stream_create(args: argparse.Namespace) -> int:
    with _topology(args) as topology:
        created = topology.create_stream(args.name, _settings(args), exists_ok=args.exists_ok)
        info = topology.placement(args.name)
    data: dict[str, Any] = {"stream": args.name, "created": created}
    text = f"created stream {args.name}" if created else f"stream {args.name} already exists"
    if info is not None:
        data["info"] = info
        text += f" (leader {info['leader'] or '-'}, members {', '.join(info['members']) or '-'})"
    emit(args, data, text)
    return 0


def _stream_delete(args: argparse.Namespace) -> int:
    with _topology(args) as topology:
        existed = topology.delete_stream(args.name, missing_ok=args.missing_ok)
    emit(args, {"stream": args.name, "deleted": existed},
         f"deleted stream {args.name}" if existed else f"stream {args.name} was already absent")
    return 0


def _super_create(args: argparse.Namespace) -> int:
    keys = _keys(args)
    if (args.partitions is None) == (keys is None):
        raise BadInput(f"{args.prefix}superstream create needs exactly one of --partitions N or "
                       "--binding-keys a,b")
    with _topology(args) as topology:
        parts, created = topology.create_super_stream(
            args.name, partitions=args.partitions, binding_keys=keys, settings=_settings(args),
            exists_ok=args.exists_ok,
        )
    emit(args, {"super_stream": args.name, "partitions": parts},
         f"{'created super stream' if created else 'super stream already exists,'} {args.name}: "
         f"{', '.join(parts)}")
    return 0


def _super_delete(args: argparse.Namespace) -> int:
    with _topology(args) as topology:
        parts = topology.delete_super_stream(args.name, partitions=args.partitions, binding_keys=_keys(args),
                                             missing_ok=args.missing_ok)
    emit(args, {"super_stream": args.name, "deleted": True, "partitions": parts},
         f"deleted super stream {args.name}" + (f": {', '.join(parts)}" if parts else ""))
    return 0


def _super_partitions(args: argparse.Namespace) -> int:
    with _topology(args) as topology:
        parts = topology.partitions(args.name)
    emit(args, {"super_stream": args.name, "partitions": parts}, "\n".join(parts))
    return 0


def common(parser: argparse.ArgumentParser, transport: str) -> None:
    """Options of every topology command: the transport and how to reach it."""
    parser.add_argument("--transport", choices=TRANSPORTS, default=transport,
                        help=f"stream protocol or AMQP 1.0 /management (default {transport})")
    add_broker(parser)
    parser.add_argument(
        "--amqp-url", default=argparse.SUPPRESS,
        help="amqp[s]://user:pass@host:port/vhost for --transport amqp10 "
        "(default: $STREAMLEDGER_AMQP_URL or the local broker)",
    )
    add_json(parser)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")


def _stream_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-age", help="retention by age, e.g. 7D, 12h, 30m")
    parser.add_argument("--max-length-bytes", type=int, help="retention by total size")
    parser.add_argument("--max-segment-size-bytes", type=int, help="segment file size")
    parser.add_argument("--initial-cluster-size", type=int, help="replicas, leader included (amqp10)")
    parser.add_argument(
        "--leader-locator", choices=("client-local", "balanced"), help="where the leader goes (amqp10)"
    )
    parser.add_argument("--filter-size-bytes", type=int, help="Bloom filter size per chunk, 16..255 (amqp10)")


def add_stream_commands(ss: Any, *, transport: str, prefix: str = "") -> None:
    """``create`` and ``delete`` under a ``stream`` group. Over AMQP 1.0 (the ``amqp`` alias) both
    were idempotent from the start, so there ``--exists-ok`` / ``--missing-ok`` are the default."""
    idempotent = transport == "amqp10"
    p = ss.add_parser("create", help="create a stream (same arguments again: see --exists-ok)")
    p.add_argument("name")
    _stream_options(p)
    p.add_argument("--exists-ok", action="store_true", default=idempotent,
                   help="no error if it exists with these arguments")
    common(p, transport)
    p.set_defaults(func=_stream_create, prefix=prefix)
    p = ss.add_parser("delete", help="delete a stream")
    p.add_argument("name")
    p.add_argument("--missing-ok", action="store_true", default=idempotent, help="no error when absent")
    common(p, transport)
    p.set_defaults(func=_stream_delete, prefix=prefix)


def add_super_stream_commands(sp: Any, *, transport: str, prefix: str = "") -> None:
    """``create``, ``delete`` and ``partitions`` under a ``superstream`` group."""
    idempotent = transport == "amqp10"
    p = sp.add_parser("create", help="create a super stream as the broker's CreateSuperStream does")
    p.add_argument("name")
    p.add_argument("--partitions", type=int, help="number of partitions NAME-0..NAME-(N-1)")
    p.add_argument("--binding-keys", help="comma-separated keys: partitions NAME-<key>")
    _stream_options(p)
    p.add_argument("--exists-ok", action="store_true", default=idempotent,
                   help="no error if it exists in this shape")
    common(p, transport)
    p.set_defaults(func=_super_create, prefix=prefix)
    p = sp.add_parser("delete", help="delete a super stream and its partition streams")
    p.add_argument("name")
    p.add_argument("--partitions", type=int,
                   help="amqp10: partition count (default: as the stream port lists them, else probed)")
    p.add_argument("--binding-keys", help="amqp10: comma-separated keys of a super stream made with them")
    p.add_argument("--missing-ok", action="store_true", default=idempotent, help="no error when absent")
    common(p, transport)
    p.set_defaults(func=_super_delete, prefix=prefix)
    p = sp.add_parser("partitions", help="list the partition streams in order")
    p.add_argument("name")
    common(p, transport)
    p.set_defaults(func=_super_partitions, prefix=prefix)
