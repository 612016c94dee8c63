"""``streamledger check``: before a first batch, try each thing a batch needs and say in one line each
whether it works: the broker, the ledger, Spark (pyspark and a Java runtime; no JVM is started) and the
output root. Creates nothing. Exit 0 when all work, 3 when the broker or ledger cannot be reached,
1 when something else is missing (docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from streamledger.cli.exits import OK, UNREACHABLE, message_of, status_of
from streamledger.cli.options import add_broker, add_json, add_ledger, broker_url, ledger_url, open_ledger


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing tried: what, whether it works, and the one line that says so."""

    what: str
    ok: bool
    detail: str
    status: int = OK


def _broker(args: argparse.Namespace) -> Finding:
    from streamledger.sources import connect_log, server_name

    url = broker_url(args)
    try:
        with connect_log(url) as log:
            name = server_name(log) or "no cluster name"
            version = getattr(log, "server_version", None)
        return Finding("broker", True, f"{_shown(url)}: {name}" + (f", version {version}" if version else ""))
    except Exception as exc:
        return Finding("broker", False, message_of(exc), status_of(exc))


def _shown(url: str) -> str:
    from streamledger.sources import log_kind

    try:
        kind = log_kind(url)
        if kind.name == "rabbitmq":
            from streamledger.protocol.rabbitmq.url import parse_url

            return parse_url(url).redacted()
        from streamledger.protocol.mewbase.url import parse_url as parse_mewbase

        return parse_mewbase(url).redacted()
    except Exception:
        return "the broker URL"


def _ledger(args: argparse.Namespace) -> Finding:
    from streamledger.ledger.engine import safe_url

    try:
        with open_ledger(args) as ledger:
            pipelines = sorted({r.pipeline for r in ledger.ranges()})
        return Finding("ledger", True, f"{safe_url(ledger_url(args))}: schema at head, "
                       f"{len(pipelines)} pipeline(s)")
    except Exception as exc:
        new = _new_ledger(args, exc)
        return new or Finding("ledger", False, message_of(exc), status_of(exc))


def _new_ledger(args: argparse.Namespace, exc: Exception) -> Finding | None:
    """A ledger without its schema yet (a new SQLite file, an empty PostgreSQL database that answered)
    is fine: the first batch creates and migrates it."""
    from streamledger.ledger import LedgerNotFound, LedgerSchemaMissing
    from streamledger.ledger.engine import parse_url, safe_url

    if not isinstance(exc, LedgerNotFound | LedgerSchemaMissing):
        return None
    url = ledger_url(args)
    first = "`streamledger batch run` or `streamledger ledger upgrade`"
    if isinstance(exc, LedgerSchemaMissing):
        return Finding("ledger", True, f"{safe_url(url)}: reachable, no ledger schema yet; {first} "
                       "creates it")
    path = Path(parse_url(url).database or "")
    existing = next((p for p in path.parents if p.exists()), None)
    if existing is None or not os.access(existing, os.W_OK | os.X_OK):
        return None
    return Finding("ledger", True, f"{safe_url(url)}: does not exist yet; {first} creates it")


def _spark() -> Finding:
    if find_spec("pyspark") is None:
        return Finding("spark", False, 'pyspark is not installed: pip install "streamledger[spark]"', 1)
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (str(Path(java_home, "bin", "java")) if java_home else None)
    if not java or not Path(java).exists():
        return Finding("spark", False, "pyspark is installed but no Java runtime was found (JAVA_HOME or "
                       "java on PATH; local Spark needs JDK 17 or 21), or use --remote sc://HOST:PORT", 1)
    return Finding("spark", True, f"pyspark installed, Java at {java}")


def _output(root: str | None) -> Finding:
    if not root:
        return Finding("output", True, "not checked (give --output-root)")
    if "://" in root and not root.startswith("file://"):
        from streamledger import fs

        try:  # the batch's own check of a location its tasks write through pyarrow.fs
            fs.check_location(root)
        except fs.LocationError as exc:
            return Finding("output", False, str(exc), 1)
        return Finding("output", True, f"{fs.redact(root)}: its bucket answers")
    path = Path(root.removeprefix("file://"))
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        return Finding("output", False, f"{root}: no directory to create it in", 1)
    if not os.access(existing, os.W_OK | os.X_OK):
        return Finding("output", False, f"{root}: {existing} is not writable", 1)
    where = "" if existing == path else f" (will be created under {existing})"
    return Finding("output", True, f"{root}: writable{where}")


def _check(args: argparse.Namespace) -> int:
    findings = [_broker(args), _ledger(args), _spark(), _output(args.output_root)]
    if getattr(args, "json", False):
        print(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        for f in findings:
            print(f"{f.what:<7} {'ok  ' if f.ok else 'FAIL'} {f.detail}")
    failed = [f.status or 1 for f in findings if not f.ok]
    return UNREACHABLE if UNREACHABLE in failed else (1 if failed else OK)


def register(sub: Any) -> None:
    """Add ``check`` to the top-level parser."""
    p = sub.add_parser("check", help="try the broker, the ledger, Spark and the output root; one line each")
    add_broker(p)
    add_ledger(p)
    add_json(p)
    p.add_argument("--output-root", default=None, metavar="ROOT", help="where batches will write")
    p.set_defaults(func=_check)
