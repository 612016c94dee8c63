"""``python -m tests.topology.chaos`` (``make chaos-topology``): the backfill DAG on the production
topology (:mod:`tests.topology.stack`) while it breaks, then the exactly-once checks.

The run brings the topology up with its own DAG settings: a fresh 3-partition super stream on the
RabbitMQ cluster, 60 s intervals, 4 at once, a bounded schedule (``STREAMLEDGER_END_DATE``), the
job on the Spark standalone cluster through spark-submit, the outputs on the S3 server, the ledger
in PostgreSQL. The first interval starts after the topology is up; numbered records are published
from its start for ``--duration`` seconds (never so long that the bounded schedule would miss
one). Then, in this order, each while a ``read_interval`` task is working:

* SIGKILL of a Celery worker's whole process group (worker, task, Spark driver), restarted after a
  few seconds: the task's try is lost with its worker and re-run on a worker;
* SIGKILL of a Spark executor (on a Spark worker) and of a Spark driver (the spark-submit JVM on a
  Celery worker);
* stop and restart of the RabbitMQ node leading partition 0, then of another node;
* a PostgreSQL restart (ledger and Airflow's metadata database at once); the scheduler, the
  dag-processor and the triggerer exit with it and are started again as a supervisor would
  (:func:`tests.topology.stack.revive`, on every look of the operator);
* the S3 server paused (SIGSTOP) for ``--s3-pause`` seconds, then resumed (SIGCONT).

The DAG's sink is Iceberg: each range's files land in its directory on S3 and are appended to one
table whose pyiceberg SQL catalog lives in the PostgreSQL ledger.

Then, once publishing stopped, the intervals covering the last record and an idle one must
succeed, and :class:`tests.chaos.harness.ChaosRun`'s checks run: every record exactly once in the
committed outputs (read from S3) and in the Iceberg table (read back with pyiceberg), stored
offsets at the watermarks, no claim left, the deep audit (the table's too) clean, every DAG run
successful; plus: the S3 secret on no command line seen during the run and in
no log of the topology. ``--plant-missing`` deletes one committed output object afterwards and
verifies again: the run must then fail (exit 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import psutil

from tests.chaos.harness import DAG_ID, READ_TASK, ChaosOptions, ChaosRun, report
from tests.chaos.servers import AirflowCluster, ServerError
from tests.topology import stack


class _Service:
    """What the chaos harness reads of a server it does not own: its URL and restart count."""

    def __init__(self, url: str = "") -> None:
        self.url, self.restarts = url, 0

    def destroy(self) -> None:  # the topology is taken down as a whole
        pass


def _descendants_where(under: list[int], keep: Any) -> list[psutil.Process]:
    """Processes under the pids ``under`` for which ``keep(process)`` holds (gone ones skipped)."""
    found = []
    for pid in under:
        try:
            procs = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue
        for p in procs:
            try:
                if keep(p):
                    found.append(p)
            except psutil.Error:
                continue
    return found


def _java_with(pattern: str, under: list[int]) -> list[psutil.Process]:
    return _descendants_where(
        under, lambda p: "java" in (p.name() or "") and pattern in " ".join(p.cmdline()))


def _connect_clients(under: list[int]) -> list[psutil.Process]:
    """Processes under ``under`` (Celery workers) with a connection to the Spark Connect server: the
    task processes whose batch is running its job there."""
    return _descendants_where(under, lambda p: any(
        c.raddr and c.raddr.port == stack.SPARK_CONNECT_PORT and c.status == psutil.CONN_ESTABLISHED
        for c in p.net_connections(kind="tcp")))


def _try_of(spark_submit: psutil.Process) -> tuple[str, str, int] | None:
    """(run id, task id, try) of the batch a spark-submit runs, from its staging ``--output``
    (``<dag>.<run>.<task>.<map index>.t<try>.<nonce>``, quoted with ``~``)."""
    try:
        args = spark_submit.cmdline()
        output = args[args.index("--output") + 1]
    except (psutil.Error, ValueError, IndexError):
        return None
    name = unquote(output.rstrip("/").rsplit("/", 1)[-1].replace("~", "%"))
    found = re.fullmatch(rf"{re.escape(DAG_ID)}\.(.+)\.([^.]+)\.-?\d+\.t(\d+)\.[0-9a-f]+", name)
    return (found.group(1), found.group(2), int(found.group(3))) if found else None


class SecretWatch(threading.Thread):
    """Looks at every process's command line every few seconds for the S3 secret."""

    def __init__(self, secret: str, period: float = 3.0) -> None:
        super().__init__(name="topology-secret-watch", daemon=True)
        self.secret, self.period = secret, period
        self.stop_event = threading.Event()
        self.looks = 0
        self.seen: list[str] = []

    def run(self) -> None:
        while not self.stop_event.wait(self.period):
            for p in psutil.process_iter(["pid", "name", "cmdline"]):
                line = " ".join(p.info.get("cmdline") or [])
                if self.secret in line and p.info["pid"] not in {int(s.split()[0]) for s in self.seen}:
                    self.seen.append(f"{p.info['pid']} {p.info.get('name')}")
            self.looks += 1


