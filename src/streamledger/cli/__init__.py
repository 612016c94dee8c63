"""The ``streamledger`` command line.

Each command group lives in its own module (``rabbitmq``, ``ledger``, ``tubemq``) and exposes
``register(subparsers)``; this module only wires them together and turns deliberate errors into
one clear line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from streamledger.errors import StreamledgerError

_GROUPS = (
    "streamledger.cli.rabbitmq",
    "streamledger.cli.ledger",
    "streamledger.cli.tubemq",
    "streamledger.cli.mewbase",
    "streamledger.cli.amqp",
    "streamledger.cli.spark",
    "streamledger.cli.batch",
)


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr (the house rule for every error) and exit status 2;
    the usage lines are left to ``--help``. Subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="streamledger", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("STREAMLEDGER_RABBITMQ_URL", "rabbitmq-stream://guest:guest@127.0.0.1:5552/"),
        help="broker URL, rabbitmq-stream[+tls]://user:pass@host:port/vhost "
        "(default: $STREAMLEDGER_RABBITMQ_URL or the local broker)",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import importlib

    for name in _GROUPS:
        module = importlib.import_module(name)
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        rc = args.func(args)
    except StreamledgerError as exc:
        print(f"streamledger: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("streamledger: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
