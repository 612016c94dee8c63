"""The ``streamledger`` command line.

Each command group lives in its own module (``rabbitmq``, ``ledger``, ``tubemq``) and exposes
``register(subparsers)``; this module only wires them together and turns deliberate errors into
one line on stderr and the exit status docs/cli.md documents (:mod:`streamledger.cli.exits`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from streamledger.cli.exits import CLOSED_PIPE, INTERRUPTED, message_of, status_of
from streamledger.errors import OneLineParser

__all__ = ["OneLineParser", "build_parser", "main"]

_GROUPS = (
    "streamledger.cli.rabbitmq",
    "streamledger.cli.ledger",
    "streamledger.cli.tubemq",
    "streamledger.cli.mewbase",
    "streamledger.cli.amqp",
    "streamledger.cli.spark",
    "streamledger.cli.batch",
    "streamledger.cli.status",
    "streamledger.cli.check",
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("streamledger")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from streamledger.cli.options import add_broker, add_json, add_ledger

    parser = OneLineParser(prog="streamledger", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"streamledger {_version()}")
    add_broker(parser, top=True)
    add_ledger(parser, top=True)
    add_json(parser, top=True)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import importlib

    for name in _GROUPS:
        module = importlib.import_module(name)
        module.register(sub)
    _verbose_after_the_command(parser)
    return parser


def _verbose_after_the_command(parser: argparse.ArgumentParser) -> None:
    """``-v`` on every command's own parser too, so it is accepted before or after the command like
    the other common flags (docs/cli.md); SUPPRESS keeps a value given before the command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in {id(c): c for c in action.choices.values()}.values():
                if not any(a.dest == "verbose" for a in child._actions):
                    child.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                       help="log progress to stderr")
                _verbose_after_the_command(child)


def _closed_pipe() -> int:
    """stdout's reader went away (``| head``): not an error. Point stdout at /dev/null so the
    interpreter's own flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return CLOSED_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    rc = _main(argv)
    if argv is None and "pyspark.sql.connect.session" in sys.modules:
        # The process's own command (argv from sys.argv) that used a Spark Connect client: its
        # interpreter teardown (pyspark's client, pandas) would cost ~1 s after the work is done.
        from streamledger.processes import exit_now

        exit_now(rc)
    return rc


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        rc = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:
        print("streamledger: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:  # every failure is one line and a documented status (docs/cli.md)
        if args.verbose:
            traceback.print_exc()
        print(f"streamledger: error: {message_of(exc)}", file=sys.stderr)
        return status_of(exc)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
