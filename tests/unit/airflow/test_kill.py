"""``StreamBatchOperator.on_kill`` cancels the Spark work the task started: a real local Spark job
(interrupted by its tag) and a real ``spark-submit`` process (killed through the hook)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from streamledger.operators.batch import (
    SparkSubmitRunner,
    StreamBatchOperator,
    local_runner,
)
from streamledger.protocol.rabbitmq import StreamClient
from streamledger.spark.runners import LocalSparkRunner

pytestmark = [pytest.mark.spark]

SLOW_ROWS = 40  # each row sleeps 1 s on 2 cores: ~20 s when not cancelled


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _slow_write(spark: Any) -> None:
    """A write of SLOW_ROWS rows that each sleep 1 s in a Python UDF (two Spark jobs: the shuffle's
    map stage, then the write)."""
    from pyspark.sql.functions import udf

    @udf("long")
    def slow(x: int) -> int:
        time.sleep(1.0)
        return x

    spark.range(SLOW_ROWS).repartition(2).select(slow("id")).write.format("noop").mode("overwrite").save()


def test_on_kill_interrupts_the_local_spark_job(spark: Any) -> None:
    runner = local_runner("local[2]", None)
    assert isinstance(runner, LocalSparkRunner)
    assert runner.session() is spark
    op = StreamBatchOperator(task_id="read", pipeline="h14-kill", stream="s")
    outcome: dict[str, Any] = {}

    def job() -> None:  # what runner(...) does around run_job: the work runs under the runner's tag
        began = time.monotonic()
        try:
            with runner.tagged():
                _slow_write(spark)
            outcome["finished"] = True
        except Exception as exc:
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - began

    worker = threading.Thread(target=job)
    op._runner_in_use = runner  # execute() sets this around run_batch
    worker.start()
    tracker = spark.sparkContext.statusTracker()
    _wait(lambda: tracker.getActiveJobsIds(), 60, "the Spark job to start")
    time.sleep(1.0)
    op.on_kill()
    worker.join(60)
    assert not worker.is_alive()
    assert "finished" not in outcome, "the job ran to its end: on_kill did not cancel it"
    assert "cancel" in str(outcome["error"]).lower() or "interrupt" in str(outcome["error"]).lower()
    assert outcome["seconds"] < SLOW_ROWS / 2
    _wait(lambda: not tracker.getActiveJobsIds(), 30, "no active job left")
    # the session is still usable for the next task in this process
    assert spark.range(3).count() == 3


def test_on_kill_between_two_spark_jobs_cancels_the_next_one(spark: Any) -> None:
    """A write is several Spark jobs; a kill landing while none is active must still stop the next
    (``cancelJobsWithTag`` alone reaches only the active ones: the fresh-clone run of 2026-11-24 saw
    the slow job run to its end after on_kill)."""
    runner = local_runner("local[2]", None)
    op = StreamBatchOperator(task_id="read", pipeline="h14-kill-between", stream="s")
    between, killed = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def job() -> None:
        began = time.monotonic()
        try:
            with runner.tagged():
                assert spark.range(3).count() == 3  # the first job, done
                between.set()
                killed.wait(30)                    # the kill lands here, no job active
                _slow_write(spark)
            outcome["finished"] = True
        except Exception as exc:
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - began

    worker = threading.Thread(target=job)
    op._runner_in_use = runner
    worker.start()
    assert between.wait(60)
    op.on_kill()
    killed.set()
    worker.join(60)
    assert not worker.is_alive()
    assert "finished" not in outcome, "the next job ran to its end: on_kill did not cancel it"
    assert "cancel" in str(outcome["error"]).lower() or "interrupt" in str(outcome["error"]).lower()
    assert spark.range(3).count() == 3  # the session is still usable


def test_on_kill_without_work_in_progress_is_a_no_op() -> None:
    StreamBatchOperator(task_id="read", pipeline="p", stream="s").on_kill()


@pytest.mark.rabbitmq
def test_on_kill_kills_spark_submit(rabbitmq_url: str, stream_name: Any, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_H14", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    stream = stream_name("h14-submit")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [b"{}"] * 10)
    runner = SparkSubmitRunner("spark_h14", name="streamledger-h14-kill")
    op = StreamBatchOperator(task_id="read", pipeline="h14-kill", stream=stream, spark_conn_id="spark_h14")
    outcome: dict[str, Any] = {}

    def submit() -> None:
        began = time.monotonic()
        try:
            runner(url=rabbitmq_url, ranges={stream: (0, 10)}, output=str(tmp_path / "out"), fmt="parquet",
                   splits=1)
            outcome["finished"] = True
        except Exception as exc:
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - began

    worker = threading.Thread(target=submit)
    op._runner_in_use = runner
    worker.start()
    _wait(lambda: runner._hook is not None and runner._hook._submit_sp is not None, 60,
          "spark-submit to start")
    process = runner._hook._submit_sp
    time.sleep(1.0)
    op.on_kill()
    worker.join(60)
    assert not worker.is_alive()
    assert "finished" not in outcome and outcome["error"] is not None
    assert process.poll() is not None, "spark-submit is still running"
    assert not (tmp_path / "out" / "_manifest.json").exists()
