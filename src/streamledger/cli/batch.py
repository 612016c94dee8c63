"""``streamledger batch run``: one batch from the command line (cron, Kubernetes jobs, any scheduler).

The same ``--run-id`` is a retry of the same run identity (it gets its claim back, and its try
number is one past the ledger's last try of it); without one, each call is a new run. Exit status
0 when the batch is done, 1 when it failed (one line on stderr), 2 for bad arguments. Progress
lines go to stderr; ``--json`` prints the batch result (and, for a table sink, the table) on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from typing import Any

TASK = "batch"
DAG = "streamledger-cli"


def _catalog(items: list[str]) -> dict[str, str] | None:
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--catalog wants KEY=VALUE, got {item.split('=')[0]!r}")
        out[key] = value
    return out


def _try_number(ledger: Any, pipeline: str, run_id: str) -> int:
    """One past the ledger's last try of this run identity (1 for a new one)."""
    tries = [r.run.try_number for r in ledger.ranges(pipeline)
             if (r.run.dag_id, r.run.run_id, r.run.task_id) == (DAG, run_id, TASK)]
    return max(tries, default=0) + 1


def _run(args: argparse.Namespace) -> int:
    from streamledger.batch import BatchConfig, BatchRun, LocalSparkRunner, RunId, SparkConnectRunner
    from streamledger.ledger import Ledger
    from streamledger.sources import connect_log

    url = args.batch_url or args.url
    from streamledger.batch.sinks import sink_problem

    try:
        catalog = _catalog(args.catalog)
        problem = sink_problem(args.sink, args.table, catalog, "parquet")
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
    except argparse.ArgumentTypeError as exc:
        print(f"streamledger batch run: error: {exc} (see --help)", file=sys.stderr)
        return 2
    config = BatchConfig(pipeline=args.pipeline, url=url, output_root=args.output_root, stream=args.stream,
                         super_stream=args.super_stream, max_offsets=args.max_offsets, sink=args.sink,
                         table=args.table, catalog=catalog)
    progress = logging.StreamHandler(sys.stderr)
    progress.setFormatter(logging.Formatter("streamledger: %(message)s"))
    batch_log = logging.getLogger("streamledger.batch")
    batch_log.addHandler(progress)
    batch_log.setLevel(logging.INFO)
    runner = SparkConnectRunner(args.remote) if args.remote else LocalSparkRunner()
    try:
        with Ledger(args.ledger) as ledger, connect_log(url) as log:
            run_id = args.run_id or f"cli-{uuid.uuid4().hex[:12]}"
            run = RunId(DAG, run_id, TASK, try_number=_try_number(ledger, args.pipeline, run_id))
            batch = BatchRun(config, run=run, ledger=ledger, broker=log, runner=runner)
            result = batch.execute()
            table = batch.sink.describe()
    finally:
        batch_log.removeHandler(progress)
    if getattr(args, "json", False):
        out = result.to_dict()
        out["run_id"] = run_id
        if table is not None:
            out["table"] = table
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
    p.add_argument("--url", dest="batch_url", default=None, metavar="URL",
                   help="the log's URL (rabbitmq-stream://... or mewbase://...; default: the global --url)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--stream", default=None, help="one stream")
    which.add_argument("--super-stream", default=None, help="every partition of a super stream")
    p.add_argument("--pipeline", required=True, help="the pipeline (the broker's offset reference)")
    p.add_argument("--ledger", required=True, metavar="URL", help="the ledger database URL")
    p.add_argument("--output-root", required=True, metavar="ROOT", help="where outputs (and tables) live")
    p.add_argument("--sink", choices=("directory", "iceberg", "delta"), default="directory",
                   help="what publishing means (default: a directory per range)")
    p.add_argument("--table", default=None,
                   help="iceberg: NAMESPACE.NAME (default streamledger.<pipeline>); "
                   "delta: the table's location")
    p.add_argument("--catalog", action="append", default=[], metavar="KEY=VALUE",
                   help="a pyiceberg catalog property (repeatable; default: a SQL catalog in the ledger)")
    p.add_argument("--max-offsets", type=int, default=None, metavar="N", help="cap a new range's span")
    p.add_argument("--run-id", default=None, help="the run identity: the same id is a retry of that run")
    p.add_argument("--remote", default=None, metavar="sc://HOST:PORT", help="a Spark Connect server")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")
    p.set_defaults(func=_run)
