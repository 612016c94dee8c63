"""``streamledger batch run``: one batch from the command line (cron, Kubernetes jobs, any scheduler).

The same ``--run-id`` is a retry of the same run identity (it gets its claim back, and its try
number is one past the ledger's last try of it); without one, each call is a new run. A new SQLite
ledger is created and migrated (this command writes). Exit status as docs/cli.md says: 0 done, 1 the
batch failed, 2 bad arguments (refused before anything is claimed), 3 broker or ledger unreachable.
Progress lines go to stderr; ``--json`` prints the batch result (and, for a table sink, the table).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from streamledger.cli.exits import BadInput
from streamledger.cli.options import (
    add_broker,
    add_catalog,
    add_json,
    add_ledger,
    add_spark_conf,
    broker_url,
    catalog_of,
    open_ledger,
    position_arg,
)
from streamledger.cli.progress import StderrHandler, batch_display
from streamledger.runs import CLI_DAG, CLI_RUN_PREFIX

if TYPE_CHECKING:
    from streamledger.batch import BatchConfig
    from streamledger.batch.spec import InitialPosition, PipelineSpec

TASK = "batch"
DAG = CLI_DAG


def _initial_position(text: str) -> InitialPosition:
    """Where a new pipeline starts: first, next (new records only), an offset, or interval-start."""
    if text.strip().lower() in ("interval-start", "interval_start"):
        return "interval_start"
    position = position_arg(text)
    if position.offset is not None:
        return position.offset
    if position.word in ("first", "next"):
        return "first" if position.word == "first" else "tail"
    raise argparse.ArgumentTypeError(
        f"{text!r}: a new pipeline starts at first, next, an offset or interval-start")


def _when(text: str) -> datetime:
    """An ISO 8601 moment; without a zone it is UTC."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time (e.g. 2026-01-02T00:00:00Z)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _remote(text: str) -> str:
    if not text.startswith("sc://"):
        shown = text.split("@")[-1]
        raise argparse.ArgumentTypeError(f"a Spark Connect URL looks like sc://host:port, got {shown!r}")
    return text


def _try_number(ledger: Any, pipeline: str, run_id: str) -> int:
    """One past the ledger's last try of this run identity (1 for a new one): ``Ledger.last_try``
    counts an attempt answered "nothing new" too, which left no range."""
    from streamledger.ledger.types import RunIdentity

    return int(ledger.last_try(pipeline, RunIdentity(DAG, run_id, TASK))) + 1


class _SpecDefault:
    """An option left out: the spec's own default applies (``%(default)s`` in help asks the spec,
    only when help is shown, so building the parser imports no batch module)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        from streamledger.batch.spec import spec_default

        return str(spec_default(self.name))


@dataclass(frozen=True)
class SpecOption:
    """One :class:`~streamledger.batch.spec.PipelineSpec` field as ``batch run`` offers it: the flag,
    its help and how its text becomes the field's value (``parse``), or for a flag without a value
    the value it sets (``const``). The default is the spec's; the spec validates the value."""

    flag: str
    help: str
    metavar: str | None = None
    parse: Callable[[str], Any] = str
    const: bool | None = None

    def add_to(self, p: Any, name: str) -> None:
        """This option, on parser (or group) ``p``, for spec field ``name``."""
        kwargs: dict[str, Any] = {"dest": name, "default": _SpecDefault(name), "help": self.help}
        if self.const is not None:
            kwargs.update(action="store_const", const=self.const)
        else:
            kwargs.update(type=self.parse, metavar=self.metavar)
            if name not in _REQUIRED + _SOURCE:
                kwargs["help"] += " (default %(default)s)"
        p.add_argument(self.flag, **kwargs)

    def argv(self, value: Any) -> list[str]:
        """``value`` as this option's arguments (nothing for a flag's other value, or None)."""
        if self.const is not None:
            return [self.flag] if value == self.const else []
        return [] if value is None else [self.flag, str(value)]


