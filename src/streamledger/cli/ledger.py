"""``streamledger ledger upgrade|downgrade|audit|ranges|release-stale|rename-broker|distinct-brokers|``
``new-epoch|skip`` commands.

The database comes from ``--ledger URL`` (old name ``--db``; default ``$STREAMLEDGER_LEDGER_URL`` or
the SQLite file under ``$STREAMLEDGER_HOME``); only ``upgrade`` creates one (docs/cli.md). ``audit``
exits 0 when the ledger is clean, 1 on any violation and 3 when the database cannot be reached, so it
can gate a pipeline; with ``--broker-url`` (repeatable) it also compares the stored offsets of each
source on its own log server, a RabbitMQ stream broker or a mewbase server, recognised by the identity
the batch records (the cluster name it reports, see :func:`streamledger.sources.server_identities`);
sources of servers not given are skipped with a note. Clients are imported only then.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamledger.cli.exits import BadInput
from streamledger.cli.options import (
    BROKER_ENV,
    OLD_BROKER_ENV,
    add_catalog,
    add_json,
    add_ledger,
    broker_url,
    broker_url_arg,
    catalog_of,
    known_to,
    ledger_url,
    open_ledger,
    pipeline_arg,
)
from streamledger.cli.progress import AuditProgress
from streamledger.cli.table import render, when
from streamledger.runs import describe

if TYPE_CHECKING:  # the ledger pulls in SQLAlchemy and Alembic (~0.35 s): imported when a command runs
    from streamledger.ledger import Ledger, OffsetQuerier, OffsetRange, SourceRef


# -- argument types: bad input stops argparse (one line, exit 2) before a ledger is opened --------

MAX_SECONDS = 100 * 365 * 86400
"""A duration's upper bound: ``now - duration`` must still be a date."""