def secret_in_logs(secret: str, roots: list[Path]) -> list[str]:
    """Every file under ``roots`` (logs, task logs, Spark work directories) holding ``secret``."""
    needle = secret.encode()
    found = []
    for root in roots:
        for path in root.rglob("*") if root.is_dir() else []:
            try:
                if path.is_file() and needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found


class TopologyChaos(ChaosRun):
    def __init__(self, opts: ChaosOptions, *, plant_missing: bool = False, s3_pause: float = 20.0,
                 up_budget: float = 240.0, spark: str = "submit") -> None:
        super().__init__(opts)
        self.spark = spark
        self.plant_missing = plant_missing
        self.s3_pause = s3_pause
        self.up_budget = up_budget
        self.lay = stack.layout()
        self.output_root = f"{self.lay.output_root}/{self.tag}"  # type: ignore[assignment]
        self.broker = _Service(self.lay.broker_url)  # type: ignore[assignment]
        self.pg = _Service()  # type: ignore[assignment]
        self.kinds: Counter[str] = Counter()
        self.skipped: list[str] = []
        self._staging_seen: set[str] = set()
        self.lost_tries: list[tuple[str, str, int, str]] = []  # (run, task, try, worker) killed
        self.publish_stop = 0.0
        self.published_until = 0.0
        self.secret_watch: SecretWatch | None = None
        jobs = ("spark-submit to the standalone cluster, 1 core a job" if spark == "submit" else
                "a Spark Connect server in front of the standalone cluster, its 4 cores shared")
        self.fig.mode = (f"topology (CeleryExecutor, 2 workers x 2; max_active_runs 4, retries 2; {jobs}; "
                         "outputs and an Iceberg table on S3, its catalog in the PostgreSQL ledger)")
        self.in_table = 0

    # -- set-up ----------------------------------------------------------------------------

    def schedule(self) -> tuple[datetime, datetime, int]:
        """(first interval start, end date, intervals): the first interval begins once the topology
        should be up; the schedule ends ``--duration`` of publishing, a margin for a late ``up``, the
        interval covering the last record, one more, and the idle intervals later."""
        interval = self.opts.interval
        start = math.ceil((time.time() + self.up_budget) / interval) * interval
        n = math.ceil(self.opts.duration / interval) + 2 + 2 + self.opts.idle_runs
        first = datetime.fromtimestamp(start, UTC)
        return first, first + timedelta(seconds=n * interval - 1), n

    def setup(self) -> None:
        from streamledger.protocol.rabbitmq import StreamClient

        interval = self.opts.interval
        first, end, n = self.schedule()
        settings = {
            "STREAMLEDGER_SUPER_STREAM": self.super_stream,
            "STREAMLEDGER_PARTITIONS": str(self.opts.partitions),
            "STREAMLEDGER_PIPELINE": self.pipeline,
            "STREAMLEDGER_INTERVAL": f"{interval}s",
            "STREAMLEDGER_START_DATE": first.isoformat(),
            "STREAMLEDGER_END_DATE": end.isoformat(),
            "STREAMLEDGER_OUTPUT_ROOT": str(self.output_root),
            "STREAMLEDGER_MAX_ACTIVE_RUNS": "4",
            "STREAMLEDGER_RETRIES": "2",
            "STREAMLEDGER_INTERVAL_GRACE": str(self.opts.interval_grace),
            "STREAMLEDGER_SINK": "iceberg",  # its SQL catalog in the PostgreSQL ledger, files on S3
            **stack.spark_settings(self.spark),
        }
        self.event(f"topology down, Airflow's metadata reset, then up with the run's DAG settings "
                   f"({self.lay.root})")
        stack.down()
        stack.reset_airflow(self.lay)
        stack.write_dag_settings(self.lay, settings)
        began = time.monotonic()
        stack.up()
        self.event(f"topology up in {time.monotonic() - began:.0f}s")
        os.environ.update(stack.s3_env(self.lay))  # the checks read the outputs as a worker does
        self.secret_watch = SecretWatch(os.environ["AWS_SECRET_ACCESS_KEY"])
        self.secret_watch.start()
        self.ledger_url = self.lay.ledger_url
        with StreamClient.connect(self.broker.url) as client:
            client.create_super_stream(self.super_stream, partitions=self.opts.partitions)
            self.streams = client.partitions(self.super_stream)
        self.airflow = AirflowCluster(self.lay.airflow_home, {}, port=stack.API_PORT)
        deadline = time.monotonic() + 300
        while self.af.api("GET", f"dags/{DAG_ID}", ok=(200, 404)).get("dag_id") != DAG_ID:
            if time.monotonic() > deadline:
                raise stack.TopologyError(f"{DAG_ID} was not parsed in 300 s")
            time.sleep(2)
        from tests.chaos.harness import OffsetMonitor, Publisher

        self.monitor = OffsetMonitor(self)
        self.monitor.start()
        self.af.api("PATCH", f"dags/{DAG_ID}", {"is_paused": False})
        self.event(f"{DAG_ID} unpaused: {self.super_stream} x{len(self.streams)}, {n} intervals of "
                   f"{interval}s from {first:%H:%M:%S} to {end:%H:%M:%S}, 4 at once, retries 2, "
                   f"outputs {self.output_root}")
        # nothing before the first interval: initial_position="interval_start" would skip it
        self._pause(max(0.0, first.timestamp() + 1 - time.time()), self.clear_failed)
        latest = end.timestamp() + 1 - (2 + 2 + self.opts.idle_runs) * interval
        self.publish_stop = min(time.time() + self.opts.duration, latest)
        self.publisher = Publisher(self.broker.url, self.streams, self.opts.rate, self.tag)
        self.publisher.start()
        timer = threading.Timer(max(0.0, self.publish_stop - time.time()), self._stop_publishing)
        timer.daemon = True
        timer.start()
        until = datetime.fromtimestamp(self.publish_stop, UTC)
        self.event(f"publishing {self.opts.rate:g}/s until {until:%H:%M:%S}")

    def _stop_publishing(self) -> None:
        assert self.publisher is not None
        self.publisher.stop_event.set()
        self.publisher.join(timeout=120)
        self.published_until = time.time()

    # -- the supervisor and the operator -----------------------------------------------------

    def clear_failed(self) -> None:
        """Each look of the operator is also a look of the process supervisor."""
        try:
            revived = stack.revive(self.lay)
        except stack.TopologyError as exc:
            self.event(f"supervisor could not restart a component: {exc}".splitlines()[0])
            revived = []
        for name in revived:
            self.kinds[f"supervisor restart of {name}"] += 1
            self.event(f"supervisor restarted {name} (it had exited)")
        try:
            super().clear_failed()
        except ServerError as exc:  # the api-server or its database restarting: look again later
            self.event(f"operator could not look: {exc}".splitlines()[0][:200])

    # -- faults ----------------------------------------------------------------------------

    def _workers(self) -> list[int]:
        return [pid for w in stack.WORKERS if (pid := self.lay.pid(f"celery-{w}"))]

    def _spark_workers(self) -> list[int]:
        return [pid for w in stack.SPARK_WORKERS if (pid := self.lay.pid(w))]

    def _wait_for(self, what: str, find: Any, timeout: float = 600.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = find()
            if found:
                return found
            self._pause(1.0, self.clear_failed)
        self.skipped.append(what)
        self.event(f"no {what} within {timeout:.0f}s: fault not injected")
        return None

    def _jobs_under(self, pids: list[int]) -> list[psutil.Process]:
        """The processes under ``pids`` running a batch's Spark job: its spark-submit driver, or
        (Connect) the task process holding a session on the Connect server."""
        if self.spark == "connect":
            return _connect_clients(pids)
        return _java_with("SparkSubmit", pids)

    def _spark_job_running(self) -> list[psutil.Process]:
        return self._jobs_under(self._workers())

    def _tries_on(self, worker: str) -> list[tuple[str, str, int]]:
        """(run, task, try) of the running tries whose task log is in ``worker``'s own AIRFLOW_HOME
        (with Connect no command line names the try)."""
        logs = self.lay.worker_dir(worker) / "airflow" / "logs" / f"dag_id={DAG_ID}"
        return [(ti["dag_run_id"], ti["task_id"], ti["try_number"])
                for ti in self.af.task_instances(DAG_ID, state=["running"])
                if (logs / f"run_id={ti['dag_run_id']}" / f"task_id={ti['task_id']}"
                    / f"attempt={ti['try_number']}.log").exists()]

    def kill_celery_worker(self) -> None:
        def busy() -> str | None:
            for w in stack.WORKERS:
                pid = self.lay.pid(f"celery-{w}")
                if pid and self._jobs_under([pid]):
                    return w
            return None

        w = self._wait_for("Celery worker running a Spark job", busy)
        if not w:
            return
        pid = self.lay.pid(f"celery-{w}")
        if self.spark == "connect":
            self.lost_tries += [(*t, w) for t in self._tries_on(w) if t[1] == READ_TASK]
        else:
            self.lost_tries += [(*t, w) for p in _java_with("SparkSubmit", [pid] if pid else [])
                                if (t := _try_of(p))]
        stack.stop_process(self.lay, f"celery-{w}", sig=signal.SIGKILL, grace=10)
        self.kinds["celery worker"] += 1
        self.event(f"SIGKILL celery worker {w} (its task and Spark driver with it)")
        time.sleep(5)
        stack.start_worker(self.lay, w)
        self.event(f"celery worker {w} restarted")

    def kill_executor(self) -> None:
        found = self._wait_for("Spark executor",
                               lambda: _java_with("CoarseGrainedExecutorBackend", self._spark_workers()))
        if found:
            found[0].send_signal(signal.SIGKILL)
            self.kinds["spark executor"] += 1
            self.event(f"SIGKILL spark executor pid {found[0].pid}")

    def kill_driver(self) -> None:
        found = self._wait_for("Spark driver", self._spark_job_running)
        if found and self.spark == "connect":
            # the Connect server is the driver of every batch's job: all running batches lose it;
            # the supervisor (revive, on the operator's next look) starts it again
            pid = self.lay.pid("spark-connect")
            if not pid:
                raise stack.TopologyError("the Spark Connect server is not running")
            psutil.Process(pid).send_signal(signal.SIGKILL)
            self.kinds["spark driver"] += 1
            self.event(f"SIGKILL spark driver (the Spark Connect server's JVM) pid {pid}; "
                       f"{len(found)} task processes had a session on it")
        elif found:
            found[0].send_signal(signal.SIGKILL)
            self.kinds["spark driver"] += 1
            self.event(f"SIGKILL spark driver (spark-submit JVM) pid {found[0].pid}")

    def restart_rabbitmq_nodes(self) -> None:
        from streamledger.protocol.rabbitmq import StreamClient

        with StreamClient.connect(self.broker.url) as client:
            meta = client.metadata([self.streams[0]])[self.streams[0]]
        leader = stack.CLUSTER_STREAM_PORTS.index(meta.leader[1]) + 1 if meta.leader else 0
        if not leader:
            self.violation(f"no leader known for {self.streams[0]}: the leader's node not stopped")
            leader = 2
        other = next(n for n in (2, 3, 1) if n != leader)
        for node in (leader, other):
            self._wait_for("running Spark job", self._spark_job_running)
            began = time.monotonic()
            stack.rabbitmq("stop-node", "cluster", str(node), timeout=300)
            self.event(f"RabbitMQ node rabbitc{node} stopped"
                       + (f" (leader of {self.streams[0]})" if node == leader else ""))
            self._pause(10.0, self.clear_failed)
            stack.rabbitmq("start-node", "cluster", str(node), timeout=600)
            self.broker.restarts += 1
            self.kinds["rabbitmq node restart" + (" (partition leader)" if node == leader else "")] += 1
            self.event(f"RabbitMQ node rabbitc{node} back after {time.monotonic() - began:.0f}s")
            self._pause(10.0, self.clear_failed)

    def restart_postgres(self) -> None:
        found = self._wait_for("running read_interval task",
                               lambda: [ti for ti in self.af.task_instances(DAG_ID, state=["running"])
                                        if ti["task_id"] == READ_TASK])
        if not found:
            return
        began = time.monotonic()
        stack.restart_postgres(self.lay)
        self.pg.restarts += 1
        self.kinds["postgres restart"] += 1
        self.event(f"PostgreSQL restarted in {time.monotonic() - began:.0f}s")

    def _new_staging_manifest(self) -> str | None:
        """A job's ``_manifest.json`` in staging not seen before: its batch is about to verify,
        commit and publish (copy to the range's prefix, manifest last), all of it on S3."""
        import pyarrow.fs as pafs

        from streamledger.fs import StoreAccess, arrow_filesystem

        out = f"{self.output_root}/_staging"
        try:
            fs, root = arrow_filesystem(out, access=StoreAccess.from_environment(out))
            found = {i.path for i in fs.get_file_info(pafs.FileSelector(root, recursive=True,
                                                                          allow_not_found=True))
                     if i.path.endswith("/_manifest.json")}
        except OSError:
            return None
        fresh = sorted(found - self._staging_seen)
        self._staging_seen |= found
        return fresh[0] if fresh else None

    def pause_s3(self) -> None:
        """Pause the S3 server as soon as a job's staging manifest appears (the batch's verify,
        commit and publish then meet a store that does not answer)."""
        self._new_staging_manifest()  # what exists already does not count
        if not self._wait_for("job finishing its write to S3", self._new_staging_manifest):
            return
        pid = self.lay.pid("s3")
        if not pid:
            raise stack.TopologyError("the S3 server is not running")
        psutil.Process(pid).send_signal(signal.SIGSTOP)
        self.event(f"S3 server paused (SIGSTOP pid {pid}) for {self.s3_pause:.0f}s")
        try:
            time.sleep(self.s3_pause)
        finally:
            psutil.Process(pid).send_signal(signal.SIGCONT)
        self.kinds["s3 server pause"] += 1
        self.event("S3 server resumed (SIGCONT)")

    def chaos(self) -> None:
        for fault in (self.kill_celery_worker, self.kill_executor, self.kill_driver,
                      self.restart_rabbitmq_nodes, self.restart_postgres, self.pause_s3):
            try:
                fault()
            except Exception as exc:  # a fault that cannot be injected is a failed run
                self.violation(f"fault {fault.__name__} failed: {exc}".splitlines()[0])
            # the system reacts (Spark re-runs the task of a killed executor, a node rejoins)
            # before the next fault, which then meets another job
            self._pause(15.0, self.clear_failed)
        for what in self.skipped:
            self.violation(f"a fault was not injected: no {what} showed up")

    # -- the end ---------------------------------------------------------------------------

    def settle(self) -> None:
        """Publishing stops at its own time (whatever the faults did); then the intervals covering
        the last record, and the idle ones, must succeed."""
        assert self.publisher is not None
        while not self.published_until:
            self._pause(2.0, self.clear_failed)
        if self.publisher.error:
            self.violation(f"publisher failed: {self.publisher.error!r}")
        with self.client() as client:
            self._tails_at_stop = {s: client.committed_tail(s) for s in self.streams}
        self.event(f"publishing stopped: {len(self.publisher.confirmed)} records confirmed, "
                   f"tails {self._tails_at_stop}")
        last = self._wait_runs_until(self.published_until + self.opts.interval, "the last record")
        if last is not None and self.opts.idle_runs:
            self._watch_idle(last)
        self._quiesce()

    def _quiesce(self) -> None:
        self.af.api("PATCH", f"dags/{DAG_ID}", {"is_paused": True})
        deadline = time.monotonic() + 300
        while self.af.task_instances(DAG_ID, state=["running", "queued"]) and time.monotonic() < deadline:
            time.sleep(2)
        if self.monitor is not None:
            self.monitor.stop_event.set()
            self.monitor.join(timeout=30)
            self.fig.offset_samples = self.monitor.samples

    def verify(self) -> None:
        self.fig.kills = sum(v for k, v in self.kinds.items() if "restart" not in k and "pause" not in k)
        self.fig.kills_by_target = Counter({k: v for k, v in self.kinds.items()
                                            if "restart" not in k and "pause" not in k})
        super().verify()
        self._check_table()
        self._report_lost_tries()
        self._check_secret()
        if self.plant_missing and not self.violations:
            import pyarrow.fs as pafs

            from streamledger.fs import StoreAccess, arrow_filesystem

            out = str(self.output_root)
            fs, root = arrow_filesystem(out, access=StoreAccess.from_environment(out))
            files = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
                           if i.type == pafs.FileType.File and i.path.endswith(".parquet")
                           and "/_staging/" not in i.path)
            if files:
                self.event(f"verified clean ({self.fig.in_outputs} records exactly once); now planting "
                           "a missing object")
                fs.delete_file(files[0])
                self.event(f"planted a missing object: deleted s3://{files[0]}")
                super().verify()
                self._check_table()

    def _check_table(self) -> None:
        """Every confirmed record exactly once in the Iceberg table, read back with pyiceberg as a
        reader would (the SQL catalog in the ledger's database, the files on S3), and every committed
        range with records published into that one table."""
        from pyiceberg.catalog import load_catalog

        from streamledger.batch.sinks.iceberg import CATALOG_NAME
        from streamledger.ledger import RangeStatus

        assert self.publisher is not None
        ledger = self.ledger()
        try:
            done = [r for r in ledger.ranges(self.pipeline)
                    if r.status == RangeStatus.COMMITTED and r.records]
        finally:
            ledger.close()
        tables = {r.sink_table for r in done}
        if len(tables) != 1 or not str(next(iter(tables))).startswith("iceberg:"):
            self.violation(f"committed ranges with records name the tables {sorted(map(str, tables))}, "
                           "not one Iceberg table")
            return
        identifier = str(tables.pop()).partition(":")[2]
        try:
            catalog = load_catalog(CATALOG_NAME, type="sql", uri=self.lay.ledger_url,
                                   **{"s3.endpoint": os.environ["AWS_ENDPOINT_URL"],
                                      "s3.region": os.environ["AWS_REGION"]})
            table = catalog.load_table(identifier)
            rows = table.scan(selected_fields=("stream", "offset", "body")).to_arrow()
        except Exception as exc:
            self.violation(f"Iceberg table {identifier} unreadable: {str(exc).splitlines()[0][:300]}")
            return
        ids = Counter(json.loads(b)["id"] for b in rows.column("body").to_pylist())
        keys = Counter(zip(rows.column("stream").to_pylist(), rows.column("offset").to_pylist(), strict=True))
        self.in_table = sum(ids.values())
        want = set(self.publisher.confirmed)
        missing, dupes = want - set(ids), [i for i, n in ids.items() if n > 1]
        if missing:
            self.violation(f"Iceberg table {identifier}: {len(missing)} confirmed records absent "
                           f"(ids {sorted(missing)[:8]}...)")
        if dupes or any(n > 1 for n in keys.values()):
            self.violation(f"Iceberg table {identifier}: {len(dupes)} records more than once")
        if set(ids) - want:
            self.violation(f"Iceberg table {identifier}: {len(set(ids) - want)} records never confirmed")
        if self.in_table != sum(r.records for r in done):
            self.violation(f"Iceberg table {identifier}: {self.in_table} rows, the ledger's committed "
                           f"ranges {sum(r.records for r in done)}")
        self.event(f"Iceberg table {identifier} read back with pyiceberg: {self.in_table} rows, "
                   f"{len(ids)} distinct records")

    def _report_lost_tries(self) -> None:
        """Where the tries lost with a killed Celery worker were done again: each worker keeps its
        task logs in its own AIRFLOW_HOME (the TI's hostname is the machine's, the same for both)."""
        for run_id, task_id, lost, worker in self.lost_tries:
            ti = self.af.api("GET", f"dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{task_id}")
            later = []
            for w in stack.WORKERS:
                logs = (self.lay.worker_dir(w) / "airflow" / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}"
                        / f"task_id={task_id}")
                later += [(int(f.stem.split("=")[1]), w) for f in logs.glob("attempt=*.log")
                          if int(f.stem.split("=")[1]) > lost]
            where = ", ".join(f"try {n} on {w}" for n, w in sorted(later)) or "no later try"
            self.event(f"{task_id} of {run_id}: try {lost} lost with worker {worker}; then {where}; "
                       f"final state {ti['state']}")

    def _check_secret(self) -> None:
        if self.secret_watch is None:
            return
        self.secret_watch.stop_event.set()
        self.secret_watch.join(timeout=30)
        for proc in self.secret_watch.seen:
            self.violation(f"the S3 secret was on the command line of process {proc}")
        roots = [self.lay.logs, self.lay.root / "spark", *(self.lay.worker_dir(w) for w in stack.WORKERS),
                 self.lay.airflow_home / "logs"]
        for path in secret_in_logs(self.secret_watch.secret, roots):
            self.violation(f"the S3 secret is in the log {path}")
        self.event(f"S3 secret: on no command line in {self.secret_watch.looks} looks at every process, "
                   f"in no file under the logs, task logs and Spark work directories")

    def teardown(self) -> None:
        if self.secret_watch is not None:
            self.secret_watch.stop_event.set()
        try:
            stack.down()
        except Exception as exc:
            self.event(f"topology down failed: {exc}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.topology.chaos", description=__doc__)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=None,
                   help="publishing seconds (default 300; 540 with --spark connect, below)")
    p.add_argument("--interval", type=int, default=60, help="DAG data interval in seconds")
    p.add_argument("--rate", type=float, default=20.0, help="records published per second")
    p.add_argument("--s3-pause", type=float, default=20.0, help="seconds the S3 server stays paused")
    p.add_argument("--up-budget", type=float, default=240.0,
                   help="seconds from now to the first interval (the topology comes up meanwhile)")
    p.add_argument("--settle-timeout", type=float, default=3600.0)
    p.add_argument("--spark", choices=stack.SPARK_MODES, default="submit",
                   help="submit: spark-submit to the standalone cluster (the driver on the Celery worker); "
                        "connect: a Spark Connect server in front of it (the server is the driver)")
    p.add_argument("--plant-missing", action="store_true",
                   help="delete one committed output object after convergence: the run must fail")
    a = p.parse_args(argv)
    # Every fault waits for a Spark job with records, which only runs while records are published
    # (an idle interval's batch runs no job). Through spark-submit a batch takes minutes, so jobs
    # run long after publishing stops; through Connect a batch is done seconds after its interval,
    # and the last faults (PostgreSQL, the S3 pause) found no job after 300 s of publishing.
    duration = a.duration or (540.0 if a.spark == "connect" else 300.0)
    opts = ChaosOptions(seed=a.seed, kills=0, duration=duration, interval=a.interval, rate=a.rate,
                        broker_restart=False, postgres_restart=False, settle_timeout=a.settle_timeout,
                        interval_grace=float(a.interval), idle_runs=1,
                        scratch=stack.layout().root / "chaos" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S"))

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    run = TopologyChaos(opts, plant_missing=a.plant_missing, s3_pause=a.s3_pause,
                        up_budget=a.up_budget, spark=a.spark)
    result = run.run()
    print(report(result).replace("chaos figures:", "chaos-topology figures:"))
    print(f"  records in the Iceberg table: {run.in_table}")
    print(f"  faults by kind: {json.dumps(dict(run.kinds))}")
    return 0 if result.clean else 1


if __name__ == "__main__":
    sys.exit(main())
