"""Chaos under a real scheduler: does the backfill DAG stay exactly-once when everything breaks?

One run (:func:`run_chaos`) starts its own servers (see :mod:`tests.chaos.servers`), points the
example DAG ``dags/streamledger_backfill.py`` at a fresh 3-partition super stream with a short
interval, a PostgreSQL ledger and a scratch output root, and then, while a publisher thread keeps
publishing numbered records:

* SIGKILLs task processes at seeded random moments: the task runner (the process that runs the
  operator and its local Spark driver; its supervisor reports the failure) or the whole LocalExecutor
  worker with its task (only missed heartbeats tell the scheduler);
* restarts the broker once while a ``read_interval`` task is reading (its Spark job is up);
* restarts PostgreSQL once as soon as a job has written its manifest, i.e. around the ledger commit;
* clears failed task instances through the REST API, as an operator would.

``parallel`` is the variant of issue 19: the DAG runs with ``max_active_runs=3`` and ``retries=0``
(a killed task is simply failed) and the operator clears only some failed runs (a seeded coin per
run, never all of them), so later runs must finish what the failed ones left: abandon their claims
(Airflow reports the holder gone) and publish what they committed.

Then it stops publishing, lets the scheduler run the intervals that cover the last record plus a few
idle ones, pauses the DAG and checks, from the ledger, the outputs and the broker:

* every confirmed record is in exactly one committed output (no missing, no duplicate, no stranger),
  and every committed output is readable and holds the committed count;
* per partition, the broker's stored offset is the ledger's watermark (end of the contiguous
  committed/lost prefix minus one), or lags it only over offsets holding no user record;
* no range is left ``claimed``, every committed range with records is published, and
  ``streamledger.batch.proof.audit(ledger, pipeline, broker=client, deep=True)`` (the ledger's audit
  plus the published outputs) is clean;
* every DAG run succeeded (after the operator's clears); in the parallel variant, the runs the
  operator chose to leave failed may stay failed (they are counted, not excused in the data);
* idle intervals wrote nothing to the stream.

Each violation is one line; the figures (kills, restarts, records, runs, tries, wall time) are
printed whatever the outcome.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from tests.chaos.servers import (
    AirflowCluster,
    PrivateBroker,
    PrivatePostgres,
    ServerError,
    connection_json,
)
from tests.support.spark import SHORT_JVM_ENV

DAG_ID = "streamledger_backfill"
READ_TASK = "read_interval"


@dataclass
class ChaosOptions:
    """What one chaos run does. Defaults are ``make chaos``; the pytest variant shrinks them."""

    seed: int = 1
    kills: int = 20
    duration: float = 180.0  # seconds of publishing at least (kills and restarts may extend it)
    interval: int = 20  # DAG data interval, seconds
    partitions: int = 3
    rate: float = 20.0  # records per second, over all partitions
    broker_restart: bool = True
    postgres_restart: bool = True
    clear_delay: tuple[float, float] = (5.0, 60.0)  # seconds an operator takes to clear a failed run
    # issue 19's variant: max_active_runs=3, retries=0, and the operator clears only some failed runs
    parallel: bool = False
    clear_probability: float = 0.5  # parallel only: the chance a failed run is ever cleared
    idle_runs: int = 2  # intervals with no new data to watch after the last record is covered
    # seconds after an interval's end before an idle stream's end is its tail (the DAG's default 60;
    # the pytest variant waits less at the end of its short run)
    interval_grace: float = 60.0
    settle_timeout: float = 2400.0  # for the final intervals to run and all DAG runs to succeed
    scratch: Path | None = None
    broker_home: Path | None = None
    keep: bool = False  # keep the scratch directory (logs, outputs) even when clean

    def __post_init__(self) -> None:
        if self.kills < 0 or self.duration <= 0 or self.interval < 2 or self.partitions < 1:
            raise ValueError("kills >= 0, duration > 0, interval >= 2 s and partitions >= 1 are required")
        if not 0.0 <= self.clear_probability <= 1.0:
            raise ValueError("clear_probability must be within [0, 1]")

    @property
    def max_active_runs(self) -> int:
        return 3 if self.parallel else 1

    @property
    def retries(self) -> int:
        return 0 if self.parallel else 1

    @property
    def bound_by_interval(self) -> bool:
        """Pinned interval ranges keep a failed interval's range for that interval's own retry or
        clear (issue 25), so a run the operator never clears would leave its records unprocessed by
        design: the parallel variant (issue 19: later runs redo what failed ones left) claims in
        claim order; the serial one runs the DAG as shipped (pinned)."""
        return not self.parallel


@dataclass
class Figures:
    kills: int = 0
    kills_by_target: Counter[str] = field(default_factory=Counter)
    kill_misses: int = 0
    broker_restarts: int = 0
    postgres_restarts: int = 0
    published: int = 0
    publish_retries: int = 0
    in_outputs: int = 0
    missing: int = 0
    duplicates: int = 0
    unexpected: int = 0
    dag_runs: int = 0
    dag_run_states: Counter[str] = field(default_factory=Counter)
    task_tries: int = 0
    clears: int = 0
    mode: str = "serial"
    failed_runs: int = 0  # distinct runs that failed at least once
    left_failed: list[str] = field(default_factory=list)  # runs the operator chose never to clear
    ranges: Counter[str] = field(default_factory=Counter)
    idle_growth: dict[str, int] = field(default_factory=dict)
    offset_samples: int = 0
    wall_s: float = 0.0
    events: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        by_target = ", ".join(f"{k} {v}" for k, v in sorted(self.kills_by_target.items())) or "-"
        return [
            f"kills: {self.kills} ({by_target}; {self.kill_misses} targets ended before the signal)",
            f"restarts: broker {self.broker_restarts}, postgres {self.postgres_restarts}",
            f"records published (confirmed): {self.published} ({self.publish_retries} publish retries)",
            f"records in committed outputs: {self.in_outputs}",
            f"missing: {self.missing}",
            f"duplicates: {self.duplicates}",
            f"unexpected: {self.unexpected}",
            f"DAG runs: {self.dag_runs} ({_counts(self.dag_run_states)})",
            f"mode: {self.mode}",
            f"task tries: {self.task_tries}; operator clears: {self.clears}",
            f"failed runs: {self.failed_runs}; left failed by the operator: {len(self.left_failed)}"
            + (f" ({', '.join(self.left_failed)})" if self.left_failed else ""),
            f"ledger ranges: {_counts(self.ranges)}",
            f"idle stream growth (offsets written by idle runs): {self.idle_growth or 'none'}",
            f"stored offset vs watermark samples during the run: {self.offset_samples}",
            f"wall time: {self.wall_s:.0f} s",
        ]


@dataclass
class ChaosResult:
    figures: Figures
    violations: list[str]
    scratch: Path

    @property
    def clean(self) -> bool:
        return not self.violations


def _manifests(root: Path) -> set[str]:
    """Every ``_manifest.json`` under ``root``; ``os.walk`` skips directories that vanish meanwhile
    (Spark's ``_temporary`` trees come and go while a job writes)."""
    return {os.path.join(d, "_manifest.json") for d, _, files in os.walk(root) if "_manifest.json" in files}


def output_tables(output: str) -> list[Any]:
    """The Parquet files directly in a range's output location (a path or an object-store URI,
    reached with the ``AWS_*`` environment as the batch does), read as tables: what a reader of the
    directory layout sees, independently of the manifest."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from streamledger.fs import StoreAccess, arrow_filesystem

    fs, root = arrow_filesystem(output, access=StoreAccess.from_environment(output))
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    files = sorted(i.path for i in infos if i.type == pafs.FileType.File
                   and i.base_name.endswith(".parquet") and not i.base_name.startswith("."))
    if not files:
        raise FileNotFoundError(f"no parquet files in {output}")
    return [pq.read_table(f, columns=["stream", "offset", "body"], filesystem=fs) for f in files]


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "-"


def _log(msg: str) -> None:
    print(f"[chaos {datetime.now(UTC):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Publisher
# ---------------------------------------------------------------------------------------------


class Publisher(threading.Thread):
    """Publishes numbered JSON records round-robin over the partitions until stopped.

    Every batch is published with a publisher reference and explicit publishing ids, so a batch
    whose confirms were lost (broker restart) is retried with the same ids and the broker drops
    what it already stored: ``confirmed`` is exactly the set of records in the stream.
    """

    def __init__(self, url: str, streams: list[str], rate: float, tag: str) -> None:
        super().__init__(name="chaos-publisher", daemon=True)
        self.url, self.streams, self.rate, self.tag = url, streams, rate, tag
        self.stop_event = threading.Event()
        self.confirmed: list[int] = []
        self.retries = 0
        self.error: BaseException | None = None
        self._next_id = 0
        self._pub_ids = dict.fromkeys(streams, 1)

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported by the harness
            self.error = exc

    def _loop(self) -> None:
        from streamledger.protocol.rabbitmq import StreamClient

        client: StreamClient | None = None
        tick = 0.25
        per_tick = max(1, round(self.rate * tick))
        while not self.stop_event.is_set():
            began = time.monotonic()
            batch: dict[str, list[int]] = {s: [] for s in self.streams}
            for _ in range(per_tick):
                batch[self.streams[self._next_id % len(self.streams)]].append(self._next_id)
                self._next_id += 1
            for stream, ids in batch.items():
                if not ids:
                    continue
                bodies = [json.dumps({"id": i, "run": self.tag}).encode() for i in ids]
                while True:  # retry the same ids until confirmed; a broker restart is expected
                    try:
                        if client is None:
                            client = StreamClient.connect(self.url)
                        result = client.publish(stream, bodies, publisher_ref=f"chaos-{self.tag}",
                                                first_publishing_id=self._pub_ids[stream])
                        if result.confirmed != len(bodies):
                            raise RuntimeError(f"{stream}: {result.confirmed} of {len(bodies)} confirmed")
                        break
                    except Exception:
                        self.retries += 1
                        if client is not None:
                            try:
                                client.close()
                            except Exception:
                                pass
                            client = None
                        time.sleep(0.5)
                self._pub_ids[stream] += len(bodies)
                self.confirmed.extend(ids)
            time.sleep(max(0.0, tick - (time.monotonic() - began)))
        if client is not None:
            client.close()


# ---------------------------------------------------------------------------------------------
# Task processes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskProcess:
    """One running task: the LocalExecutor worker supervising it and the task runner it forked."""

    ti_id: str
    worker: psutil.Process
    runner: psutil.Process

    def has_spark(self) -> bool:
        try:
            return any("java" in (c.name() or "") for c in self.runner.children(recursive=True))
        except psutil.Error:
            return False


def task_processes(scheduler_pid: int) -> list[TaskProcess]:
    """Running tasks under this scheduler (other Airflows on the machine are never touched)."""
    prefix = "airflow worker -- LocalExecutor:"
    found = []
    try:
        workers = psutil.Process(scheduler_pid).children()
    except psutil.Error:
        return []
    for worker in workers:
        try:
            title = " ".join(worker.cmdline())
            if not title.startswith(prefix) or "<idle>" in title:
                continue
            ti_id = title[len(prefix):].strip()
            # a killed runner stays a zombie until its supervisor reaps it: not a target any more
            runners = [c for c in worker.children()
                       if "java" not in (c.name() or "") and c.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            continue
        if runners:
            found.append(TaskProcess(ti_id, worker, runners[0]))
    return found


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def watermarks(ranges: list[Any], streams: list[str]) -> dict[str, int | None]:
    """Per stream: end of the contiguous committed/lost prefix minus one (``None``: no prefix yet).

    Failed ranges are history and skipped; a claimed range (or a gap) ends the prefix.
    """
    from streamledger.ledger import RangeStatus

    out: dict[str, int | None] = {}
    for stream in streams:
        live = sorted((r for r in ranges if r.source.stream == stream and r.status != RangeStatus.FAILED),
                      key=lambda r: (r.start, r.end))
        end: int | None = None
        for r in live:
            if r.status not in (RangeStatus.COMMITTED, RangeStatus.LOST):
                break
            if end is not None and r.start != end:
                break
            end = r.end
        out[stream] = None if end is None else end - 1
    return out


class OffsetMonitor(threading.Thread):
    """Samples, every ``period`` seconds, the broker's stored offsets and then the ledger's watermark.

    The stored offset must never pass the watermark, not only at the end: a consumer resuming from
    the broker between two samples would skip what the passed-over range holds. The broker is read
    first; the watermark only grows, so ``stored(t1) > watermark(t2 >= t1)`` is a real violation.
    Samples that fail (broker or database restarting) are skipped.
    """

    def __init__(self, run: ChaosRun, period: float = 2.0) -> None:
        super().__init__(name="chaos-offset-monitor", daemon=True)
        self.run_, self.period = run, period
        self.stop_event = threading.Event()
        self.samples = 0
        self.seen: set[tuple[str, int]] = set()

    def run(self) -> None:
        from streamledger.ledger import Ledger
        from streamledger.protocol.rabbitmq import StreamClient

        r = self.run_
        while not self.stop_event.wait(self.period):
            try:
                with StreamClient.connect(r.broker.url, timeout=5) as client:
                    stored = {s: client.query_offset(s, r.pipeline) for s in r.streams}
                with Ledger(r.ledger_url) as ledger:
                    marks = watermarks(ledger.ranges(r.pipeline), r.streams)
            except Exception:
                continue
            self.samples += 1
            for s in r.streams:
                st, wm = stored[s], marks[s]
                if st is not None and (wm is None or st > wm) and (s, st) not in self.seen:
                    self.seen.add((s, st))
                    r.violation(f"{s}: stored offset {st} passed the ledger watermark {wm} during the run")


class ChaosRun:
    def __init__(self, opts: ChaosOptions) -> None:
        self.opts = opts
        self.rng = random.Random(opts.seed)
        # its own stream of draws: how often the operator looks depends on timing, the kill plan must not
        self.operator_rng = random.Random(opts.seed + 1_000_003)
        self.fig = Figures(mode=(f"parallel (max_active_runs {opts.max_active_runs}, retries {opts.retries}, "
                                 f"operator clears a failed run with p={opts.clear_probability})")
                           if opts.parallel else
                           f"serial (max_active_runs {opts.max_active_runs}, retries {opts.retries})")
        self.violations: list[str] = []
        base = Path(os.environ.get("STREAMLEDGER_HOME", "/var/tmp/streamledger"))
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.scratch = opts.scratch or base / "chaos" / f"{stamp}-seed{opts.seed}-{os.getpid()}"
        self.scratch.mkdir(parents=True, exist_ok=True)
        os.chmod(self.scratch, 0o755)  # PostgreSQL runs as its own user under it
        self.tag = f"s{opts.seed}p{os.getpid()}{stamp[-6:]}"
        self.super_stream = f"chaos-{self.tag}"
        self.pipeline = f"chaos-{self.tag}"
        self.output_root = self.scratch / "output"
        self.pg = PrivatePostgres(self.scratch / "pg-home")
        self.broker = PrivateBroker(opts.broker_home or base)
        self.airflow: AirflowCluster | None = None
        self.publisher: Publisher | None = None
        self.monitor: OffsetMonitor | None = None
        self.ledger_url = ""
        self.streams: list[str] = []
        self._seen_manifests: set[str] = set()
        self._ti_tasks: dict[str, str] = {}
        self._failed_since: dict[str, float] = {}
        self._clear_decision: dict[str, bool] = {}  # parallel: run id -> does the operator clear it
        self._seen_failed: set[str] = set()
        self._tails_at_stop: dict[str, int] = {}
        self._checked_until: float | None = None  # data interval end of the last run waited for

    # -- helpers ---------------------------------------------------------------------------

    def event(self, msg: str) -> None:
        self.fig.events.append(f"{time.monotonic() - self._t0:7.1f}s {msg}")
        _log(msg)

    def violation(self, msg: str) -> None:
        self.violations.append(msg)
        _log(f"VIOLATION: {msg}")

    def client(self) -> Any:
        from streamledger.protocol.rabbitmq import StreamClient

        return StreamClient.connect(self.broker.url)

    def ledger(self) -> Any:
        from streamledger.ledger import Ledger

        return Ledger(self.ledger_url)

    @property
    def af(self) -> AirflowCluster:
        assert self.airflow is not None
        return self.airflow

    def _task_of(self, ti_id: str, *, refresh: bool = False) -> str:
        """The task id of a running task instance try, ``?`` when it is not running (any more)."""
        if refresh or ti_id not in self._ti_tasks:
            running = {ti["id"]: ti["task_id"] for ti in self.af.task_instances(DAG_ID, state=["running"])}
            self._ti_tasks.update(running)
            if refresh:
                return running.get(ti_id, "?")
        return self._ti_tasks.get(ti_id, "?")

    def _pause(self, seconds: float, step: Callable[[], None] | None = None) -> None:
        """Sleep, keeping the operator's duties (clearing failures) going every few seconds."""
        end = time.monotonic() + seconds
        while True:
            self.af.check_alive()
            if step:
                step()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 2.0))

    # -- set-up ------------------------------------------------------------------------------

    def setup(self) -> None:
        from streamledger.ledger import Ledger

        self.event(f"scratch {self.scratch}")
        admin = self.pg.start()
        del admin
        self.ledger_url = self.pg.create_database("ledger")
        Ledger(self.ledger_url, create=True).close()
        self.event(f"postgres on 127.0.0.1:{self.pg.port}, ledger migrated")
        self.broker.start()
        self.event(f"private RabbitMQ 4.3 node {self.broker.instance} on 127.0.0.1:{self.broker.stream_port}")
        with self.client() as client:
            client.create_super_stream(self.super_stream, partitions=self.opts.partitions)
            self.streams = client.partitions(self.super_stream)
        interval = self.opts.interval
        start = datetime.fromtimestamp(time.time() // interval * interval, UTC)
        env = {
            "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": connection_json(self.broker.url),
            "STREAMLEDGER_SUPER_STREAM": self.super_stream,
            "STREAMLEDGER_PARTITIONS": str(self.opts.partitions),
            "STREAMLEDGER_PIPELINE": self.pipeline,
            "STREAMLEDGER_INTERVAL": f"{interval}s",
            "STREAMLEDGER_START_DATE": start.isoformat(),
            "STREAMLEDGER_LEDGER_URL": self.ledger_url,
            "STREAMLEDGER_OUTPUT_ROOT": str(self.output_root),
            "STREAMLEDGER_HOME": str(self.scratch),
            "STREAMLEDGER_MAX_ACTIVE_RUNS": str(self.opts.max_active_runs),
            "STREAMLEDGER_RETRIES": str(self.opts.retries),
            "STREAMLEDGER_BOUND_BY_INTERVAL": "1" if self.opts.bound_by_interval else "0",
            "STREAMLEDGER_INTERVAL_GRACE": str(self.opts.interval_grace),
            "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            **SHORT_JVM_ENV,
        }
        self.airflow = AirflowCluster(self.scratch / "airflow", env)
        began = time.monotonic()
        self.af.start()
        self.event(f"airflow healthy in {time.monotonic() - began:.0f}s (api-server :{self.af.port})")
        deadline = time.monotonic() + 180
        while self.af.api("GET", f"dags/{DAG_ID}", ok=(200, 404)).get("dag_id") != DAG_ID:
            if time.monotonic() > deadline:
                raise ServerError(f"{DAG_ID} was not parsed in 180 s (see {self.af.home}/logs)")
            time.sleep(0.5)
        self.publisher = Publisher(self.broker.url, self.streams, self.opts.rate, self.tag)
        self.publisher.start()
        self.monitor = OffsetMonitor(self)
        self.monitor.start()
        self.af.api("PATCH", f"dags/{DAG_ID}", {"is_paused": False})
        self.event(f"{DAG_ID} unpaused: super stream {self.super_stream} x{len(self.streams)}, "
                   f"interval {interval}s from {start:%H:%M:%S}, {self.fig.mode}")

    # -- the operator ------------------------------------------------------------------------

    def clear_failed(self) -> None:
        """What an on-call operator does: clear the failed tasks of failed runs, again and again.

        Not at once: each failure waits a seeded 5-60 s first, so later runs often go ahead of a
        failed one (``max_active_runs=1`` only counts running runs), as they would in production.
        In the parallel variant the operator clears only some runs (:meth:`_will_clear`).
        """
        now = time.monotonic()
        for run in self.af.dag_runs(DAG_ID):
            key = run["dag_run_id"]
            if run["state"] != "failed":
                self._failed_since.pop(key, None)
                continue
            self._seen_failed.add(key)
            if not self._will_clear(key):
                continue
            due = self._failed_since.setdefault(key, now + self.operator_rng.uniform(*self.opts.clear_delay))
            if now < due:
                continue
            self.af.api("POST", f"dags/{DAG_ID}/clearTaskInstances", {
                "dry_run": False, "only_failed": True, "reset_dag_runs": True, "dag_run_id": key,
            })
            del self._failed_since[key]
            self.fig.clears += 1
            self.event(f"operator cleared failed tasks of {key}")

    def _will_clear(self, run_id: str) -> bool:
        """Whether the operator ever clears this failed run: always, except in the parallel variant,
        where a seeded coin decides once per run, and never all of them: a run that would be the
        second cleared one while none was left yet is left, so with two failed runs or more at
        least one stays failed and later runs must finish its work."""
        if not self.opts.parallel:
            return True
        if run_id not in self._clear_decision:
            clear = self.operator_rng.random() < self.opts.clear_probability
            if clear and self._clear_decision and not self.fig.left_failed:
                clear = False
            self._clear_decision[run_id] = clear
            if not clear:
                self.fig.left_failed.append(run_id)
                self.event(f"operator leaves failed run {run_id} alone (never cleared)")
        return self._clear_decision[run_id]

    def _ok(self, run: dict[str, Any]) -> bool:
        """A run that needs nothing more: succeeded, or failed and left alone by the operator."""
        return run["state"] == "success" or (
            run["state"] == "failed" and self._clear_decision.get(run["dag_run_id"]) is False)

    # -- chaos -------------------------------------------------------------------------------

    def _wait_task(self, want: Callable[[TaskProcess], bool], timeout: float) -> TaskProcess | None:
        """The first running task ``want`` accepts; the operator keeps clearing failures meanwhile
        (when every run fails, only a clear brings a task back)."""
        deadline = time.monotonic() + timeout
        next_clear = time.monotonic() + 2
        while time.monotonic() < deadline:
            self.af.check_alive()
            for tp in task_processes(self.af.procs["scheduler"].pid):
                if want(tp):
                    return tp
            if time.monotonic() >= next_clear:
                self.clear_failed()
                next_clear = time.monotonic() + 2
            time.sleep(0.2)
        return None

    def kill_one(self) -> None:
        """SIGKILL one running task at a random moment of its life; a target that ends first is a miss."""
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            tp = self._wait_task(lambda tp: True, timeout=max(1.0, deadline - time.monotonic()))
            if tp is None:
                break
            time.sleep(self.rng.uniform(0.0, 12.0))
            target = "task runner" if self.rng.random() < 0.7 else "worker+task"
            try:
                if not tp.runner.is_running() or tp.runner.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(tp.runner.pid)
                if self._task_of(tp.ti_id, refresh=True) == "?":  # its try already ended
                    raise psutil.NoSuchProcess(tp.runner.pid)
                spark = tp.has_spark()
                for p in [tp.runner] if target == "task runner" else [tp.worker, tp.runner]:
                    p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                self.fig.kill_misses += 1
                continue
            self.fig.kills += 1
            self.fig.kills_by_target[target] += 1
            self.event(f"kill -9 #{self.fig.kills} {target} of {self._task_of(tp.ti_id)} ti ..{tp.ti_id[-8:]}"
                       f"{' (spark up)' if spark else ''}")
            return
        self.violation("no running task to kill for 600 s")

    def restart_broker_mid_read(self) -> None:
        def reading(tp: TaskProcess) -> bool:
            return self._task_of(tp.ti_id) == READ_TASK and tp.has_spark()

        tp = self._wait_task(reading, timeout=300)
        if tp is None:
            self.violation("no read_interval task with a Spark job showed up in 300 s: broker not restarted")
            return
        time.sleep(self.rng.uniform(1.0, 4.0))
        self.event(f"broker stop (read_interval ti ..{tp.ti_id[-8:]} running: {tp.runner.is_running()})")
        took = self.broker.restart()
        self.fig.broker_restarts += 1
        self.event(f"broker back after {took:.1f}s")

    def restart_postgres_mid_commit(self) -> None:
        """Restart as soon as a job's manifest appears: the batch is verifying or committing."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            self.af.check_alive()
            fresh = sorted(_manifests(self.output_root) - self._seen_manifests)
            self._seen_manifests.update(fresh)
            if fresh and any(tp for tp in task_processes(self.af.procs["scheduler"].pid)):
                self.event(f"postgres stop (manifest {Path(fresh[0]).parent.name} just written)")
                took = self.pg.restart()
                self.fig.postgres_restarts += 1
                self.event(f"postgres back after {took:.1f}s")
                return
            time.sleep(0.05)
        self.violation("no job finished writing in 300 s: postgres not restarted")

    def chaos(self) -> None:
        opts = self.opts
        self._seen_manifests.update(_manifests(self.output_root))
        plan: list[str] = ["kill"] * opts.kills
        if opts.broker_restart:
            plan.insert(self.rng.randint(0, len(plan) // 2), "broker")
        if opts.postgres_restart:
            plan.insert(self.rng.randint(len(plan) // 2, len(plan)), "postgres")
        began = time.monotonic()
        spacing = opts.duration / max(1, len(plan))
        for i, action in enumerate(plan):
            # spread the actions over the publishing duration, at seeded random moments
            at = began + (i + self.rng.random()) * spacing
            self._pause(max(0.0, at - time.monotonic()), self.clear_failed)
            self._seen_manifests.update(_manifests(self.output_root))
            if action == "kill":
                self.kill_one()
            elif action == "broker":
                self.restart_broker_mid_read()
            else:
                self.restart_postgres_mid_commit()
            self.clear_failed()
        self._pause(max(0.0, began + opts.duration - time.monotonic()), self.clear_failed)

    # -- the end -----------------------------------------------------------------------------

    def settle(self) -> None:
        """Stop publishing; let the intervals covering the last record, then idle ones, succeed."""
        assert self.publisher is not None
        self.publisher.stop_event.set()
        self.publisher.join(timeout=120)
        if self.publisher.error:
            self.violation(f"publisher failed: {self.publisher.error!r}")
        stopped = time.time()
        with self.client() as client:
            self._tails_at_stop = {s: client.committed_tail(s) for s in self.streams}
        self.event(f"publishing stopped: {len(self.publisher.confirmed)} records confirmed, "
                   f"tails {self._tails_at_stop}")
        interval = self.opts.interval
        # The run whose interval ends after the last publish (+1 interval of margin for broker clock
        # and chunk granularity) reads the last record.
        covered_at = stopped + interval
        last = self._wait_runs_until(covered_at, "the last record")
        if last is not None and self.opts.idle_runs:
            self._watch_idle(last)
        self._quiesce()

    def _watch_idle(self, last: float) -> None:
        """Intervals without new data must not write to the stream (a StoreOffset writes a tracking
        chunk, which the next interval would read and store again, forever).
        """
        interval = self.opts.interval
        with self.client() as client:
            tails = {s: client.committed_tail(s) for s in self.streams}
        idle_until = last + self.opts.idle_runs * interval
        if self._wait_runs_until(idle_until, f"{self.opts.idle_runs} idle intervals"):
            with self.client() as client:
                after = {s: client.committed_tail(s) for s in self.streams}
            self.fig.idle_growth = {s: after[s] - tails[s] for s in self.streams if after[s] != tails[s]}
            for s, grew in self.fig.idle_growth.items():
                self.violation(f"idle stays idle: {s} grew by {grew} offsets over {self.opts.idle_runs} "
                               f"intervals without new data (tail {tails[s]} -> {after[s]})")

    def _quiesce(self) -> None:
        """Pause the DAG and wait for running tasks to end, so the checks see a still system."""
        self.af.api("PATCH", f"dags/{DAG_ID}", {"is_paused": True})
        deadline = time.monotonic() + 300
        while task_processes(self.af.procs["scheduler"].pid) and time.monotonic() < deadline:
            time.sleep(0.25)
        if self.monitor is not None:
            self.monitor.stop_event.set()
            self.monitor.join(timeout=30)
            self.fig.offset_samples = self.monitor.samples

    def _wait_runs_until(self, until: float, what: str) -> float | None:
        """Wait until the DAG run whose data interval contains ``until`` and all before it succeeded.

        In the parallel variant, runs the operator left failed count as done, so their work falls
        to later runs: the wait goes on (more intervals, more runs) until the data is caught up
        (:meth:`_caught_up`), and returns the newest run's interval end, so that idle intervals
        are only the ones after it.

        Returns that run's data interval end (epoch seconds), or ``None`` (a violation) on timeout.
        """
        deadline = time.monotonic() + self.opts.settle_timeout
        last_report = time.monotonic()
        while True:
            self.af.check_alive()
            self.clear_failed()
            runs = self.af.dag_runs(DAG_ID)
            ends = sorted(((datetime.fromisoformat(r["data_interval_end"]).timestamp(), r) for r in runs),
                          key=lambda er: er[0])
            needed = [(e, r) for e, r in ends if e - self.opts.interval < until]
            if needed and needed[-1][0] >= until and all(self._ok(r) for _, r in needed):
                if not self.opts.parallel:
                    self.event(f"all {len(needed)} runs up to {what} succeeded")
                    self._checked_until = needed[-1][0]
                    return needed[-1][0]
                if self._caught_up():
                    left = sum(r["state"] != "success" for _, r in needed)
                    self.event(f"all {len(needed)} runs up to {what} done ({left} left failed by the "
                               "operator) and the data caught up")
                    # runs after the needed ones may still be running: the end-of-run check
                    # covers only the needed ones, the idle window starts after all of them
                    self._checked_until = needed[-1][0]
                    return max(needed[-1][0], ends[-1][0])
            if time.monotonic() > deadline:
                bad = Counter(r["state"] for _, r in needed if not self._ok(r))
                self.violation(f"DAG runs covering {what} did not all succeed within "
                               f"{self.opts.settle_timeout:.0f}s: {dict(bad)} of {len(needed)} not success")
                return None
            if time.monotonic() - last_report > 60:
                last_report = time.monotonic()
                states = Counter(r["state"] for r in runs)
                self.event(f"waiting for {what}: runs {dict(states)}")
            time.sleep(1)

    def _caught_up(self) -> bool:
        """The parallel variant's "done": no claim left, every committed range published, the
        watermark past every offset that existed when publishing stopped, and the whole audit
        (ledger, broker offsets, outputs) clean. Any doubt (a server restarting) is "not yet"."""
        from streamledger.batch.proof import audit
        from streamledger.ledger import RangeStatus

        try:
            with self.ledger() as ledger:
                ranges = ledger.ranges(self.pipeline)
                if any(r.status == RangeStatus.CLAIMED or (r.status == RangeStatus.COMMITTED and r.records
                                                           and r.published_at is None) for r in ranges):
                    return False
                marks = watermarks(ranges, self.streams)
                for stream, tail in self._tails_at_stop.items():
                    mark = marks[stream]
                    if tail > 0 and (mark is None or mark < tail - 1):
                        return False
                with self.client() as client:
                    return bool(audit(ledger, self.pipeline, broker=client).clean)
        except Exception:
            return False

    # -- verification ------------------------------------------------------------------------

    def verify(self) -> None:
        from streamledger.batch.proof import audit as proof_audit
        from streamledger.ledger import RangeStatus

        assert self.publisher is not None
        confirmed = self.publisher.confirmed
        self.fig.published = len(confirmed)
        self.fig.publish_retries = self.publisher.retries
        ledger = self.ledger()
        try:
            ranges = ledger.ranges(self.pipeline)
            self.fig.ranges = Counter(str(r.status) for r in ranges)
            for r in ranges:
                if r.status == RangeStatus.CLAIMED:
                    self.violation(f"claim left: {r.source.stream} [{r.start}, {r.end}) held by {r.run}")
                if r.status == RangeStatus.COMMITTED and r.records and r.published_at is None:
                    self.violation(f"committed range {r.source.stream} [{r.start}, {r.end}) ({r.records} "
                                   f"records, committed by {r.run}) never published")
            ids: Counter[int] = Counter()
            rows_by_stream: dict[str, list[int]] = {}
            for r in ranges:
                if r.status != RangeStatus.COMMITTED or not r.records:
                    continue
                where = f"{r.source.stream} [{r.start}, {r.end})"
                try:
                    tables = output_tables(r.output or "")
                except Exception as exc:
                    self.violation(f"committed range {where} ({r.records} records): output unreadable: {exc}")
                    continue
                offsets = []
                for t in tables:
                    columns = (t.column(c).to_pylist() for c in ("stream", "offset", "body"))
                    for stream, offset, body in zip(*columns, strict=True):
                        if stream != r.source.stream or not r.start <= offset < r.end:
                            self.violation(f"committed range {where}: output holds {stream} offset {offset}")
                        offsets.append(offset)
                        ids[json.loads(body)["id"]] += 1
                if len(offsets) != r.records or len(set(offsets)) != len(offsets):
                    self.violation(f"committed range {where}: output has {len(offsets)} rows "
                                   f"({len(set(offsets))} distinct offsets), ledger says {r.records}")
                rows_by_stream.setdefault(r.source.stream, []).extend(offsets)
            self.fig.in_outputs = sum(ids.values())
            want = set(confirmed)
            missing = sorted(want - set(ids))
            dupes = sorted(i for i, n in ids.items() if n > 1)
            strangers = sorted(set(ids) - want)
            self.fig.missing, self.fig.duplicates = len(missing), len(dupes)
            self.fig.unexpected = len(strangers)
            if missing:
                self.violation(f"{len(missing)} confirmed records in no committed output "
                               f"(ids {missing[:8]}...)")
            if dupes:
                self.violation(f"{len(dupes)} records in more than one committed output (ids {dupes[:8]}...)")
            if strangers:
                self.violation(f"{len(strangers)} records in outputs that were never confirmed "
                               f"(ids {strangers[:8]})")
            self._check_offsets(ranges, rows_by_stream)
            with self.client() as client:
                report = proof_audit(ledger, self.pipeline, broker=client, deep=True)
            if not report.clean:
                for line in report.to_text().splitlines():
                    if line.strip():
                        self.violation(f"audit: {line.strip()}")
        finally:
            ledger.close()
        self._airflow_figures()

    def _check_offsets(self, ranges: list[Any], rows_by_stream: dict[str, list[int]]) -> None:
        marks = watermarks(ranges, self.streams)
        with self.client() as client:
            for stream in self.streams:
                watermark = marks[stream]
                stored = client.query_offset(stream, self.pipeline)
                user = sorted(rows_by_stream.get(stream, []))
                if stored == watermark:
                    continue
                if watermark is None:
                    self.violation(f"{stream}: broker stored offset {stored} but the ledger has no "
                                   "committed prefix")
                elif stored is None:
                    if user:
                        self.violation(f"{stream}: no stored offset, ledger watermark {watermark}")
                elif stored > watermark:
                    self.violation(f"{stream}: stored offset {stored} passes the ledger watermark "
                                   f"{watermark}")
                elif any(stored < o <= watermark for o in user):
                    n = sum(stored < o <= watermark for o in user)
                    self.violation(f"{stream}: stored offset {stored} lags the watermark {watermark} "
                                   f"over {n} committed records")

    def _airflow_figures(self) -> None:
        runs = self.af.dag_runs(DAG_ID)
        self.fig.dag_runs = len(runs)
        self.fig.dag_run_states = Counter(r["state"] for r in runs)
        tis = self.af.task_instances(DAG_ID)
        self.fig.task_tries = sum(int(ti.get("try_number") or 0) for ti in tis)
        self._seen_failed.update(r["dag_run_id"] for r in runs if r["state"] == "failed")
        self.fig.failed_runs = len(self._seen_failed)
        # Runs the scheduler started after the last one waited for are cut short by the pause.
        until = self._checked_until or float("inf")
        bad = [r["dag_run_id"] for r in runs if not self._ok(r)
               and datetime.fromisoformat(r["data_interval_end"]).timestamp() <= until]
        if bad:
            self.violation(f"{len(bad)} DAG runs not successful at the end (and not left failed by the "
                           f"operator): {bad[:5]}")

    # -- all of it ---------------------------------------------------------------------------

    def run(self) -> ChaosResult:
        self._t0 = time.monotonic()
        try:
            self.setup()
            self.chaos()
            self.settle()
            self.verify()
        except Exception as exc:  # a harness that cannot finish is a failed run; say why in one line
            self.violation(f"harness stopped: {type(exc).__name__}: {exc}".splitlines()[0])
        finally:
            self.fig.broker_restarts = self.broker.restarts
            self.fig.postgres_restarts = self.pg.restarts
            if self.monitor is not None:
                self.monitor.stop_event.set()
            if self.publisher is not None:
                self.publisher.stop_event.set()
                self.fig.published = len(self.publisher.confirmed)
            self.fig.wall_s = time.monotonic() - self._t0
            self.teardown()
        return ChaosResult(self.fig, self.violations, self.scratch)

    def teardown(self) -> None:
        for what, fn in (("airflow", self.airflow.stop if self.airflow else None),
                         ("broker", self.broker.destroy), ("postgres", self.pg.destroy)):
            if fn is None:
                continue
            try:
                fn()
            except Exception as exc:
                _log(f"teardown of {what} failed: {exc}")
        if not self.violations and not self.opts.keep:
            shutil.rmtree(self.scratch, ignore_errors=True)


def run_chaos(opts: ChaosOptions) -> ChaosResult:
    return ChaosRun(opts).run()


def report(result: ChaosResult) -> str:
    lines = ["chaos figures:", *(f"  {line}" for line in result.figures.lines())]
    if result.violations:
        lines.append(f"VIOLATIONS ({len(result.violations)}):")
        lines.extend(f"  {v}" for v in result.violations)
        lines.append(f"scratch kept for inspection: {result.scratch}")
    else:
        lines.append("CLEAN: every record exactly once, stored offsets = watermark, no claim left, "
                     "audit clean")
    return "\n".join(lines)
