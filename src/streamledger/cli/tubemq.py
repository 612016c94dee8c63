"""`streamledger tubemq ...`: register with a TubeMQ master, print what it said, close again.

Useful to check that a master list, topic or consumer group works before a pipeline depends on
it: the commands print the brokers and partitions learned and unregister before exiting.
The password for masters with authentication comes from ``$STREAMLEDGER_TUBEMQ_PASSWORD`` so it
never appears in a process list or shell history.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from streamledger.errors import StreamledgerError
from streamledger.protocol.tubemq import (
    ConsumerRegistration,
    Credentials,
    MasterClient,
    ProducerRegistration,
    parse_masters,
)

PASSWORD_ENV = "STREAMLEDGER_TUBEMQ_PASSWORD"


def register(sub: Any) -> None:
    """Add this group's sub-commands to the top-level parser."""
    group = sub.add_parser("tubemq", help="TubeMQ master registration checks")
    cmds = group.add_subparsers(dest="tubemq_command", required=True, metavar="SUBCOMMAND")

    producer = cmds.add_parser("register-producer", help="register a producer, print brokers and partitions")
    _common(producer)
    producer.set_defaults(func=_register_producer)

    consumer = cmds.add_parser("register-consumer", help="register a consumer, print assigned partitions")
    _common(consumer)
    consumer.add_argument("--group", required=True, help="consumer group name")
    consumer.add_argument(
        "--wait",
        type=float,
        default=15.0,
        help="seconds to wait for the master to assign partitions (default 15)",
    )
    consumer.set_defaults(func=_register_consumer)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--masters", required=True, help="master list host1:port1,host2:port2")
    parser.add_argument("--topic", required=True, action="append", help="topic (repeat or comma-separate)")
    parser.add_argument(
        "--user", help=f"user name when the master requires auth (password in ${PASSWORD_ENV})"
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="per-request timeout in seconds (default 10)"
    )
    parser.add_argument("--retries", type=int, default=5, help="register attempts per call (default 5)")
    # Also accepted after the sub-command; the global flag comes before it.
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")


def _client(args: argparse.Namespace) -> MasterClient:
    credentials = None
    if args.user:
        password = os.environ.get(PASSWORD_ENV)
        if password is None:
            raise StreamledgerError(f"--user given but ${PASSWORD_ENV} is not set")
        credentials = Credentials(args.user, password)
    return MasterClient(
        parse_masters(args.masters),
        credentials=credentials,
        rpc_timeout=args.timeout,
        max_register_retries=args.retries,
        background_heartbeat=False,
    )


def _topics(args: argparse.Namespace) -> list[str]:
    return [t.strip() for item in args.topic for t in item.split(",") if t.strip()]


def _register_producer(args: argparse.Namespace) -> int:
    with _client(args) as client:
        registration = client.register_producer(_topics(args))
    _print(registration, args)
    return 0


def _register_consumer(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.register_consumer(args.group, _topics(args))
        registration = client.wait_for_partitions(args.group, max(0.0, args.wait))
    _print(registration, args)
    return 0


def _print(registration: ProducerRegistration | ConsumerRegistration, args: argparse.Namespace) -> None:
    if getattr(args, "json", False):
        print(json.dumps(registration.to_dict(), indent=2, sort_keys=True))
        return
    data = registration.to_dict()
    role = data["role"]
    extra = f" group {data['group']}" if role == "consumer" else ""
    print(f"{role} {data['client_id']}{extra} registered with master {data['master']}")
    print(f"brokers ({len(data['brokers'])}):")
    for broker in data["brokers"]:
        print(f"  {broker['id']}  {broker['host']}:{broker['port']}")
    print(f"partitions ({len(data['partitions'])}):")
    for part in data["partitions"]:
        print(f"  {part['topic']}  broker {part['broker']['id']}  partition {part['partition']}")
    if role == "consumer" and not data["partitions"]:
        print("  (none assigned yet: the master rebalances periodically; try a longer --wait)")
    print("registration closed")