SPEC_OPTIONS: dict[str, SpecOption] = {
    "pipeline": SpecOption("--pipeline", "the pipeline (the broker's offset reference)"),
    "output_root": SpecOption("--output-root", "where outputs (and tables) live", "ROOT"),
    "stream": SpecOption("--stream", "one stream"),
    "super_stream": SpecOption("--super-stream", "every partition of a super stream"),
    "initial_position": SpecOption(
        "--initial-position", "where a new pipeline starts: first, next (only new records), an offset, "
        "or interval-start (with --interval-start)", "POSITION", _initial_position),
    "fmt": SpecOption("--format", "the range files' format: parquet, orc or json", "FORMAT"),
    "splits": SpecOption("--splits", "Spark read tasks per partition", "N", int),
    "store_offset": SpecOption("--no-store-offset", "do not store the pipeline's offset on the broker",
                               const=False),
    "store_timeout": SpecOption("--store-timeout", "seconds to store and verify the broker's offset",
                                "SECONDS", float),
    "on_data_loss": SpecOption(
        "--on-data-loss", "offsets retention removed before they were read: fail the batch or record "
        "them as lost and go on", "{fail,record}"),
    "max_offsets": SpecOption("--max-offsets", "cap a new range's span; None: no cap", "N", int),
    "broker_name": SpecOption("--broker-name", "the ledger's name for the broker; None: the cluster's "
                              "own name", "NAME"),
    "heartbeat_interval": SpecOption("--heartbeat-interval", "seconds between renewals of the claims",
                                     "SECONDS", float),
    "claim_timeout": SpecOption("--claim-timeout", "seconds after which a claim not renewed is "
                                "abandoned", "SECONDS", float),
    "sink": SpecOption("--sink", "what publishing means: a directory per range, or a table",
                       "{directory,iceberg,delta}"),
    "table": SpecOption("--table", "iceberg: NAMESPACE.NAME, None: streamledger.<pipeline>; "
                        "delta: the table's location, None: <output-root>/<pipeline>"),
    "bound_by_interval": SpecOption(
        "--bound-by-interval", "pin each range to the records stamped in the interval (the same on "
        "every rerun; with --interval-start and --interval-end)", const=True),
    "interval_grace": SpecOption("--interval-grace", "seconds after the interval's end after which an "
                                 "idle stream's interval ends at its tail", "SECONDS", float),
    "sql": SpecOption("--sql", "Spark SQL over the view `records`, run on each range between read and sink "
                      "(docs/transforms.md)", "QUERY"),
    "sql_file": SpecOption("--sql-file", "a file holding that query", "FILE"),
    "transform": SpecOption("--transform", "a function DataFrame -> DataFrame run on each range, as an "
                            "import path", "MODULE:FUNCTION"),
    "body_format": SpecOption("--body-format", "decode each record's body first: raw (no) or json (with "
                              "--body-schema)", "{raw,json}"),
    "body_schema": SpecOption("--body-schema", "the body's fields as Spark DDL, e.g. 'id STRING, amount "
                              "DECIMAL(12,2)'", "DDL"),
    "on_bad_record": SpecOption("--on-bad-record", "a body that does not decode: fail the batch, null its "
                                "columns, or set it aside in the range's dead letter",
                                "{fail,null,dead_letter}"),
}
"""``batch run``'s option for each field of the pipeline spec a user sets, by field; the fields in
:data:`SPEC_LACKS` excepted (tests/unit/batch/test_spec_faces.py holds the two to the spec)."""

SPEC_LACKS: dict[str, str] = {}
"""Spec fields ``batch run`` deliberately does not offer, each with the reason."""

_REQUIRED = ("pipeline", "output_root")
_SOURCE = ("stream", "super_stream")  # exactly one of them


def add_spec_options(p: argparse.ArgumentParser) -> None:
    """One option per :data:`SPEC_OPTIONS` entry."""
    which = p.add_mutually_exclusive_group(required=True)
    for name, option in SPEC_OPTIONS.items():
        option.add_to(which if name in _SOURCE else p, name)
    for action in p._actions:
        if action.dest in _REQUIRED:
            action.required = True


def _spec(args: argparse.Namespace) -> PipelineSpec:
    """The pipeline the options declare (a left-out option: the spec's default); what the spec refuses
    is bad input (exit 2), nothing opened yet."""
    from streamledger.batch.spec import Door, PipelineSpec, SpecError

    given = {name: getattr(args, name) for name in SPEC_OPTIONS}
    try:
        return PipelineSpec(**{k: v for k, v in given.items() if not isinstance(v, _SpecDefault)},
                            door=Door.CLI)
    except SpecError as exc:
        raise BadInput(_flags_named(str(exc))) from None


def _flags_named(problem: str) -> str:
    """A refusal of the spec in this face's words: each setting named by its option (``max_offsets``
    -> ``--max-offsets``); the source's names, and settings named by a plain noun the refusals also
    use as a noun (``iceberg table 'x'``, ``the transform``, ``sql``), stay as they are."""
    for name, option in SPEC_OPTIONS.items():
        if name not in ("pipeline", *_SOURCE, *_NOUNS):
            problem = re.sub(rf"\b{name}\b", option.flag, problem)
    return problem


