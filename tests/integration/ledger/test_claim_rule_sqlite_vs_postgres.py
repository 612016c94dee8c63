"""The claim rule is written twice: in Python for SQLite (``Claims._claim_sqlite``) and as the PostgreSQL
function ``streamledger_claim`` (``src/streamledger/migrations/sql/streamledger_claim/``, newest file),
called once per source by ``streamledger_claim_many``. This is the guard that the two are one rule:
hypothesis generates histories (claims at the tail with limits and caps, pinned claims, probed
record-free spans, batches over two sources, retries with higher and lower tries, commits, failures,
releases, losses recorded at the tail), each step runs on a SQLite ledger and a PostgreSQL ledger
side by side, and every answer (span, status, stored or not, try, pinned, refused or not) and then
every row of both ledgers and ``last_try`` of every run key must agree.

A change to either side that the other does not make fails here (rerun longer with
``STREAMLEDGER_LEDGER_EXAMPLES=500``). src/streamledger/migrations/NOTES.md points here.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from streamledger.ledger import ClaimRequest, Ledger, LedgerError, OffsetRange, RangeStatus, SourceRef
from tests.support.ledgers import sqlite_ledger_url
from tests.unit.ledger.util import BROKER, run

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]

SOURCES = (SourceRef(BROKER, "events-0", "events"), SourceRef(BROKER, "events-1", "events"))
INITIAL = 5
KEYS = st.integers(0, 3)
DAY = datetime(2026, 11, 1, tzinfo=UTC)
_PIPELINES = itertools.count()


def _answer(r: OffsetRange) -> tuple[Any, ...]:
    """What a claim answered, ids aside (they are compared through the id map)."""
    return (r.source.stream, r.start, r.end, r.status.value, r.recorded, r.run.run_id, r.run.try_number,
            r.records, r.interval is not None)


def _row(r: OffsetRange) -> tuple[Any, ...]:
    return (r.source.stream, r.start, r.end, r.status.value, r.run.run_id, r.run.try_number, r.records,
            r.first_seen, r.last_seen, r.output, r.interval)


class BothLedgers(RuleBasedStateMachine):
    """One pipeline on each ledger, driven by the same steps; the answers must agree."""

    lite: Ledger
    pg: Ledger

    def __init__(self) -> None:
        super().__init__()
        self.pipeline = f"twin-{next(_PIPELINES)}-{uuid.uuid4().hex[:6]}"
        self.ids: dict[int, int] = {}  # SQLite range id -> PostgreSQL range id
        self.tries: dict[int, int] = {}
        self.keys: set[int] = set()

    # -- running one step on both ---------------------------------------------------------------

    def both(self, what: str, step: Callable[[Ledger], Any]) -> tuple[Any, Any]:
        """``step`` on each ledger: both answer, or both refuse (LedgerError)."""
        got = []
        for ledger in (self.lite, self.pg):
            try:
                got.append(("ok", step(ledger)))
            except LedgerError as e:
                got.append(("refused", str(e)))
        (lk, lv), (pk, pv) = got
        note(f"{what}: sqlite {lk} {lv if lk == 'refused' else ''} / postgresql {pk} "
             f"{pv if pk == 'refused' else ''}")
        assert lk == pk, (what, lv, pv)
        return (lv, pv) if lk == "ok" else (None, None)

    def same_range(self, lite: OffsetRange, pg: OffsetRange) -> None:
        assert _answer(lite) == _answer(pg), (_answer(lite), _answer(pg))
        if lite.recorded:
            assert self.ids.setdefault(lite.id, pg.id) == pg.id, "a claim answered another range"

    def claimed(self) -> list[OffsetRange]:
        return sorted((r for r in self.lite.ranges(self.pipeline) if r.status == RangeStatus.CLAIMED),
                      key=lambda r: (r.source.stream, r.start, r.id))

    def held(self) -> list[OffsetRange]:
        return sorted((r for r in self.lite.ranges(self.pipeline)
                       if r.status in (RangeStatus.CLAIMED, RangeStatus.COMMITTED)
                       and r.run.run_id.startswith("run-")),
                      key=lambda r: (r.source.stream, r.start, r.id))

    # -- steps ------------------------------------------------------------------------------------

    @rule(key=KEYS, source=st.sampled_from(SOURCES), grow=st.integers(-3, 30),
          max_span=st.none() | st.integers(1, 12), retry=st.sampled_from([0, 0, 1, -1]),
          free=st.none() | st.tuples(st.integers(0, 40), st.integers(0, 40)))
    def claim(self, key: int, source: SourceRef, grow: int, max_span: int | None, retry: int,
              free: tuple[int, int] | None) -> None:
        """A claim at the tail (rule 1, 2 or 3), maybe capped, maybe a later or an earlier try (a
        zombie), maybe naming offsets probed to hold no user record."""
        self.tries[key] = max(1, self.tries.get(key, 1) + retry)
        who = run(key, self.tries[key])
        self.keys.add(key)
        tails = [r.end for r in self.lite.ranges(self.pipeline, stream=source.stream)
                 if r.status != RangeStatus.FAILED]
        end_limit = max(0, max(tails, default=INITIAL) + grow)
        record_free = (min(free), max(free)) if free else None
        lite, pg = self.both(f"claim {key} {source.stream} to {end_limit} span {max_span} free {record_free}",
                             lambda led: led.claim(self.pipeline, source, end_limit, who,
                                                   initial_start=INITIAL, max_span=max_span,
                                                   record_free=record_free))
        if lite is not None:
            self.same_range(lite, pg)

    @rule(key=KEYS, source=st.sampled_from(SOURCES), start=st.integers(0, 40), size=st.integers(0, 10),
          hour=st.integers(0, 23))
    def claim_pinned(self, key: int, source: SourceRef, start: int, size: int, hour: int) -> None:
        """A pinned claim of an exact span (a data interval's offsets), refused or taken alike."""
        self.keys.add(key)
        who = run(key, self.tries.get(key, 1))
        interval = (DAY + timedelta(hours=hour), DAY + timedelta(hours=hour + 1))
        lite, pg = self.both(f"pinned claim {key} {source.stream} [{start}, {start + size})",
                             lambda led: led.claim(self.pipeline, source, 0, who, initial_start=INITIAL,
                                                   span=(start, start + size), interval=interval))
        if lite is not None:
            self.same_range(lite, pg)

    @rule(key=KEYS, grows=st.tuples(st.integers(-3, 30), st.integers(-3, 30)),
          max_span=st.none() | st.integers(1, 12))
    def claim_many(self, key: int, grows: tuple[int, int], max_span: int | None) -> None:
        """A batch's claims over both sources in one call (PostgreSQL: ``streamledger_claim_many``)."""
        self.keys.add(key)
        who = run(key, self.tries.get(key, 1))
        requests = []
        for source, grow in zip(SOURCES, grows, strict=True):
            tails = [r.end for r in self.lite.ranges(self.pipeline, stream=source.stream)
                     if r.status != RangeStatus.FAILED]
            requests.append(ClaimRequest(source, max(0, max(tails, default=INITIAL) + grow), INITIAL))
        lite, pg = self.both(f"claim_many {key} {[r.end_limit for r in requests]} span {max_span}",
                             lambda led: led.claim_many(self.pipeline, requests, who, max_span=max_span))
        if lite is not None:
            assert len(lite) == len(pg)
            for a, b in zip(lite, pg, strict=True):
                self.same_range(a, b)

    @precondition(lambda self: bool(self.held()))
    @rule(data=st.data(), step=st.sampled_from([1, 1, 0, -1]), grow=st.integers(-3, 30))
    def retry(self, data: st.DataObject, step: int, grow: int) -> None:
        """A run key that holds a range (claimed or committed) claims its source again: a later try
        (a retry after a crash or after its commit), the same one, or an earlier one (a zombie)."""
        r = data.draw(st.sampled_from(self.held()))
        key = int(r.run.run_id.removeprefix("run-"))
        self.tries[key] = max(1, max(self.tries.get(key, 1), r.run.try_number) + step)
        who = run(key, self.tries[key])
        lite, pg = self.both(f"retry {key} try {who.try_number} of [{r.start}, {r.end}) {r.status.value}",
                             lambda led: led.claim(self.pipeline, r.source, r.end + grow, who))
        if lite is not None:
            self.same_range(lite, pg)

    @precondition(lambda self: bool(self.claimed()))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(self.claimed()))
        records = data.draw(st.integers(0, r.end - r.start))
        first = r.start if records else None
        last = r.start + records - 1 if records else None
        lite, pg = self.both(f"commit [{r.start}, {r.end}) {records}", lambda led: led.commit(
            r.id if led is self.lite else self.ids[r.id], records=records, first_seen=first, last_seen=last,
            output=f"out/{r.start}"))
        if lite is not None:
            self.same_range(lite, pg)

    @precondition(lambda self: bool(self.claimed()))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(self.claimed()))
        self.both(f"fail [{r.start}, {r.end})",
                  lambda led: led.fail(r.id if led is self.lite else self.ids[r.id], "injected"))

    @rule()
    def release_stale(self) -> None:
        lite, pg = self.both("release_stale", lambda led: led.release_stale(timedelta(0),
                                                                            pipeline=self.pipeline))
        assert sorted(repr(_row(r)) for r in lite) == sorted(repr(_row(r)) for r in pg)

    @rule(key=KEYS, source=st.sampled_from(SOURCES), size=st.integers(1, 20))
    def lost_at_tail(self, key: int, source: SourceRef, size: int) -> None:
        live = [r for r in self.lite.ranges(self.pipeline, stream=source.stream)
                if r.status != RangeStatus.FAILED]
        start = max((r.end for r in live), default=INITIAL)
        lite, pg = self.both(f"lost {source.stream} [{start}, {start + size})", lambda led: led.record_lost(
            self.pipeline, source, start, start + size, run(key), "retention"))
        if lite is not None:
            self.same_range(lite, pg)

    # -- after every step ------------------------------------------------------------------------

    @invariant()
    def every_row_and_try_agree(self) -> None:
        lite = sorted(self.lite.ranges(self.pipeline), key=lambda r: repr(_row(r)))
        pg = sorted(self.pg.ranges(self.pipeline), key=lambda r: repr(_row(r)))
        assert [_row(r) for r in lite] == [_row(r) for r in pg]
        for a, b in zip(lite, pg, strict=True):  # rows made inside a step (a loss's remainder) too
            assert self.ids.setdefault(a.id, b.id) == b.id
        for key in self.keys:
            assert self.lite.last_try(self.pipeline, run(key)) == self.pg.last_try(self.pipeline, run(key))


EXAMPLES_VARIABLE = "STREAMLEDGER_LEDGER_EXAMPLES"


@pytest.fixture
def twin_ledgers(tmp_path: Path, sqlite_ledger_template: Path, postgres_ledger_url: str) -> Iterator[None]:
    with Ledger(sqlite_ledger_url(sqlite_ledger_template, tmp_path / "ledger.sqlite")) as lite, \
            Ledger(postgres_ledger_url) as pg:
        assert (lite.dialect, pg.dialect) == ("sqlite", "postgresql")
        BothLedgers.lite, BothLedgers.pg = lite, pg
        yield


@pytest.mark.usefixtures("twin_ledgers")
def test_sqlite_claim_rule_and_postgresql_function_give_every_answer_alike() -> None:
    run_state_machine_as_test(
        BothLedgers,
        settings=settings(
            max_examples=int(os.environ.get(EXAMPLES_VARIABLE) or 30),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
