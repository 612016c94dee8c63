"""Issue 19 item 6: hosts' clocks disagree, so the ledger keeps time by the database's clock.

A host minutes fast must not take a claim whose holder beat seconds ago; a holder minutes slow
must not look stale to the others; ``release_stale`` and the audit's stuck-claim check measure
against the database too. Each test skews the clock of "this host" (the ``datetime`` the ledger
and the batch modules see) while the real PostgreSQL keeps the true time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import text

import streamledger.batch.steps.state as batch_state
import streamledger.dagster.sensors as sensors
import streamledger.ledger.session as ledger_session
from streamledger.batch import BatchConfig, RunId
from streamledger.batch.run import BatchRun
from streamledger.ledger import Ledger, RangeStatus
from streamledger.ledger.audit import ViolationKind
from tests.unit.airflow.test_batch import URL, BrokerView, Chunk, Runner
from tests.unit.ledger.util import SRC, run

pytestmark = pytest.mark.postgres

TEN_MINUTES = timedelta(minutes=10)
FIVE_MINUTES = timedelta(minutes=5)


@contextlib.contextmanager
def host_clock(skew: timedelta, *modules: ModuleType) -> Iterator[None]:
    """While inside, this host's clock (``datetime`` as the ledger, the batch and ``modules`` see it)
    reads ``skew`` off the true time; the database's stays true."""
    real = datetime

    class Skewed(real):
        @classmethod
        def now(cls, tz: object = None) -> datetime:  # type: ignore[override]
            return real.now(tz) + skew  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        for module in (ledger_session, batch_state, *modules):
            mp.setattr(module, "datetime", Skewed)
        yield


def db_now(ledger: Ledger) -> datetime:
    with ledger.engine.connect() as conn:
        value = conn.execute(text("SELECT now() AT TIME ZONE 'UTC'")).scalar_one()
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC)


def test_a_fast_claimer_does_not_take_a_claim_that_beat_seconds_ago(ledger: Ledger) -> None:
    held = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    assert ledger.heartbeat([held.id], run(1)) == [held.id]
    with host_clock(TEN_MINUTES):
        nxt = ledger.claim("p", SRC, 200, run(2), abandon_after=FIVE_MINUTES)
    assert (nxt.start, nxt.end) == (100, 200), "the fast host took the live claim [0, 100)"
    assert ledger.get(held.id).status == RangeStatus.CLAIMED
    assert ledger.heartbeat([held.id], run(1)) == [held.id]


def test_a_slow_holder_does_not_look_stale(ledger: Ledger) -> None:
    with host_clock(-TEN_MINUTES):
        held = ledger.claim("p", SRC, 100, run(1), initial_start=0)
        assert ledger.heartbeat([held.id], run(1)) == [held.id]
    nxt = ledger.claim("p", SRC, 200, run(2), abandon_after=FIVE_MINUTES)
    assert (nxt.start, nxt.end) == (100, 200), "the slow holder's live claim was abandoned"
    assert ledger.release_stale(FIVE_MINUTES) == []
    assert not ledger.audit(stale_after=FIVE_MINUTES).of_kind(ViolationKind.STUCK_CLAIM)
    assert ledger.get(held.id).status == RangeStatus.CLAIMED


def test_release_stale_and_the_audit_of_a_fast_host_leave_a_beating_claim(ledger: Ledger) -> None:
    held = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    ledger.heartbeat([held.id], run(1))
    with host_clock(TEN_MINUTES):
        stuck = ledger.audit(stale_after=FIVE_MINUTES).of_kind(ViolationKind.STUCK_CLAIM)
        released = ledger.release_stale(FIVE_MINUTES)
    assert ([v.range_id for v in stuck], [r.id for r in released]) == ([], [])
    assert ledger.get(held.id).status == RangeStatus.CLAIMED


def test_a_claim_silent_for_longer_than_the_timeout_is_still_abandoned(ledger: Ledger) -> None:
    """The other side: by the database's clock a silent claim does go stale, whatever the hosts say."""
    held = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    with ledger.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE streamledger_range SET heartbeat_at = (now() AT TIME ZONE 'UTC') - interval '6 min', "
                "claimed_at = (now() AT TIME ZONE 'UTC') - interval '6 min' WHERE id = :id"
            ),
            {"id": held.id},
        )
    with host_clock(-TEN_MINUTES):  # a slow claimer still sees it as abandoned
        audit = ledger.audit(stale_after=FIVE_MINUTES)
        redo = ledger.claim("p", SRC, 200, run(2), abandon_after=FIVE_MINUTES)
    assert [v.range_id for v in audit.of_kind(ViolationKind.STUCK_CLAIM)] == [held.id]
    assert (redo.start, redo.end) == (0, 100)
    assert ledger.get(held.id).status == RangeStatus.FAILED


