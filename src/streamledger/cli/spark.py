"""``streamledger spark-server start|stop|status``: a warm local Spark Connect server.

``start`` prints the ``sc://host:port`` URL as its last line (so ``SPARK_REMOTE=$(streamledger
spark-server start | tail -1)`` works) and reuses a live server. pyspark is imported only by ``start``.

:func:`batch_runner` is the one choice of where ``streamledger batch run`` runs its Spark job: a
Connect server named by ``--remote``, else one named by ``$STREAMLEDGER_SPARK_REMOTE`` or recorded by
``spark-server start`` (no flag needed: a cron or Kubernetes job's batch then pays no JVM start),
else local Spark, which says in one line how to keep Spark warm. ``--master``/``--conf`` configure
local Spark, so they choose it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from streamledger.cli.exits import BadInput
from streamledger.cli.options import add_json, add_spark_conf, spark_conf_of

#: What a cold start says, once, on stderr.
COLD_START = ("streamledger: local Spark starts a JVM for this batch; keep Spark warm with "
              "`streamledger spark-server start` (later batch runs use it without a flag) or "
              "$STREAMLEDGER_SPARK_REMOTE=sc://HOST:PORT")


def batch_runner(args: argparse.Namespace) -> Any:
    """The job runner of ``batch run``: ``--remote``, else a warm server found, else local Spark."""
    from streamledger.errors import extra_problem

    problem = extra_problem("pyspark")  # found now, not after the claim
    if problem is not None:
        raise BadInput(problem)
    from streamledger.batch import LocalSparkRunner, SparkConnectRunner
    from streamledger.spark import connect

    local = bool(args.conf or args.conf_file or args.master)
    if args.remote:
        if local:
            raise BadInput("--master and --conf(-file) configure local Spark; a Spark Connect server "
                           "(--remote) has its own")
        return SparkConnectRunner(args.remote)
    if not local:
        try:
            found = connect.warm_server()
        except connect.ConnectServerError as exc:
            raise BadInput(str(exc)) from None
        if found is not None:
            url, where = found
            print(f"streamledger: Spark Connect server {connect.shown_url(url)} ({where})", file=sys.stderr)
            return SparkConnectRunner(url)
    if args.verbose:  # Spark's own start-up messages too
        base: type[Any] = LocalSparkRunner
    else:
        from streamledger.cli.quiet_spark import QuietLocalSparkRunner as base

    class ColdRunner(base):  # type: ignore[misc]
        """Says how to keep Spark warm when (and only if) it starts the JVM: an idle batch starts none."""

        def session(self) -> Any:
            if self._spark is None:
                print(COLD_START, file=sys.stderr, flush=True)
            return super().session()

    return ColdRunner(master=args.master or "local[2]", conf=spark_conf_of(args))


def _start(args: argparse.Namespace) -> int:
    from streamledger.spark import connect

    conf = spark_conf_of(args)
    before = connect.status()
    state = connect.start(port=args.port, master=args.master, conf=conf, timeout=args.timeout)
    if before is None and args.warm:  # the first batch then finds the job session's workers up
        connect.warm_up(state.url)
    if getattr(args, "json", False):
        print(json.dumps({**asdict(state), "reused": before is not None}))
    else:
        print(f"{'running' if before else 'started'}: pid {state.pid}, log {state.log}")
        print(state.url)
    return 0


def _stop(args: argparse.Namespace) -> int:
    from streamledger.spark import connect

    state = connect.stop()
    if getattr(args, "json", False):
        print(json.dumps({"stopped": asdict(state) if state else None}))
    else:
        print(f"stopped pid {state.pid} ({state.url})" if state else "no Spark Connect server was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    from streamledger.spark import connect

    state = connect.status()
    if getattr(args, "json", False):
        print(json.dumps(asdict(state) if state else None))
    elif state:
        print(f"running: pid {state.pid}, master {state.master}, log {state.log}")
        print(state.url)
    else:
        print("not running")
    return 0 if state else 3


def register(sub: Any) -> None:
    """Add this group's sub-commands to the top-level parser."""
    group = sub.add_parser("spark-server", help="a local Spark Connect server (the warm data plane)")
    cmds = group.add_subparsers(dest="spark_server_command", required=True, metavar="SUBCOMMAND")
    start = cmds.add_parser("start", help="start (or reuse) the server; prints its sc:// URL last")
    start.add_argument("--port", type=int, default=None, help="gRPC port on 127.0.0.1 (default: a free one)")
    start.add_argument("--master", default="local[2]", help="the server's Spark master (default local[2])")
    add_spark_conf(start, "an extra Spark setting")
    start.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for it to listen")
    start.add_argument("--no-warm-up", dest="warm", action="store_false",
                       help="return once it listens, before the batches' Python workers are up")
    add_json(start)
    start.set_defaults(func=_start)
    stop = cmds.add_parser("stop", help="stop the recorded server")
    add_json(stop)
    stop.set_defaults(func=_stop)
    status = cmds.add_parser("status", help="print the server's URL; exit 3 when none runs")
    add_json(status)
    status.set_defaults(func=_status)
