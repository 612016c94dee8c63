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
import uuid
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
    from streamledger.batch.config import InitialPosition

TASK = "batch"
DAG = CLI_DAG


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


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


def _config(args: argparse.Namespace, url: str) -> BatchConfig:
    """The batch's config from the flags; what it refuses is bad input (exit 2), nothing opened yet."""
    from streamledger.batch import BatchConfig, BatchError

    try:
        return BatchConfig(
            pipeline=args.pipeline, url=url, output_root=args.output_root, stream=args.stream,
            super_stream=args.super_stream, max_offsets=args.max_offsets, sink=args.sink, table=args.table,
            catalog=catalog_of(args), initial_position=args.initial_position, splits=args.splits,
            on_data_loss=args.on_data_loss, interval_start=args.interval_start,
            interval_end=args.interval_end,
            bound_by_interval=args.bound_by_interval, interval_grace=args.interval_grace,
            store_offset=args.store_offset,
        )
    except BatchError as exc:
        raise BadInput(str(exc)) from None


def _runner(args: argparse.Namespace) -> Any:
    from streamledger.cli.spark import batch_runner

    return batch_runner(args)


def _run(args: argparse.Namespace) -> int:
    from streamledger.batch import BatchRun, RunId
    from streamledger.sources import connect_log

    url = broker_url(args)
    config = _config(args, url)
    runner = _runner(args)
    log_lines = StderrHandler()
    log_lines.setFormatter(logging.Formatter("streamledger: %(message)s"))
    batch_log = logging.getLogger("streamledger.batch")
    batch_log.addHandler(log_lines)
    batch_log.setLevel(logging.INFO)
    batch_log.propagate = False  # one line per step: not again through the root logger's handler
    display = batch_display()  # on a terminal; else the batch's own progress lines, through log_lines
    try:
        with open_ledger(args, write=True) as ledger, connect_log(url) as log:
            run_id = args.run_id or f"{CLI_RUN_PREFIX}{uuid.uuid4().hex[:12]}"
            run = RunId(DAG, run_id, TASK, try_number=_try_number(ledger, args.pipeline, run_id))
            batch = BatchRun(config, run=run, ledger=ledger, broker=log, runner=runner, progress=display)
            try:
                result = batch.execute()
            finally:
                if display is not None:
                    display.close()
            table = result.table  # described by the batch, from the sink it published with
    finally:
        batch_log.removeHandler(log_lines)
        batch_log.propagate = True
    if getattr(args, "json", False):
        out = result.to_dict()
        out["run_id"] = run_id  # with a table sink, to_dict holds the table
        print(json.dumps(out, default=str))
    else:
        for p in result.partitions:
            print(f"{p.stream} [{p.start}, {p.end}) {p.status} records={p.records}"
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
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--stream", default=None, help="one stream")
    which.add_argument("--super-stream", default=None, help="every partition of a super stream")
    p.add_argument("--pipeline", required=True, help="the pipeline (the broker's offset reference)")
    p.add_argument("--output-root", required=True, metavar="ROOT", help="where outputs (and tables) live")
    p.add_argument("--initial-position", type=_initial_position, default="first", metavar="POSITION",
                   help="where a new pipeline starts: first (default), next (only new records), an "
                   "offset, or interval-start (with --interval-start)")
    p.add_argument("--max-offsets", type=_positive, default=None, metavar="N", help="cap a new range's span")
    p.add_argument("--splits", type=_positive, default=1, metavar="N",
                   help="Spark read tasks per partition (default 1)")
    p.add_argument("--on-data-loss", choices=("fail", "record"), default="fail",
                   help="offsets retention removed before they were read: fail the batch (default) or "
                   "record them as lost and go on")
    p.add_argument("--interval-start", type=_when, default=None, metavar="TIME",
                   help="the data interval's start, ISO 8601 (UTC without a zone)")
    p.add_argument("--interval-end", type=_when, default=None, metavar="TIME", help="the data interval's end")
    p.add_argument("--bound-by-interval", action="store_true",
                   help="pin each range to the records stamped in the interval (the same on every rerun)")
    p.add_argument("--interval-grace", type=_seconds, default=60.0, metavar="SECONDS",
                   help="an idle stream's interval ends this long after its end time (default 60)")
    p.add_argument("--no-store-offset", dest="store_offset", action="store_false",
                   help="do not store the pipeline's offset on the broker")
    p.add_argument("--sink", choices=("directory", "iceberg", "delta"), default="directory",
                   help="what publishing means (default: a directory per range)")
    p.add_argument("--table", default=None,
                   help="iceberg: NAMESPACE.NAME (default streamledger.<pipeline>); "
                   "delta: the table's location")
    add_catalog(p, "a SQL catalog in the ledger")
    p.add_argument("--run-id", default=None, help="the run identity: the same id is a retry of that run")
    p.add_argument("--master", default=None, help="local Spark's master (default local[2])")
    add_spark_conf(p, "a Spark setting, e.g. spark.jars.packages=... for s3a://")
    p.add_argument("--remote", type=_remote, default=None, metavar="sc://HOST:PORT",
                   help="run the job on this Spark Connect server (default: $STREAMLEDGER_SPARK_REMOTE, else "
                   "the server `streamledger spark-server start` recorded, else local Spark)")
    p.set_defaults(func=_run)