def test_timestamps_are_stamped_by_the_database(ledger: Ledger) -> None:
    with host_clock(TEN_MINUTES):
        before = db_now(ledger)
        a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
        ledger.heartbeat([a.id], run(1))
        done = ledger.commit(a.id, records=1, first_seen=5, last_seen=5, output=None)
        b = ledger.claim("p", SRC, 200, run(2))
        ledger.fail(b.id, "boom")
        failed = ledger.get(b.id)
        after = db_now(ledger)
    assert done.committed_at is not None and before <= done.committed_at <= after
    assert before <= done.claimed_at <= after
    assert done.heartbeat_at is not None and before <= done.heartbeat_at <= after
    with ledger.engine.connect() as conn:
        updated = conn.execute(
            text("SELECT updated_at FROM streamledger_range WHERE id = :id"), {"id": failed.id}
        ).scalar_one()
    assert before <= updated.replace(tzinfo=UTC) <= after


@pytest.mark.parametrize("skew", [TEN_MINUTES, -TEN_MINUTES])
def test_the_batch_tells_a_held_range_from_a_new_one_whatever_its_clock(
    ledger: Ledger, tmp_path: Path, skew: timedelta
) -> None:
    broker = BrokerView({"s-0": [Chunk(0, list(range(10)), 0)]})
    config = BatchConfig(url=URL, pipeline="p", output_root=str(tmp_path / "out"), stream="s-0")

    def claim(try_number: int) -> str:
        rid = RunId("dag", "run-1", "read", try_number=try_number)
        batch = BatchRun(config, run=rid, ledger=ledger, broker=broker, runner=Runner(broker))
        batch.claim()
        return batch.result.partitions[0].start_from

    with host_clock(skew):
        assert claim(1) == "new"
        assert claim(2) == "held"  # the retry gets its own range back


def test_the_dagster_sensor_of_a_fast_host_sees_a_beating_claim_as_running(ledger: Ledger) -> None:
    held = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    ledger.heartbeat([held.id], run(1))
    broker = BrokerView({SRC.stream: [Chunk(0, list(range(200)), 0)]})
    with host_clock(TEN_MINUTES):  # the sensor has no clock of its own: the ledger judges
        state = sensors.stream_state(broker, ledger, "p", SRC.stream, claim_timeout=300.0,
                                     identity=SRC.broker)
    assert ([r.id for r in state.claimed], [r.id for r in state.gone]) == ([held.id], [])


def test_publish_leases_are_judged_by_the_database_clock(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    before = db_now(ledger)
    with host_clock(-TEN_MINUTES):  # a slow committer holds the lease and renews it
        done = ledger.commit(a.id, records=1, first_seen=5, last_seen=5, output="/out/p/a",
                             staging="/out/p/.staging-a", publisher="attempt-1")
        assert ledger.renew_publish([a.id], "attempt-1") == [a.id]
    with host_clock(TEN_MINUTES):  # a fast run finding the range unpublished
        taken = ledger.take_publish(a.id, "attempt-2", lease=FIVE_MINUTES)
        audit = ledger.audit(stale_after=FIVE_MINUTES)
    assert taken is None, "a fast host took a publish lease renewed seconds ago"
    assert not audit.of_kind(ViolationKind.UNPUBLISHED), audit.to_text()
    with host_clock(-TEN_MINUTES):
        published = ledger.mark_published(a.id, "attempt-1")
    assert done.committed_at is not None and done.committed_at >= before
    assert published.published_at is not None and published.published_at >= before


def test_a_commit_without_staging_is_published_at_the_database_time(ledger: Ledger) -> None:
    a = ledger.claim("p", SRC, 100, run(1), initial_start=0)
    before = db_now(ledger)
    with host_clock(-TEN_MINUTES):
        done = ledger.commit(a.id, records=1, first_seen=5, last_seen=5, output="/out/p/a")
    assert done.published_at is not None and done.published_at >= before
    assert done.publish_beat is None
