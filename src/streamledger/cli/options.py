"""The flags every command shares (docs/cli.md, "Common flags" and "Offsets"), defined once.

Each common flag is accepted on the top-level parser and again after the command; the copy after the
command defaults to "not given" (``SUPPRESS``) so it never resets one given before it. Old spellings are
the same flag under another name, hidden from ``--help``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

from streamledger.cli.exits import BadInput
from streamledger.offsets import WORDS

if TYPE_CHECKING:
    from streamledger.ledger import Ledger

BROKER_ENV = "STREAMLEDGER_BROKER_URL"
OLD_BROKER_ENV = "STREAMLEDGER_RABBITMQ_URL"
LEDGER_ENV = "STREAMLEDGER_LEDGER_URL"
LOCAL_BROKER = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"


# -- argument types: bad input stops argparse (one line, exit 2) before anything is contacted ------


def broker_url_arg(text: str) -> str:
    """A log server URL that parses (the message never shows the URL: it may hold a password)."""
    from streamledger.sources import UnsupportedSource, log_kind

    try:
        kind = log_kind(text)
        if kind.name == "rabbitmq":
            from streamledger.protocol.rabbitmq.url import parse_url

            parse_url(text)
        elif kind.name == "mewbase":
            from streamledger.protocol.mewbase.url import parse_url as parse_mewbase

            parse_mewbase(text)
    except (UnsupportedSource, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def pipeline_arg(text: str) -> str:
    """A pipeline name the ledger can hold (the one rule, ``pipeline_name_problem``)."""
    from streamledger.ledger.types import pipeline_name_problem

    problem = pipeline_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def known_to(ledger: Ledger, pipeline: str | None, stream: str | None = None) -> None:
    """Refuse (exit 2, one line) a pipeline, or a stream of it (of any pipeline when none is named),
    the ledger has no record of: a typo would otherwise read as a clean, empty answer."""
    if pipeline is None:
        if stream is not None and not ledger.pipelines_of(stream):
            raise BadInput(f"stream {stream!r}: no pipeline in the ledger has a history of it "
                           "(`streamledger status` lists the streams)")
        return
    streams = ledger.streams_of(pipeline)
    if streams is None:
        raise BadInput(f"pipeline {pipeline!r}: the ledger has no such pipeline (`streamledger status` lists "
                       "them)")
    if stream is not None and stream not in streams:
        raise BadInput(f"pipeline {pipeline!r}: the ledger has no history of stream {stream!r}")


def ledger_url_arg(text: str) -> str:
    """A ledger URL the engine accepts (checked without connecting; the password never shown)."""
    from streamledger.ledger.engine import parse_url
    from streamledger.ledger.errors import LedgerError

    try:
        parse_url(text)
    except LedgerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def key_value_arg(text: str) -> str:
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"want KEY=VALUE, got {text.split('=')[0]!r}")
    return text


# -- properties (catalog, Spark): secrets from a file, never from the command line --------------------


def secret_free_arg(file_flag: str) -> Callable[[str], str]:
    """A ``KEY=VALUE`` argument type that refuses secrets: a command line is readable by every process
    on the machine (``ps``, shell history), so secrets come from ``file_flag``'s file."""

    def parse(text: str) -> str:
        from streamledger.redaction import is_secret_key, url_password

        key, _, value = key_value_arg(text).partition("=")
        if is_secret_key(key) or url_password(value):
            what = repr(key) if is_secret_key(key) else f"{key!r} holds a password and"
            raise argparse.ArgumentTypeError(
                f"{what} is a secret, which a command line shows to every process on the machine: "
                f"put it in {file_flag}")
        return text

    return parse


catalog_property_arg = secret_free_arg("--catalog-file")


