"""``StreamBatchComponent`` the way a Dagster user runs it: ``dg`` in fresh processes on a project
laid out as ``create-dagster`` lays it out, against the real broker and a local Spark Connect server.

One project serves the whole module (a module-scoped fixture: ``dg list components``, ``dg scaffold
defs``, ``dg utils refresh-defs-state`` once), with two components: ``events`` on a super stream
(unpartitioned, backlog sensor) and ``windowed`` on one stream with one-minute time-window partitions
(the stream :class:`~tests.integration.dagster.conftest.MinuteWaves` publishes wave A to, from the first
Dagster test on: its window has usually closed when this module starts). The
launches run their Spark jobs on the session's Connect server, so a ``dg launch`` costs its Python
start and the job, not a JVM start (~55 s -> ~20 s each on the shared 2-core machine). The tests run
in file order and build on each other's ledger; the one that adds a partition to the super stream
comes last."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger.ledger import Ledger
from streamledger.ledger.models import RANGE_TABLE
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.dagster.conftest import MinuteWaves

pytestmark = [pytest.mark.dagster, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[3]
DG = str(Path(sys.executable).parent / "dg")
TYPE = "streamledger.dagster.components.StreamBatchComponent"
DOWN_URL = "rabbitmq-stream://guest:guest@127.0.0.1:9/"  # discard port: nothing listens
FMT = "%Y-%m-%d-%H:%M"

#: Dagster's re-execution from failure of a run (what the UI's "Re-execute from failure" does):
#: the job is rebuilt from the run's own code origin, so it is the project's component, as launched.
REEXECUTE = """\
import sys
from dagster import DagsterInstance, ReexecutionOptions, execute_job
from dagster._utils.hosted_user_process import recon_job_from_origin

instance = DagsterInstance.get()
run = instance.get_run_by_id(sys.argv[1])
options = ReexecutionOptions.from_failure(run.run_id, instance)
with execute_job(recon_job_from_origin(run.job_code_origin), instance=instance,
                 reexecution_options=options) as result:
    child = result.dagster_run
    print("REEXECUTED", child.run_id, child.root_run_id, result.success)
"""


def write_project(root: Path) -> None:
    """A dg project: pyproject, ``definitions.py`` loading the defs folder (in-process executor)."""
    (root / "src" / "sl_proj" / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "sl-proj"
        version = "0.1.0"
        requires-python = ">=3.11"
        dependencies = ["streamledger[dagster]"]

        [tool.dg]
        directory_type = "project"

        [tool.dg.project]
        root_module = "sl_proj"
        """))
    (root / "src" / "sl_proj" / "__init__.py").write_text("")
    (root / "src" / "sl_proj" / "defs" / "__init__.py").write_text("")
    (root / "src" / "sl_proj" / "definitions.py").write_text(textwrap.dedent("""\
        from pathlib import Path

        import dagster as dg


        @dg.definitions
        def defs() -> dg.Definitions:
            # one process per run: the batch step's Spark session is opened once
            return dg.Definitions.merge(
                dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
                dg.Definitions(executor=dg.in_process_executor),
            )
        """))


