"""The example DAGs under ``airflow dags test``: real broker, SQLite ledger, Spark in the task process
(the killed runs) or on the session's Spark Connect server (the interval test, the retries).

What is proven here (see ``streamledger.batch`` for the semantics):

* a backfill over several data intervals reads each interval's records exactly once, into one
  directory per partition range, with contiguous committed ranges and the broker offset stored;
* re-running a DAG run re-reads the same range into the same directory (no new ranges, no
  duplicates);
* killing the task (local Spark in its process) between the Spark write and the ledger commit, or
  between the ledger commit and the broker StoreOffset, followed by a retry (on the Connect server),
  ends with every offset exactly once and a clean audit.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Scenario, warm_spark_env

pytestmark = [pytest.mark.airflow, pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.slow]

BACKFILL = "streamledger_backfill"


def _committed(scenario: Scenario) -> list:  # type: ignore[type-arg]
    return sorted(
        (r for r in scenario.ledger().ranges(scenario.pipeline)
         if str(r.status) == "committed" and not r.empty),
        key=lambda r: (r.source.stream, r.start),
    )


def _audit(scenario: Scenario):  # type: ignore[no-untyped-def]
    from streamledger.protocol.rabbitmq import StreamClient

    with StreamClient.connect(scenario.url) as client:
        return scenario.ledger().audit(scenario.pipeline, broker=client)


def _stored_offsets(scenario: Scenario) -> dict[str, int | None]:
    from streamledger.protocol.rabbitmq import StreamClient

    with StreamClient.connect(scenario.url) as client:
        streams = client.partitions(scenario.super_stream)
        return {s: client.query_offset(s, scenario.pipeline) for s in streams}


def _manifest(directory: Path) -> dict:  # type: ignore[type-arg]
    data: dict = json.loads((directory / "_manifest.json").read_text())  # type: ignore[type-arg]
    return data


@pytest.mark.timeout(2400)
@pytest.mark.warm_spark
def test_backfill_intervals_then_rerun(scenario: Scenario) -> None:
    scenario.dags_test("streamledger_create_super_stream", scenario_start := _now())
    del scenario_start
    ends = scenario.publish_waves(waves=3, per_wave=40)
    for end in ends:
        scenario.dags_test(BACKFILL, end)

    committed = _committed(scenario)
    by_stream: dict[str, list] = {}  # type: ignore[type-arg]
    for r in committed:
        by_stream.setdefault(r.source.stream, []).append(r)
    assert len(by_stream) == scenario.partitions
    for stream, ranges in by_stream.items():
        assert len(ranges) == 3, f"{stream}: {[(r.start, r.end) for r in ranges]}"
        for a, b in itertools.pairwise(ranges):
            assert a.end == b.start, f"{stream}: gap/overlap {a.start}-{a.end} then {b.start}-{b.end}"
        # Each range holds exactly the wave published inside its data interval.
        for wave, r in enumerate(ranges):
            ids = {i for s, o, i in scenario.output_rows() if s == stream and r.start <= o < r.end}
            assert ids and all(scenario.published[i] == wave for i in ids), (stream, wave, sorted(ids)[:5])
            assert r.records == len(ids)
    scenario.assert_exactly_once(set(scenario.published))
    stored = _stored_offsets(scenario)
    # The broker stores the last committed record (the watermark), never more.
    assert stored == {s: rs[-1].last_seen for s, rs in by_stream.items()}

    # Re-run the middle interval (``dags test`` makes a new run): nothing is read again, no published
    # directory is rewritten, still exactly once.
    middle = {s: rs[1] for s, rs in by_stream.items()}
    before = {s: _manifest(Path(r.output))["written_at"] for s, r in middle.items()}
    scenario.dags_test(BACKFILL, ends[1])
    after_ranges = _committed(scenario)
    assert [(r.source.stream, r.start, r.end, r.records) for r in after_ranges] == [
        (r.source.stream, r.start, r.end, r.records) for r in committed
    ]
    for s, r in middle.items():
        manifest = _manifest(Path(r.output))
        assert manifest["streams"][s]["start"] == r.start and manifest["streams"][s]["end"] == r.end
        assert manifest["written_at"] == before[s]
    scenario.assert_exactly_once(set(scenario.published))
    assert _stored_offsets(scenario) == stored, "re-running an old interval must not move the broker offset"

    # every run ended with the DAG's audit task; the ledger and the broker agree now too
    states = scenario.af.task_states(BACKFILL, ends[1].isoformat())
    assert states["audit"]["state"] == "success" and states["read_interval"]["state"] == "success"
    assert _audit(scenario).clean
    print("dags test timings (s):", [(d, round(t, 1)) for d, t in scenario.af.timings])


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("scenario", [1], indirect=True)
# The suite kills at the later step (the read's output committed and published, the offset not yet
# stored); the kill right after the read is the same retry path earlier, a cell of `make test-matrix`
# (and the batch-level crash table in tests/integration/batch covers every step).
@pytest.mark.parametrize("step", [pytest.param("read", marks=pytest.mark.matrix), "published"])
def test_kill_then_retry_is_exactly_once(scenario: Scenario, step: str, spark_connect: str) -> None:
    scenario.create_super_stream()
    (end,) = scenario.publish_waves(waves=1, per_wave=50)

    proc = scenario.af.dags_test(
        BACKFILL, end.isoformat(), env={**scenario.env, "STREAMLEDGER_TEST_KILL_AFTER": step}, check=False
    )
    assert proc.returncode == 137, proc.stdout[-3000:]
    (stream,) = _stored_offsets(scenario)
    ranges = scenario.ledger().ranges(scenario.pipeline)
    assert len(ranges) == 1
    (killed,) = ranges
    assert str(killed.status) == ("claimed" if step == "read" else "committed")
    assert _stored_offsets(scenario) == {stream: None}, "the kill happened before StoreOffset"
    if step == "published":
        assert not _audit(scenario).clean, "the audit must see the broker behind the ledger"
        # ... and so does the example audit DAG, which fails on it
        proc = scenario.af.dags_test("streamledger_audit", _now().isoformat(), env=scenario.env, check=False)
        assert proc.returncode != 0
        assert "ledger audit found" in proc.stdout, proc.stdout[-3000:]

    # The scheduler would fail the dead task; `dags test` has none, so do that step here.
    assert scenario.af.fail_running_tasks(BACKFILL) == 1
    # The kill hit a task with its own local Spark (the point); the retry may run anywhere, so it runs
    # on the session's warm Connect server instead of starting a second JVM.
    scenario.dags_test(BACKFILL, end, extra=warm_spark_env(spark_connect))

    ranges = scenario.ledger().ranges(scenario.pipeline)
    (final,) = [r for r in ranges if str(r.status) != "failed" and not r.empty]
    history = [r for r in ranges if str(r.status) == "failed"]
    if step == "read":
        # the dead run's claim was released (kept as failed history), the new run redid the same span
        assert [(r.start, r.end) for r in history] == [(killed.start, killed.end)]
        assert history[0].error and "holder gone" in history[0].error
    else:
        assert history == [], "a committed range is published and stored, never re-claimed"
    assert str(final.status) == "committed"
    assert (final.start, final.end) == (killed.start, killed.end)
    assert final.records == 50
    scenario.assert_exactly_once(set(scenario.published))
    assert _stored_offsets(scenario) == {stream: final.last_seen}
    report = _audit(scenario)
    assert report.clean, report


def _now():  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.now(UTC).replace(microsecond=0)
