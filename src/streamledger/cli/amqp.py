"""``streamledger amqp stream|superstream`` commands: RabbitMQ 4 topology over AMQP 1.0.

The broker is ``--amqp-url amqp[s]://user:pass@host:5672/vhost`` (or ``$STREAMLEDGER_AMQP_URL``, else
the local broker). The protocol client is imported only when a command runs, so ``streamledger --help``
stays fast. Every deliberate failure is one line on stderr (the URL in it has its password masked).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamledger.protocol.amqp10 import Management, StreamOptions

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def _url(args: argparse.Namespace) -> str:
    return str(getattr(args, "amqp_url", None) or os.environ.get("STREAMLEDGER_AMQP_URL") or DEFAULT_AMQP_URL)


def _management(args: argparse.Namespace) -> Management:
    from streamledger.protocol.amqp10 import Management

    return Management.connect(_url(args), timeout=args.timeout)


def _options(args: argparse.Namespace) -> StreamOptions:
    from streamledger.protocol.amqp10 import StreamOptions

    return StreamOptions(
        max_age=args.max_age,
        max_length_bytes=args.max_length_bytes,
        max_segment_size_bytes=args.max_segment_size_bytes,
        initial_cluster_size=args.initial_cluster_size,
        leader_locator=args.leader_locator,
        filter_size_bytes=args.filter_size_bytes,
    )


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, sort_keys=True) if getattr(args, "json", False) else text)


def _keys(args: argparse.Namespace) -> list[str] | None:
    return [k.strip() for k in args.binding_keys.split(",")] if args.binding_keys else None


def _stream_create(args: argparse.Namespace) -> int:
    options = _options(args)
    with _management(args) as m:
        info = m.declare_stream(args.name, options)
    _emit(
        args,
        {"stream": args.name, "created": True, "info": info.as_dict()},
        f"created stream {args.name} (leader {info.leader or '-'}, members {', '.join(info.members) or '-'})",
    )
    return 0


def _stream_delete(args: argparse.Namespace) -> int:
    with _management(args) as m:
        m.delete_queue(args.name)
    _emit(args, {"stream": args.name, "deleted": True}, f"deleted stream {args.name}")
    return 0


def _stream_info(args: argparse.Namespace) -> int:
    with _management(args) as m:
        info = m.get_queue(args.name)
    data = info.as_dict()
    lines = [
        f"name: {info.name}",
        f"type: {info.type}",
        f"leader: {info.leader or '-'}",
        f"members: {', '.join(info.members) or '-'}",
        f"message_count: {'-' if info.message_count is None else info.message_count}",
        f"consumer_count: {'-' if info.consumer_count is None else info.consumer_count}",
    ]
    lines += [f"argument {k}: {v}" for k, v in sorted(data["arguments"].items())]
    _emit(args, data, "\n".join(lines))
    return 0


def _stream_purge(args: argparse.Namespace) -> int:
    with _management(args) as m:
        count = m.purge_queue(args.name)
    _emit(args, {"queue": args.name, "purged": count}, f"purged {count} message(s) from {args.name}")
    return 0


def _super_create(args: argparse.Namespace) -> int:
    from streamledger.protocol.amqp10 import InvalidUrl

    keys = _keys(args)
    if (args.partitions is None) == (keys is None):
        raise InvalidUrl("amqp superstream create needs exactly one of --partitions N or --binding-keys a,b")
    options = _options(args)
    with _management(args) as m:
        streams = m.create_super_stream(
            args.name, partitions=args.partitions, binding_keys=keys, options=options
        )
    _emit(
        args,
        {"super_stream": args.name, "partitions": streams},
        f"created super stream {args.name}: {', '.join(streams)}",
    )
    return 0


def _super_delete(args: argparse.Namespace) -> int:
    with _management(args) as m:
        streams = m.delete_super_stream(args.name, partitions=args.partitions, binding_keys=_keys(args))
    _emit(
        args,
        {"super_stream": args.name, "deleted": True, "partitions": streams},
        f"deleted super stream {args.name}" + (f": {', '.join(streams)}" if streams else ""),
    )
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--amqp-url",
        default=argparse.SUPPRESS,
        help="amqp[s]://user:pass@host:port/vhost (default: $STREAMLEDGER_AMQP_URL or the local broker)",
    )
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")


def _stream_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-age", help="retention by age, e.g. 7D, 12h, 30m")
    parser.add_argument("--max-length-bytes", type=int, help="retention by total size")
    parser.add_argument("--max-segment-size-bytes", type=int, help="segment file size")
    parser.add_argument("--initial-cluster-size", type=int, help="number of replicas, leader included")
    parser.add_argument(
        "--leader-locator", choices=("client-local", "balanced"), help="where the leader goes"
    )
    parser.add_argument("--filter-size-bytes", type=int, help="Bloom filter size per chunk (16..255)")


def register(sub: Any) -> None:
    """Add ``amqp`` and its sub-commands to the top-level parser."""
    amqp = sub.add_parser("amqp", help="RabbitMQ 4 topology over AMQP 1.0 (the /management node)")
    groups = amqp.add_subparsers(dest="amqp_group", required=True, metavar="GROUP")

    stream = groups.add_parser("stream", help="create, delete, inspect or purge a stream")
    ss = stream.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = ss.add_parser("create", help="declare a stream (idempotent for the same arguments)")
    p.add_argument("name")
    _stream_options(p)
    _common(p)
    p.set_defaults(func=_stream_create)
    p = ss.add_parser("delete", help="delete a stream (no error when absent)")
    p.add_argument("name")
    _common(p)
    p.set_defaults(func=_stream_delete)
    p = ss.add_parser("info", help="type, leader, members, message count and arguments")
    p.add_argument("name")
    _common(p)
    p.set_defaults(func=_stream_info)
    p = ss.add_parser(
        "purge", help="remove a queue's messages (streams cannot be purged: the broker says so)"
    )
    p.add_argument("name")
    _common(p)
    p.set_defaults(func=_stream_purge)

    sup = groups.add_parser("superstream", help="create or delete a super stream")
    sp = sup.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sp.add_parser("create", help="create a super stream exactly as the broker's CreateSuperStream does")
    p.add_argument("name")
    p.add_argument("--partitions", type=int, help="number of partitions NAME-0..NAME-(N-1)")
    p.add_argument("--binding-keys", help="comma-separated keys: partitions NAME-<key>")
    _stream_options(p)
    _common(p)
    p.set_defaults(func=_super_create)
    p = sp.add_parser("delete", help="delete a super stream's exchange and partition streams")
    p.add_argument("name")
    p.add_argument(
        "--partitions", type=int, help="partition count (default: NAME-0, NAME-1, ... while they exist)"
    )
    p.add_argument("--binding-keys", help="comma-separated keys of a super stream made with --binding-keys")
    _common(p)
    p.set_defaults(func=_super_delete)