@dataclass
class Project:
    root: Path
    env: dict[str, str]
    url: str
    out: Path
    ledger_url: str
    super_stream: str
    partitions: list[str]
    win_stream: str
    window: datetime  # the one-minute window of the events published to win_stream
    outputs: dict[str, str] = field(default_factory=dict)  # fixture-time dg outputs
    timings: dict[str, list[float]] = field(default_factory=dict)

    pipeline = property(lambda self: f"p-{self.super_stream}")
    key = property(lambda self: f"streams/{self.pipeline}")
    win_pipeline = property(lambda self: f"p-{self.win_stream}")
    win_key = property(lambda self: f"streams/{self.win_pipeline}")

    def command(self, *args: str, broker: str | None = None) -> tuple[list[str], dict[str, str]]:
        return [DG, *args], {**self.env, "SL_BROKER_URL": broker or self.url}

    def dg(self, *args: str, broker: str | None = None, stdout_only: bool = False) -> str:
        """Run ``dg args`` in the project; fails the test on a non-zero exit or a leaked password."""
        cmd, env = self.command(*args, broker=broker)
        began = time.monotonic()
        done = subprocess.run(cmd, cwd=self.root, env=env, capture_output=True, text=True, timeout=240,
                              check=False)
        self.timings.setdefault(" ".join(args[:2]), []).append(round(time.monotonic() - began, 1))
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"dg {' '.join(args)}:\n{output[-4000:]}"
        assert "guest:guest" not in output, "the broker password must not reach dg's output"
        return done.stdout if stdout_only else output

    def publish(self, stream_ids: dict[str, Sequence[int]]) -> None:
        with StreamClient.connect(self.url) as client:
            for stream, ids in stream_ids.items():
                bodies = [json.dumps({"id": i}).encode() for i in ids]
                assert client.publish(stream, bodies).confirmed == len(bodies)

    def publish_spread(self, ids: range) -> None:
        """Events ``{"id": i}`` round robin over the super stream's first partitions."""
        n = len(self.partitions)
        self.publish({p: [i for i in ids if i % n == k] for k, p in enumerate(self.partitions)})

    def ranges(self, pipeline: str) -> list[Any]:
        ranges = Ledger(self.ledger_url).ranges(pipeline)
        return sorted(ranges, key=lambda r: (r.source.stream, r.start, r.id))

    def written_ids(self, pipeline: str) -> list[int]:
        return [json.loads(b)["id"] for f in sorted((self.out / pipeline).glob("*/*/*/*.parquet"))
                for b in pq.read_table(f, columns=["body"]).column("body").to_pylist()]


def defs_yaml(p: Project) -> tuple[str, str]:
    events = textwrap.dedent(f"""\
        type: {TYPE}
        attributes:
          pipeline: {p.pipeline}
          super_stream: {p.super_stream}
          output_root: {p.out}
          broker_url_env: SL_BROKER_URL
          ledger_url: {p.ledger_url}
          spark_remote: {p.env["SL_SPARK_REMOTE"]}
          asset_attributes:
            key: "streams/{{{{ pipeline }}}}"
            owners: ["team:data"]
        """)
    start = (p.window - timedelta(minutes=1)).strftime(FMT)
    windowed = textwrap.dedent(f"""\
        type: {TYPE}
        attributes:
          pipeline: {p.win_pipeline}
          stream: {p.win_stream}
          output_root: {p.out}
          broker_url_env: SL_BROKER_URL
          ledger_url: {p.ledger_url}
          spark_remote: {p.env["SL_SPARK_REMOTE"]}
          partitions_def:
            type: time_window
            cron_schedule: "* * * * *"
            fmt: "{FMT}"
            start_date: "{start}"
          asset_attributes:
            key: "streams/{{{{ pipeline }}}}"
        """)
    return events, windowed


@pytest.fixture(scope="module")
def project(rabbitmq_url: str, spark_connect: str, tmp_path_factory: pytest.TempPathFactory,
            minute_waves: MinuteWaves) -> Iterator[Project]:
    registered = {e.value for e in importlib.metadata.entry_points(group="dagster_dg_cli.registry_modules")}
    assert "streamledger.dagster.components" in registered, (
        "streamledger's dagster_dg_cli.registry_modules entry point is not installed: reinstall the "
        "package (make venv / pip install -e .)"
    )
    tmp = tmp_path_factory.mktemp("dg")
    tag = uuid.uuid4().hex[:8]
    super_stream = f"t-dg-events-{tag}"
    # the windowed component's events: wave A, 40 events in one minute of broker time, published
    # with the first Dagster test so that their window has closed (a partition Dagster can launch)
    # by the time its test runs
    win_stream, window = minute_waves.stream, minute_waves.first()
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_super_stream(super_stream, partitions=2)
        partitions = client.partitions(super_stream)
    root = tmp / "proj"
    write_project(root)
    (tmp / "home").mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp / "home"),
        # the dg processes (and the re-execution) import this checkout and the project
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "src"), str(root / "src"), os.environ.get("PYTHONPATH", "")]
        ),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "COLUMNS": "250",
        "DAGSTER_DISABLE_TELEMETRY": "1",
        "SL_SPARK_REMOTE": spark_connect,
    }
    p = Project(root=root, env=env, url=rabbitmq_url, out=tmp / "out",
                ledger_url=f"sqlite:///{tmp / 'ledger.db'}", super_stream=super_stream,
                partitions=partitions, win_stream=win_stream, window=window)
    try:
        p.outputs["list components"] = p.dg("list", "components")
        p.dg("scaffold", "defs", TYPE, "events")
        defs = root / "src" / "sl_proj" / "defs"
        p.outputs["scaffolded"] = (defs / "events" / "defs.yaml").read_text()
        events, windowed = defs_yaml(p)
        (defs / "events" / "defs.yaml").write_text(events)
        (defs / "windowed").mkdir()
        (defs / "windowed" / "defs.yaml").write_text(windowed)
        p.dg("utils", "refresh-defs-state")
        yield p
    finally:
        print("dg timings (s):", p.timings)
        with StreamClient.connect(rabbitmq_url) as client:
            client.delete_super_stream(super_stream, missing_ok=True)
            try:
                client.delete_stream(f"{super_stream}-2")
            except Exception:  # best effort: it may not exist
                pass


