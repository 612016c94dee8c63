"""``streamledger amqp stream|superstream`` commands: RabbitMQ 4 topology over AMQP 1.0.

``create``/``delete``/``partitions`` are the transport-neutral commands of
:mod:`streamledger.cli.topology` with ``--transport amqp10`` as the default (this group is their old
name); ``stream info`` and ``stream purge`` are the /management node's own.

The broker is ``--amqp-url amqp[s]://user:pass@host:5672/vhost`` (or ``$STREAMLEDGER_AMQP_URL``, else
the local broker). The protocol client is imported only when a command runs, so ``streamledger --help``
stays fast. Every deliberate failure is one line on stderr (the URL in it has its password masked).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from streamledger.cli.topology import add_stream_commands, add_super_stream_commands, amqp_url, emit

if TYPE_CHECKING:
    from streamledger.protocol.amqp10 import Management


def _management(args: argparse.Namespace) -> Management:
    from streamledger.protocol.amqp10 import Management

    return Management.connect(amqp_url(args), timeout=args.timeout)


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
    emit(args, data, "\n".join(lines))
    return 0


def _stream_purge(args: argparse.Namespace) -> int:
    with _management(args) as m:
        count = m.purge_queue(args.name)
    emit(args, {"queue": args.name, "purged": count}, f"purged {count} message(s) from {args.name}")
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--amqp-url",
        default=argparse.SUPPRESS,
        help="amqp[s]://user:pass@host:port/vhost (default: $STREAMLEDGER_AMQP_URL or the local broker)",
    )
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")


def register(sub: Any) -> None:
    """Add ``amqp`` and its sub-commands to the top-level parser."""
    amqp = sub.add_parser("amqp", help="RabbitMQ 4 topology over AMQP 1.0 (the /management node)")
    groups = amqp.add_subparsers(dest="amqp_group", required=True, metavar="GROUP")

    stream = groups.add_parser("stream", help="create, delete, inspect or purge a stream")
    ss = stream.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_stream_commands(ss, transport="amqp10", prefix="amqp ")
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

    sup = groups.add_parser("superstream", help="create, delete or list a super stream")
    add_super_stream_commands(sup.add_subparsers(dest="action", required=True, metavar="ACTION"),
                              transport="amqp10", prefix="amqp ")