_NOUNS = ("table", "transform", "sql")


def _config(args: argparse.Namespace, url: str) -> BatchConfig:
    """The batch's config: the spec bound to this run (the URL, the interval, the catalog)."""
    from streamledger.batch import BatchConfig, BatchError
    from streamledger.batch.rules import sink_library_problem

    spec = _spec(args)
    problem = sink_library_problem(spec.sink)  # before the broker or ledger is asked
    if problem is not None:
        raise BadInput(problem)
    try:
        return BatchConfig.for_run(spec, url=url, interval_start=args.interval_start,
                                   interval_end=args.interval_end, catalog=catalog_of(args))
    except BatchError as exc:
        raise BadInput(_flags_named(str(exc))) from None


def _runner(args: argparse.Namespace) -> Any:
    from streamledger.cli.spark import batch_runner

    return batch_runner(args)


def _run(args: argparse.Namespace) -> int:
    from streamledger.batch import RunId, run_batch
    from streamledger.sources import connect_log

    url = broker_url(args)
    config = _config(args, url)
    runner = _runner(args)
    log_lines = StderrHandler()
    log_lines.setFormatter(logging.Formatter("streamledger: %(message)s"))
    batch_log = logging.getLogger("streamledger.batch")
    level, propagate = batch_log.level, batch_log.propagate  # the caller's, restored after the batch
    batch_log.addHandler(log_lines)
    batch_log.setLevel(logging.INFO)
    batch_log.propagate = False  # one line per step: not again through the root logger's handler
    display = batch_display()  # on a terminal; else the batch's own progress lines, through log_lines
    try:
        with open_ledger(args, write=True) as ledger, connect_log(url) as log:
            run_id = args.run_id or f"{CLI_RUN_PREFIX}{uuid.uuid4().hex[:12]}"
            run = RunId(DAG, run_id, TASK, try_number=_try_number(ledger, args.pipeline, run_id))
            try:
                result = run_batch(config, run=run, ledger=ledger, broker=log, runner=runner,
                                   progress=display)
            finally:
                if display is not None:
                    display.close()
            table = result.table  # described by the batch, from the sink it published with
    finally:
        batch_log.removeHandler(log_lines)
        batch_log.setLevel(level)
        batch_log.propagate = propagate
    if getattr(args, "json", False):
        out = result.to_dict()
        out["run_id"] = run_id  # with a table sink, to_dict holds the table
        print(json.dumps(out, default=str))
    else:
        for p in result.partitions:
            print(f"{p.stream} [{p.start}, {p.end}) {p.status} records={p.records}"
                  + (f" rows={p.rows}" if p.rows is not None else "")
                  + (f" dead-letter={p.dead_letter}" if p.dead_letter is not None else "")
                  + (f" offset-stored={p.offset_stored}" if p.offset_stored is not None else ""))
        if table is not None:
            print(f"table {table['format']} {table['identifier']}: " + " ".join(
                f"{k}={v}" for k, v in table.items() if k not in ("format", "identifier")))
    return 0


def register(sub: Any) -> None:
    """Add this group's sub-commands to the top-level parser."""
    group = sub.add_parser("batch", help="run one exactly-once batch (claim, read, commit, publish, store)")
    cmds = group.add_subparsers(dest="batch_command", required=True, metavar="SUBCOMMAND")
    p = cmds.add_parser("run", help="one batch of a pipeline: every partition, one Spark job")
    add_broker(p)
    add_ledger(p)
    add_json(p)
    add_spec_options(p)
    p.add_argument("--interval-start", type=_when, default=None, metavar="TIME",
                   help="the data interval's start, ISO 8601 (UTC without a zone)")
    p.add_argument("--interval-end", type=_when, default=None, metavar="TIME", help="the data interval's end")
    add_catalog(p, "a SQL catalog in the ledger")
    p.add_argument("--run-id", default=None, help="the run identity: the same id is a retry of that run")
    p.add_argument("--master", default=None, help="local Spark's master (default local[2])")
    add_spark_conf(p, "a Spark setting, e.g. spark.jars.packages=... for s3a://")
    p.add_argument("--remote", type=_remote, default=None, metavar="sc://HOST:PORT",
                   help="run the job on this Spark Connect server (default: $STREAMLEDGER_SPARK_REMOTE, else "
                   "the server `streamledger spark-server start` recorded, else local Spark)")
    p.set_defaults(func=_run)