def state_streams(p: Project) -> list[str]:
    """The super stream's partitions as the last ``dg utils refresh-defs-state`` wrote them."""
    states = [json.loads(f.read_text())["streams"]
              for f in (p.root / "src" / "sl_proj" / "defs" / ".local_defs_state").glob("*/state")]
    [streams] = [s for s in states if s[0].startswith(p.super_stream)]
    return list(streams)


def test_scaffold_refresh_and_load_with_the_broker_down(project: Project) -> None:
    p = project
    assert TYPE in p.outputs["list components"]
    scaffolded = p.outputs["scaffolded"]
    assert scaffolded.startswith(f"type: {TYPE}") and "# Consumer reference" in scaffolded
    assert state_streams(p) == p.partitions  # discovered by refresh-defs-state
    # the broker is down after the state was written: the location still loads
    assert "All definitions loaded successfully" in p.dg("check", "defs", broker=DOWN_URL)


def committed(p: Project, pipeline: str) -> list[tuple[str, int, int, int]]:
    return [(r.source.stream, r.start, r.end, r.records) for r in p.ranges(pipeline)
            if str(r.status) == "committed" and not r.empty]


def assert_contiguous(spans: list[tuple[str, int, int, int]]) -> None:
    by_stream: dict[str, list[tuple[int, int]]] = {}
    for stream, start, end, _ in spans:
        by_stream.setdefault(stream, []).append((start, end))
    for stream, rs in by_stream.items():
        assert rs[0][0] == 0 and all(b[0] == a[1] for a, b in pairwise(rs)), (stream, rs)


def test_launch_twice_the_second_reads_only_new_data(project: Project) -> None:
    p = project
    p.publish_spread(range(30))
    first = p.dg("launch", "--assets", p.key)
    assert "RUN_SUCCESS" in first and "Asset check 'ledger_audit' on 'streams/" in first and "passed" in first
    assert committed(p, p.pipeline) == [(s, 0, 15, 15) for s in p.partitions]

    p.publish_spread(range(30, 50))
    assert "RUN_SUCCESS" in p.dg("launch", "--assets", p.key)
    spans = committed(p, p.pipeline)
    assert len(spans) == 4
    assert_contiguous(spans)
    second = [s for s in spans if s[1] > 0]
    assert sorted(s[3] for s in second) == [10, 10], "the second launch reads only the 20 new events"
    ids = p.written_ids(p.pipeline)
    assert sorted(ids) == list(range(50))


