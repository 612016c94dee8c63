"""``python -m tests.topology.chaos`` (``make chaos-topology``): the backfill DAG on the production
topology (:mod:`tests.topology.stack`) while it breaks, then the exactly-once checks.

The run brings the topology up with its own DAG settings (a fresh 3-partition super stream on the
RabbitMQ cluster, a 20 s interval, 4 intervals at once, the job on the Spark standalone cluster
through spark-submit, outputs in the shared output root, the ledger in PostgreSQL), publishes
numbered records, and injects, in this order, each while a ``read_interval`` task is working:

* SIGKILL of a Celery worker's whole process group (worker, task, Spark driver), restarted after a
  few seconds: the task's try is lost with its worker and re-run on a worker;
* SIGKILL of a Spark executor (on a Spark worker) and of a Spark driver (the spark-submit JVM on a
  Celery worker);
* stop and restart of the RabbitMQ node leading partition 0, then of another node;
* a PostgreSQL restart (ledger and Airflow's metadata database at once).

Then it stops publishing and checks with :class:`tests.chaos.harness.ChaosRun`'s own verification
(every record exactly once in the committed outputs, stored offsets at the watermarks, no claim left,
the deep audit clean, every DAG run successful). ``--plant-missing`` deletes one committed output
file afterwards and verifies again: the run must then fail (exit 1).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import psutil

from tests.chaos.harness import DAG_ID, READ_TASK, ChaosOptions, ChaosRun, report
from tests.chaos.servers import AirflowCluster
from tests.topology import stack


class _Service:
    """What the chaos harness reads of a server it does not own: its URL and restart count."""

    def __init__(self, url: str = "") -> None:
        self.url, self.restarts = url, 0

    def destroy(self) -> None:  # the topology is taken down as a whole
        pass


def _java_with(pattern: str, under: list[int]) -> list[psutil.Process]:
    found = []
    for pid in under:
        try:
            procs = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue
        for p in procs:
            try:
                if "java" in (p.name() or "") and pattern in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.Error:
                continue
    return found


class TopologyChaos(ChaosRun):
    def __init__(self, opts: ChaosOptions, *, plant_missing: bool = False) -> None:
        super().__init__(opts)
        self.plant_missing = plant_missing
        self.lay = stack.layout()
        self.output_root = self.lay.shared_output / self.tag
        self.broker = _Service(self.lay.broker_url)  # type: ignore[assignment]
        self.pg = _Service()  # type: ignore[assignment]
        self.kinds: Counter[str] = Counter()
        self.fig.mode = "topology (CeleryExecutor, 2 workers; max_active_runs 4, retries 2; spark-submit)"

    # -- set-up ----------------------------------------------------------------------------

    def setup(self) -> None:
        from streamledger.protocol.rabbitmq import StreamClient

        interval = self.opts.interval
        start = datetime.fromtimestamp(time.time() // interval * interval, UTC)
        settings = {
            "STREAMLEDGER_SUPER_STREAM": self.super_stream,
            "STREAMLEDGER_PARTITIONS": str(self.opts.partitions),
            "STREAMLEDGER_PIPELINE": self.pipeline,
            "STREAMLEDGER_INTERVAL": f"{interval}s",
            "STREAMLEDGER_START_DATE": start.isoformat(),
            "STREAMLEDGER_OUTPUT_ROOT": str(self.output_root),
            "STREAMLEDGER_MAX_ACTIVE_RUNS": "4",
            "STREAMLEDGER_RETRIES": "2",
            "STREAMLEDGER_INTERVAL_GRACE": str(self.opts.interval_grace),
        }
        self.event(f"topology down, then up with the run's DAG settings ({self.lay.root})")
        stack.down()
        stack.write_dag_settings(self.lay, settings)
        began = time.monotonic()
        stack.up()
        self.event(f"topology up in {time.monotonic() - began:.0f}s")
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

        self.publisher = Publisher(self.broker.url, self.streams, self.opts.rate, self.tag)
        self.publisher.start()
        self.monitor = OffsetMonitor(self)
        self.monitor.start()
        self.af.api("PATCH", f"dags/{DAG_ID}", {"is_paused": False})
        self.event(f"{DAG_ID} unpaused: {self.super_stream} x{len(self.streams)}, interval {interval}s, "
                   "4 intervals at once, retries 2")

    # -- the supervisor ----------------------------------------------------------------------

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
        super().clear_failed()

    # -- faults ----------------------------------------------------------------------------

    def _workers(self) -> list[int]:
        return [pid for w in stack.WORKERS if (pid := self.lay.pid(f"celery-{w}"))]

    def _spark_workers(self) -> list[int]:
        return [pid for w in stack.SPARK_WORKERS if (pid := self.lay.pid(w))]

    def _wait_for(self, what: str, find: Any, timeout: float = 300.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = find()
            if found:
                return found
            self._pause(1.0, self.clear_failed)
        self.event(f"no {what} within {timeout:.0f}s: fault skipped")
        return None

    def kill_celery_worker(self) -> None:
        def busy() -> str | None:
            for w in stack.WORKERS:
                pid = self.lay.pid(f"celery-{w}")
                if pid and _java_with("SparkSubmit", [pid]):
                    return w
            return None

        w = self._wait_for("Celery worker running a Spark job", busy)
        if not w:
            return
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
        found = self._wait_for("Spark driver", lambda: _java_with("SparkSubmit", self._workers()))
        if found:
            found[0].send_signal(signal.SIGKILL)
            self.kinds["spark driver"] += 1
            self.event(f"SIGKILL spark driver (spark-submit JVM) pid {found[0].pid}")

    def restart_rabbitmq_nodes(self) -> None:
        from streamledger.protocol.rabbitmq import StreamClient

        with StreamClient.connect(self.broker.url) as client:
            meta = client.metadata([self.streams[0]])[self.streams[0]]
        leader = stack.CLUSTER_STREAM_PORTS.index(meta.leader[1]) + 1 if meta.leader else 2
        other = next(n for n in (2, 3, 1) if n != leader)
        for node in (leader, other):
            began = time.monotonic()
            stack.rabbitmq("stop-node", "cluster", str(node), timeout=300)
            self.event(f"RabbitMQ node rabbitc{node} stopped"
                       + (f" (leader of {self.streams[0]})" if node == leader else ""))
            self._pause(5.0, self.clear_failed)
            stack.rabbitmq("start-node", "cluster", str(node), timeout=600)
            self.broker.restarts += 1
            self.kinds["rabbitmq node restart"] += 1
            self.event(f"RabbitMQ node rabbitc{node} back after {time.monotonic() - began:.0f}s")
            self._pause(10.0, self.clear_failed)

    def restart_postgres(self) -> None:
        self._wait_for("running read_interval task",
                       lambda: [ti for ti in self.af.task_instances(DAG_ID, state=["running"])
                                if ti["task_id"] == READ_TASK])
        began = time.monotonic()
        stack.restart_postgres(self.lay)
        self.pg.restarts += 1
        self.kinds["postgres restart"] += 1
        self.event(f"PostgreSQL restarted in {time.monotonic() - began:.0f}s")

    def chaos(self) -> None:
        began = time.monotonic()
        for fault in (self.kill_celery_worker, self.kill_executor, self.kill_driver,
                      self.restart_rabbitmq_nodes, self.restart_postgres):
            try:
                fault()
            except Exception as exc:  # a fault that cannot be injected is a failed run
                self.violation(f"fault {fault.__name__} failed: {exc}".splitlines()[0])
            self.clear_failed()
        self._pause(max(0.0, began + self.opts.duration - time.monotonic()), self.clear_failed)

    # -- the end ---------------------------------------------------------------------------

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
        self.fig.kills = sum(v for k, v in self.kinds.items() if "restart" not in k)
        self.fig.kills_by_target = Counter({k: v for k, v in self.kinds.items() if "restart" not in k})
        super().verify()
        if self.plant_missing and not self.violations:
            files = sorted(self.output_root.rglob("*.parquet"))
            if files:
                files[0].unlink()
                self.event(f"planted a missing object: deleted {files[0]}")
                super().verify()

    def teardown(self) -> None:
        try:
            stack.down()
        except Exception as exc:
            self.event(f"topology down failed: {exc}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.topology.chaos", description=__doc__)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=240.0, help="publishing seconds (at least)")
    p.add_argument("--interval", type=int, default=20, help="DAG data interval in seconds")
    p.add_argument("--rate", type=float, default=20.0, help="records published per second")
    p.add_argument("--settle-timeout", type=float, default=2400.0)
    p.add_argument("--plant-missing", action="store_true",
                   help="delete one committed output file after convergence: the run must fail")
    a = p.parse_args(argv)
    opts = ChaosOptions(seed=a.seed, kills=0, duration=a.duration, interval=a.interval, rate=a.rate,
                        broker_restart=False, postgres_restart=False, settle_timeout=a.settle_timeout,
                        interval_grace=float(a.interval), idle_runs=1,
                        scratch=stack.layout().root / "chaos" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S"))

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    run = TopologyChaos(opts, plant_missing=a.plant_missing)
    result = run.run()
    print(report(result).replace("chaos figures:", "chaos-topology figures:"))
    print(f"  faults by kind: {json.dumps(dict(run.kinds))}")
    return 0 if result.clean else 1


if __name__ == "__main__":
    sys.exit(main())