def properties_of(path: str | None, items: list[str], file_flag: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of the file at ``path`` (``#`` comments), then ``items`` (which win).
    An unreadable or malformed file is bad input, named by path and line, never by content."""
    props: dict[str, str] = {}
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
            raise BadInput(f"{file_flag} {path}: {reason}") from None
        for number, raw in enumerate(lines, 1):
            text = raw.strip()
            if not text or text.startswith("#"):
                continue
            key, eq, value = text.partition("=")
            if not eq or not key.strip():
                raise BadInput(f"{file_flag} {path}: line {number} is not KEY=VALUE")
            props[key.strip()] = value.strip()
    for item in items:
        key, _, value = item.partition("=")
        props[key] = value
    return props


def add_catalog(p: argparse.ArgumentParser, default_help: str) -> None:
    p.add_argument("--catalog", action="append", default=[], type=catalog_property_arg, metavar="KEY=VALUE",
                   help=f"a pyiceberg catalog property, no secret (repeatable; default: {default_help})")
    p.add_argument("--catalog-file", default=None, metavar="PATH",
                   help="pyiceberg catalog properties, KEY=VALUE lines (# comments): where secrets go; "
                   "--catalog adds to or overrides them")


def catalog_of(args: argparse.Namespace) -> dict[str, str] | None:
    """The catalog properties of ``--catalog-file`` and ``--catalog`` (which wins), None for none."""
    return properties_of(getattr(args, "catalog_file", None), getattr(args, "catalog", None) or [],
                         "--catalog-file") or None


def add_spark_conf(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--conf", action="append", default=[], type=secret_free_arg("--conf-file"),
                   metavar="KEY=VALUE", help=f"{help_text}, no secret (repeatable)")
    p.add_argument("--conf-file", default=None, metavar="PATH",
                   help="Spark settings, KEY=VALUE lines (# comments): where secrets (S3 keys, tokens) go; "
                   "--conf adds to or overrides them")


def spark_conf_of(args: argparse.Namespace) -> dict[str, str]:
    """The Spark settings of ``--conf-file`` and ``--conf`` (which wins)."""
    return properties_of(getattr(args, "conf_file", None), getattr(args, "conf", None) or [], "--conf-file")


# -- positions: one vocabulary -----------------------------------------------------------------------

Word = Literal["first", "last", "next"]


@dataclass(frozen=True, slots=True)
class Position:
    """A position in a stream as the command line names it: a word, an offset or a timestamp."""

    word: Word | None = None
    offset: int | None = None
    timestamp_ms: int | None = None

    def __str__(self) -> str:
        if self.word is not None:
            return self.word
        return str(self.offset) if self.offset is not None else f"timestamp:{self.timestamp_ms}"


def position_arg(text: str) -> Position:
    """``first``, ``last``, ``next`` (and their aliases), an offset ``N >= 0`` or ``timestamp:MS``."""
    lowered = text.strip().lower()
    if lowered in WORDS:  # the one word table (offsets.WORDS): first/last/next and their aliases
        return Position(word=cast(Word, WORDS[lowered]))
    number = lowered.split(":", 1)[1] if lowered.startswith("timestamp:") else lowered
    if not number.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a position: use first, last, next, an offset N >= 0 or timestamp:MS")
    if lowered.startswith("timestamp:"):
        return Position(timestamp_ms=int(number))
    return Position(offset=int(number))


# -- the flags ---------------------------------------------------------------------------------------


def add_broker(parser: argparse.ArgumentParser, *, top: bool = False, help_extra: str = "") -> None:
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--broker-url", type=broker_url_arg, default=default, metavar="URL",
                        help="the log server: rabbitmq-stream[+tls]://user:pass@host:5552/vhost or "
                        f"mewbase://host:port (default: ${BROKER_ENV}){help_extra}")
    for old in ("--url", "--mewbase-url"):
        parser.add_argument(old, dest="broker_url", type=broker_url_arg, default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS)


def add_ledger(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--ledger", type=ledger_url_arg, default=default, metavar="URL",
                        help="the ledger database: sqlite:///FILE or postgresql+psycopg://user@host:5432/db "
                        f"(default: ${LEDGER_ENV} or $STREAMLEDGER_HOME/ledger.sqlite)")
    parser.add_argument("--db", dest="ledger", type=ledger_url_arg, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)


def add_json(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="print the command's data as JSON on stdout")


def broker_url(args: argparse.Namespace, *, env: tuple[str, ...] = (BROKER_ENV, OLD_BROKER_ENV),
               default: str | None = LOCAL_BROKER) -> str:
    """The broker URL: the flag, else the first environment variable set, else ``default``."""
    given = getattr(args, "broker_url", None)
    if isinstance(given, list):  # `ledger audit` repeats it
        given = given[0] if given else None
    url = given or next((os.environ[name] for name in env if os.environ.get(name)), None) or default
    if url is None:
        raise BadInput(f"no broker: pass --broker-url or set ${env[0]}")
    return url


def ledger_url(args: argparse.Namespace) -> str:
    from streamledger.ledger.engine import default_url

    return str(getattr(args, "ledger", None) or default_url())


def open_ledger(args: argparse.Namespace, *, write: bool = False) -> Ledger:
    """The ledger of ``--ledger``. A reading command (``write=False``) never creates one (a SQLite file
    that does not exist, or a database without the schema, is ``LedgerNotFound``, exit 3, with the
    command that creates it); a writing command creates and migrates it."""
    from streamledger.ledger import Ledger, LedgerSchemaMissing

    try:
        return Ledger(ledger_url(args), create=write)
    except LedgerSchemaMissing as exc:  # the library's advice is Python; a shell user runs a command
        raise LedgerSchemaMissing(exc.where, "run `streamledger ledger upgrade` (a first `streamledger batch "
                                  "run` also creates it)") from exc