def test_killed_launch_reexecuted_from_failure_same_ranges_exactly_once(project: Project) -> None:
    from dagster import DagsterInstance, DagsterRunStatus
    from dagster._core.instance.ref import InstanceRef

    from streamledger.batch.proof import audit

    p = project
    before = {r.id for r in p.ranges(p.pipeline)}
    p.publish_spread(range(50, 70))
    cmd, env = p.command("launch", "--assets", p.key)
    proc = subprocess.Popen(cmd, cwd=p.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group: the kill reaches all of it
    try:
        deadline = time.monotonic() + 150
        while True:
            claimed = [r for r in p.ranges(p.pipeline) if r.id not in before and str(r.status) == "claimed"]
            if len(claimed) == len(p.partitions) or proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGSTOP)  # parked: nothing can move between this check and the kill
        parked = [r for r in p.ranges(p.pipeline) if r.id not in before]
        assert {str(r.status) for r in parked} == {"claimed"} and len(parked) == len(p.partitions), (
            f"the launch was to be killed holding its claims, found "
            f"{[(r.start, r.end, str(r.status)) for r in parked]}"
        )
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    killed_spans = {(r.source.stream, r.start, r.end) for r in parked}
    [run_id] = {r.run.run_id for r in parked}

    # what run monitoring does for a run whose process died: mark it failed
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(p.env["DAGSTER_HOME"]))
    run = instance.get_run_by_id(run_id)
    assert run is not None and run.status == DagsterRunStatus.STARTED
    instance.report_run_failed(run)

    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", REEXECUTE, run_id], cwd=p.root, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    p.timings.setdefault("re-execute", []).append(round(time.monotonic() - began, 1))
    assert done.returncode == 0 and "guest:guest" not in done.stdout + done.stderr, done.stderr[-4000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("REEXECUTED")]
    _, child, root, success = line.split()
    assert child != run_id and root == run_id and success == "True"

    mine = [r for r in p.ranges(p.pipeline) if r.id not in before]
    assert {(r.source.stream, r.start, r.end) for r in mine} == killed_spans, "the same ranges, not extended"
    assert {(str(r.status), r.run.run_id, r.run.try_number) for r in mine} == {("committed", run_id, 2)}
    assert_contiguous(committed(p, p.pipeline))
    ids = p.written_ids(p.pipeline)
    assert sorted(ids) == list(range(70)), "every event exactly once"
    with StreamClient.connect(p.url) as client:
        report = audit(Ledger(p.ledger_url), p.pipeline, broker=client)
    assert report.clean, report.to_text()


def test_partition_check_on_a_time_window_passes_then_fails_on_a_planted_range(project: Project) -> None:
    p = project
    closes = (p.window + timedelta(minutes=1, seconds=1)).timestamp()
    time.sleep(max(0.0, closes - time.time()))  # usually passed long ago
    window = p.window.strftime(FMT)
    out = p.dg("launch", "--assets", p.win_key, "--partition", window)
    assert "RUN_SUCCESS" in out
    assert f"Asset check 'partition_audit' on '{p.win_key}'" in out
    assert check_outcome(out, "partition_audit") == "passed"
    [done] = [r for r in p.ranges(p.win_pipeline) if str(r.status) == "committed" and not r.empty]
    assert (done.source.stream, done.start, done.records) == (p.win_stream, 0, 40)
    assert sorted(p.written_ids(p.win_pipeline)) == list(range(40))

    # a planted bad range: the ledger says 41 records where the output holds 40
    with sqlite3.connect(p.ledger_url.removeprefix("sqlite:///")) as db:
        planted = db.execute(f"UPDATE {RANGE_TABLE} SET records = records + 1 WHERE id = ?", (done.id,))
        assert planted.rowcount == 1
    again = p.dg("launch", "--assets", p.win_key, "--partition", window)
    assert check_outcome(again, "partition_audit") == "failed", again[-3000:]


def check_outcome(output: str, name: str) -> str:
    """``passed`` / ``failed`` from dg's log line of asset check ``name``."""
    lines = [x for x in output.splitlines() if f"Asset check '{name}'" in x]
    assert lines, f"no log line for asset check {name}"
    return "failed" if "did not pass" in lines[-1] else "passed" if "passed" in lines[-1] else lines[-1]


def description_of(p: Project, key: str, broker: str | None = None) -> str:
    listed = json.loads(p.dg("list", "defs", "--json", broker=broker, stdout_only=True))
    [asset] = [a for a in listed["assets"] if a["asset_key"] == key]
    return str(asset["description"])


def test_a_new_partition_shows_after_refresh_and_loading_calls_no_broker(
    project: Project, broker_43: Any
) -> None:
    from streamledger.protocol.amqp10.codec.types import Long
    from streamledger.protocol.amqp10.management import Management

    p = project
    new = f"{p.super_stream}-2"
    with Management.connect(f"amqp://guest:guest@{broker_43.host}:{broker_43.amqp_port}/") as m:
        m.declare_stream(new)
        m.bind(p.super_stream, new, "2", arguments={"x-stream-partition-order": Long(2)})
    with StreamClient.connect(p.url) as client:
        assert client.partitions(p.super_stream) == [*p.partitions, new]

    # before the refresh: the old partitions, loaded with the broker unreachable (no broker call)
    old = description_of(p, p.key, broker=DOWN_URL)
    assert f"Partitions at the last refresh: {', '.join(p.partitions)}." in old
    p.dg("utils", "refresh-defs-state")
    assert state_streams(p) == [*p.partitions, new]
    assert f"Partitions at the last refresh: {', '.join([*p.partitions, new])}." in description_of(p, p.key)