def _seconds(text: str) -> float:
    """A duration in seconds: a finite number in ``0..MAX_SECONDS``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"seconds must be in 0..{MAX_SECONDS} (100 years), got {text}")
    return value


def _report_file(text: str) -> Path:
    """A file the report can be written to: its directory exists and it is not itself a directory."""
    path = Path(text)
    folder = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"directory {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {folder} is not writable")
    return path


def _ledger(args: argparse.Namespace) -> Ledger:
    """The existing ledger (every command here but ``upgrade`` reads or changes one; none creates it)."""
    return open_ledger(args)


def _migrate(args: argparse.Namespace, action: str) -> int:
    from streamledger.ledger import migrate
    from streamledger.ledger.engine import make_engine

    url = ledger_url(args)
    engine = make_engine(url, create=action == "upgrade")  # a downgrade of nothing creates nothing
    try:
        before = migrate.current(engine)
        if action == "upgrade":
            migrate.upgrade(engine, args.revision)
        else:
            migrate.downgrade(engine, args.revision)
        after = migrate.current(engine)
    finally:
        engine.dispose()
    from streamledger.ledger.engine import safe_url

    if getattr(args, "json", False):
        print(json.dumps({"ledger": safe_url(url), "before": before, "after": after}))
    else:
        print(f"ledger at {safe_url(url)}: {before or 'empty'} -> {after or 'empty'}")
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    return _migrate(args, "upgrade")


def _downgrade(args: argparse.Namespace) -> int:
    return _migrate(args, "downgrade")


def _broker_lookups(stack: contextlib.ExitStack, urls: list[str]) -> dict[str, OffsetQuerier]:
    """Connect to each server and map every ledger identity it answers for to its client (stored
    offsets, and the chunk headers a re-created stream is told apart by)."""
    from streamledger.sources import connect_log, server_identities

    lookups: dict[str, OffsetQuerier] = {}
    for url in urls:
        client = stack.enter_context(connect_log(url))
        for identity in server_identities(url, client):
            lookups.setdefault(identity, client)
    return lookups


def _audit(args: argparse.Namespace) -> int:
    from streamledger.batch.proof import audit

    with _ledger(args) as ledger, contextlib.ExitStack() as stack:
        known_to(ledger, args.pipeline)
        stale = timedelta(seconds=args.stale_after)
        shown = AuditProgress(f"audit {args.pipeline or 'all pipelines'}")
        check: dict[str, Any] = {"outputs_too": args.outputs, "deep": args.deep,
                                 "catalog": catalog_of(args), "progress": shown.step}
        # the flag, else the broker every other command uses (a password stays off the command line)
        urls = getattr(args, "broker_url", None) or [
            os.environ[e] for e in (BROKER_ENV, OLD_BROKER_ENV) if os.environ.get(e)][:1]
        stack.callback(shown.close)  # the live display ends on failure too
        if urls:
            brokers = _broker_lookups(stack, [urls] if isinstance(urls, str) else urls)
            report = audit(ledger, args.pipeline, broker=brokers, stale_after=stale, **check)
        else:
            report = audit(ledger, args.pipeline, stale_after=stale, **check)
        shown.done()
        if args.html:
            from streamledger.ledger.html import render_html

            page = render_html(ledger, report, pipeline=args.pipeline)
            try:
                args.html.write_text(page, encoding="utf-8")
            except OSError as exc:
                raise BadInput(f"--html {args.html}: cannot write it: {exc.strerror or exc}") from None
    print(report.to_json() if getattr(args, "json", False) else report.to_text())
    if args.html:
        print(f"HTML report written to {args.html}", file=sys.stderr)
    return 0 if report.clean else 1


def _range_line(r: OffsetRange) -> str:
    seen = f" seen {r.first_seen}..{r.last_seen}" if r.first_seen is not None else ""
    records = f" records={r.records}" if r.records is not None else ""
    stored = " offset-stored" + ("+verified" if r.offset_verified else "") if r.offset_stored else ""
    err = f" error={r.error!r}" if r.error else ""
    return (
        f"{r.id:>8} {r.pipeline} {r.source.stream} [{r.start}, {r.end}) {r.status.value:<9} "
        f"{r.run}{records}{seen}{stored}{err}"
    )


RANGE_HEADER = ("ID", "PIPELINE", "STREAM", "RANGE", "STATUS", "RECORDS", "WHEN", "PUBLISHED", "OFFSET",
                "RUN", "OUTPUT")


def _range_row(r: OffsetRange) -> tuple[object, ...]:
    """One range as ``ledger ranges`` shows it: WHEN is when it was committed (else claimed)."""
    stored = ("verified" if r.offset_verified else "stored") if r.offset_stored else "-"
    output = r.sink_table or r.output or (f"error: {r.error}" if r.error else None)
    return (r.id, r.pipeline, r.source.stream, f"[{r.start}, {r.end})", r.status.value, r.records,
            when(r.committed_at or r.claimed_at), when(r.published_at), stored, describe(r.run), output)


def _since(text: str) -> datetime:
    """``--since``: an ISO 8601 time (UTC without a zone) or a span back from now (90s, 30m, 12h, 7d)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    stripped = text.strip().lower()
    if stripped[-1:] in units and stripped[:-1].replace(".", "", 1).isdigit():
        back = timedelta(seconds=float(stripped[:-1]) * units[stripped[-1]])
        return datetime.now(UTC).replace(tzinfo=None) - back
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time nor a span like 30m, 12h or 7d") from None
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def _limit(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _ranges(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        known_to(ledger, args.pipeline, args.stream)
        rows = ledger.ranges(args.pipeline, stream=args.stream)
    if args.status:
        rows = [r for r in rows if r.status.value in args.status]
    if args.since is not None:
        rows = [r for r in rows if (r.committed_at or r.claimed_at) >= args.since]
    if args.limit is not None:  # the newest N, listed in the usual order
        newest = set(sorted(r.id for r in rows)[-args.limit:])
        rows = [r for r in rows if r.id in newest]
    if getattr(args, "json", False):
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        if rows:
            print(render(RANGE_HEADER, [_range_row(r) for r in rows], right=("ID", "RECORDS")))
        print(f"{len(rows)} range(s)", file=sys.stderr)
    return 0


def _release_stale(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        released = ledger.release_stale(timedelta(seconds=args.older_than), pipeline=args.pipeline)
    if getattr(args, "json", False):
        print(json.dumps([r.to_dict() for r in released], indent=2))
    else:
        for r in released:
            print("released " + _range_line(r))
        print(f"{len(released)} stale claim(s) released", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _broker_of(args: argparse.Namespace, identity: str) -> Iterator[Any]:
    """The log server a cure is checked on (``--broker-url``, else the broker every other command
    uses), refused in one line unless it answers for ``identity``: a check on another broker proves
    nothing."""
    from streamledger.sources import connect_log, server_identities

    url = broker_url(args)
    with connect_log(url) as client:
        answers = server_identities(url, client)
        if identity not in answers:
            raise BadInput(f"the broker reached (--broker-url or ${BROKER_ENV}) answers for {answers[0]}, "
                           f"not for {identity}: give the URL of {identity}'s broker to check the request on")
        yield client


def _cure(args: argparse.Namespace, ledger: Ledger, what: str) -> contextlib.AbstractContextManager[Any]:
    """The transaction a cure writes in: rolled back under ``--dry-run`` (its rules, refusals
    included, run all the same)."""
    return ledger.rehearsal(what) if args.dry_run else contextlib.nullcontext()


def _said(args: argparse.Namespace, line: str) -> str:
    return f"dry run, nothing changed: would have {line}" if args.dry_run else line


def _source(args: argparse.Namespace) -> SourceRef:
    from streamledger.ledger import SourceRef
    from streamledger.sources import canonical_identity

    return SourceRef(broker=canonical_identity(args.broker), stream=args.stream)  # any spelling of it


def _new_epoch(args: argparse.Namespace) -> int:
    from streamledger.batch.identity import unchanged_because

    src = _source(args)
    broker = src.broker
    reason = (args.reason or "").strip()
    if args.force and not reason:
        raise BadInput("new-epoch --force: give --reason (recorded with the new epoch)")
    what = f"new epoch for pipeline {args.pipeline!r} stream {args.stream!r} on {broker}"
    with _ledger(args) as ledger:
        if not args.force:
            with _broker_of(args, broker) as client:
                pos = ledger.position(args.pipeline, src)
                # a history without a live range may still hold the chunk its first claim saw
                same = (unchanged_because(client, args.stream, args.pipeline, pos)
                        if pos.end is not None or pos.chunk is not None else None)
            if same is not None:
                raise BadInput(f"{what}: refused, the broker still holds the stream the ledger read: {same}; "
                               "a new epoch would read it again from offset 0 (--force --reason WHY if you "
                               "know better)")
        recorded = f"forced: {reason}" if args.force else reason
        with _cure(args, ledger, what):
            old, new = ledger.new_epoch(args.pipeline, src, reason=recorded)
    if getattr(args, "json", False):
        print(json.dumps({"pipeline": args.pipeline, "stream": args.stream, "broker": broker,
                          "retired_epoch": old, "epoch": new, "forced": args.force, "dry_run": args.dry_run}))
        return 0
    print(_said(args, f"pipeline {args.pipeline} stream {args.stream} on {broker}: epoch {old} retired (kept "
                      f"under {broker}#epoch{old}); epoch {new} reads the stream from its first offset"))
    return 0


def _offset(text: str) -> int:
    """An offset: a non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an offset (an integer), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"an offset is not negative, got {value}")
    return value


def _skip(args: argparse.Namespace) -> int:
    src = _source(args)
    with _broker_of(args, src.broker) as client:
        tail = int(client.committed_tail(args.stream))  # a span past it would stall every later batch
    with _ledger(args) as ledger, _cure(args, ledger, f"skip on {args.stream!r}"):
        rng = ledger.record_skipped(args.pipeline, src, args.start, args.end, reason=args.reason, tail=tail)
    if getattr(args, "json", False):
        print(json.dumps({**rng.to_dict(), "dry_run": args.dry_run}, default=str))
        return 0
    print(_said(args, f"pipeline {args.pipeline} stream {args.stream} on {src.broker}: "
                      f"[{rng.start}, {rng.end}) recorded as deliberately skipped (range {rng.id}; broker "
                      f"tail {tail}): {args.reason}"))
    return 0


def _two_names(ledger: Ledger, first: str, second: str) -> tuple[str, str]:
    """Two broker identities as the ledger spells them (``Ledger.as_recorded``: any spelling of one
    names it), refused when they are one broker spelled twice."""
    a, b = ledger.as_recorded(first), ledger.as_recorded(second)
    if a == b:
        raise BadInput(f"{first} and {second} are one broker ({a}) in two spellings; the next batch of a "
                       "pipeline adopts its records of another spelling itself")
    return a, b


def _rename_broker(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        old, new = _two_names(ledger, args.old, args.new)
        with _cure(args, ledger, f"rename broker {old}"):
            moved = ledger.rename_broker(old, new, pipeline=args.pipeline)
    if getattr(args, "json", False):
        print(json.dumps({"old": old, "new": new, "moved": moved, "dry_run": args.dry_run}))
    else:
        print(_said(args, f"{moved} source(s) moved from {old} to {new}"))
    return 0


def _distinct_brokers(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        names = list(_two_names(ledger, args.name1, args.name2))  # as the ledger names them
        with _cure(args, ledger, "distinct brokers"):
            judged = ledger.record_distinct_brokers(*names, pipeline=args.pipeline, stream=args.stream,
                                                    why=args.reason)
    if getattr(args, "json", False):
        print(json.dumps({"names": names, "pipeline": args.pipeline, "stream": args.stream,
                          "judged": [{"pipeline": p, "stream": s} for p, s in judged],
                          "dry_run": args.dry_run}))
    else:
        covers = "; ".join(f"pipeline {p!r} stream {s!r}" for p, s in judged)  # a too-wide verdict is seen
        print(_said(args, f"{names[0]} and {names[1]} recorded as two brokers for {len(judged)} stream(s) "
                          f"({covers}): neither refuses the other's batches, and the audit no longer takes "
                          "them for one (it notes each stream read under both)"))
    return 0


def _status(text: str) -> str:
    """A range status (checked when given: the ledger's types are not imported to build the parser)."""
    from streamledger.ledger.types import RangeStatus

    known = [s.value for s in RangeStatus]
    if text not in known:
        raise argparse.ArgumentTypeError(f"{text!r} is not a range status: {', '.join(known)}")
    return text


def _add_dry_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="check the request and say what it would change; "
                   "change nothing")


def _add_check_broker(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker-url", type=broker_url_arg, default=None, metavar="URL",
                   help=f"the log server the request is checked on (default: ${BROKER_ENV}, else the local "
                   "broker); it must answer for --broker")


def register(sub: Any) -> None:
    """Add the ``ledger`` command group to the top-level parser."""
    group = sub.add_parser("ledger", help="the SQL offset ledger: migrate, audit, list, release")
    cmds = group.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND")

    p = cmds.add_parser("upgrade", help="create or migrate the ledger schema (Alembic, own version table)")
    add_ledger(p)
    p.add_argument("--revision", default="head", help="target revision (default: head)")
    add_json(p)
    p.set_defaults(func=_upgrade)

    p = cmds.add_parser("downgrade", help="migrate the ledger schema back (`base` drops the ledger tables)")
    add_ledger(p)
    p.add_argument("--revision", required=True, help="target revision, or base")
    add_json(p)
    p.set_defaults(func=_downgrade)

    p = cmds.add_parser("audit", help="check gaps, overlaps, stuck claims, failures, counts, broker drift")
    add_ledger(p)
    p.add_argument("--pipeline", type=pipeline_arg, default=None, help="audit only this pipeline")
    p.add_argument(
        "--broker-url",
        action="append",
        type=broker_url_arg,
        default=argparse.SUPPRESS,
        metavar="URL",
        help="also compare the stored offsets of the sources on this log server "
        "(rabbitmq-stream[+tls]://... or mewbase://host:port; repeatable: each source is compared on "
        f"its own server, sources of servers not given are skipped with a note; default: ${BROKER_ENV})",
    )
    p.add_argument(
        "--stale-after",
        type=_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="claims older than this count as stuck (default 3600)",
    )
    p.add_argument(
        "--html", type=_report_file, default=None, metavar="FILE", help="also write an HTML report (coverage)"
    )
    p.add_argument("--no-outputs", dest="outputs", action="store_false",
                   help="do not check the published outputs against the ledger (checked by default)")
    p.add_argument("--deep", action="store_true",
                   help="also count the rows in every published range's data files")
    add_catalog(p, "the SQL catalog in the ledger's database, for the pipeline's Iceberg table")
    add_json(p)
    p.set_defaults(func=_audit)

    p = cmds.add_parser("ranges", help="list the ranges: what was read, when, where it went")
    add_ledger(p)
    p.add_argument("--pipeline", type=pipeline_arg, default=None, help="only this pipeline")
    p.add_argument("--stream", default=None, help="only this stream (or super stream partition)")
    p.add_argument("--status", action="append", default=[], type=_status, metavar="STATUS",
                   help="only ranges in this status (repeatable)")
    p.add_argument("--since", type=_since, default=None, metavar="TIME",
                   help="only ranges committed (or claimed) since TIME: ISO 8601 or a span like 12h, 7d")
    p.add_argument("--limit", type=_limit, default=None, metavar="N", help="only the newest N ranges")
    add_json(p)
    p.set_defaults(func=_ranges)

    p = cmds.add_parser("rename-broker", help="move histories to another broker identity (one per cluster; "
                        "records of one broker under two names follow, a pair made one name is cleared)")
    add_ledger(p)
    p.add_argument("old", help="e.g. rabbitmq://127.0.0.1:5552/%%2F (the 0.1 host:port form)")
    p.add_argument("new", help="e.g. rabbitmq://rabbit@node1/%%2F (the broker's cluster name)")
    p.add_argument("--pipeline", default=None)
    _add_dry_run(p)
    add_json(p)
    p.set_defaults(func=_rename_broker)

    p = cmds.add_parser("distinct-brokers", help="record the verdict that two broker identities are two "
                        "brokers (mirrors fed the same records, which a chunk print takes for one broker): "
                        "neither refuses the other's batches, and the audit no longer reports them as one")
    add_ledger(p)
    p.add_argument("name1", help="a broker identity as the ledger names it (the refusal prints both)")
    p.add_argument("name2", help="the other broker identity")
    p.add_argument("--pipeline", default=None, help="only this pipeline (default: every pipeline either "
                   "name has a history or record of)")
    p.add_argument("--stream", default=None, help="only this stream (default: every stream either name has a "
                   "history or record of; with --pipeline, names a stream to judge ahead of any history)")
    p.add_argument("--reason", default="", help="recorded with the verdict (shown with the records)")
    _add_dry_run(p)
    add_json(p)
    p.set_defaults(func=_distinct_brokers)

    p = cmds.add_parser("new-epoch", help="a stream was deleted and re-created: keep its history, start anew")
    add_ledger(p)
    p.add_argument("--pipeline", type=pipeline_arg, required=True)
    p.add_argument("--stream", required=True, help="the stream (or super stream partition)")
    p.add_argument("--broker", required=True,
                   help="the broker identity as the ledger names it (the batch's refusal prints it)")
    p.add_argument("--reason", default=None, help="recorded with the new epoch")
    p.add_argument("--force", action="store_true", help="start a new epoch although the broker still holds "
                   "the stream the ledger read (needs --reason, recorded)")
    _add_check_broker(p)
    _add_dry_run(p)
    add_json(p)
    p.set_defaults(func=_new_epoch)

    p = cmds.add_parser("skip", help="record a span nobody will read as deliberately skipped (audited)")
    add_ledger(p)
    p.add_argument("--pipeline", type=pipeline_arg, required=True)
    p.add_argument("--stream", required=True, help="the stream (or super stream partition)")
    p.add_argument("--broker", required=True, help="the broker identity as the ledger names it")
    p.add_argument("--start", type=_offset, required=True, help="first offset skipped")
    p.add_argument("--end", type=_offset, required=True, help="first offset after the span (exclusive)")
    p.add_argument("--reason", required=True, help="why nobody reads it (recorded, shown by the audit)")
    _add_check_broker(p)
    _add_dry_run(p)
    add_json(p)
    p.set_defaults(func=_skip)

    p = cmds.add_parser("release-stale", help="fail claims not heard from for --older-than seconds")
    add_ledger(p)
    p.add_argument("--older-than", type=_seconds, required=True, metavar="SECONDS")
    p.add_argument("--pipeline", default=None)
    add_json(p)
    p.set_defaults(func=_release_stale)
