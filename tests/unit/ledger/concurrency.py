"""Concurrent claimers in separate processes (used by the SQLite and PostgreSQL tests)."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from streamledger.ledger import Ledger, RunIdentity
from tests.unit.ledger.util import SRC

PIPELINE = "concurrent"


def _worker(url: str, worker: int, claims: int, go: Any, out: Any) -> None:
    ledger = Ledger(url)
    got: list[tuple[int, int, int, str]] = []
    go.wait()
    try:
        for i in range(claims):
            tail = ledger.last_end(PIPELINE, SRC) or 0
            run = RunIdentity("conc", f"w{worker}-{i}", "read", -1, 1)
            r = ledger.claim(PIPELINE, SRC, tail + 1 + (i % 7), run, initial_start=0)
            if not r.empty:
                if i % 5 == 4:
                    ledger.fail(r.id, "injected")
                else:
                    ledger.commit(r.id, records=1, first_seen=r.start, last_seen=r.start, output=None)
            got.append((r.id, r.start, r.end, r.status.value))
        out.put((worker, got, None))
    except Exception as exc:  # reported to the parent, which fails the test
        out.put((worker, got, repr(exc)))
    finally:
        ledger.close()


def run_claimers(url: str, processes: int, claims: int) -> list[tuple[int, int, int, str]]:
    """Start ``processes`` workers that each claim ``claims`` times at once; return every claim."""
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, w, claims, go, out)) for w in range(processes)]
    for p in procs:
        p.start()
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errors = [(w, err) for w, _got, err in results if err]
    assert not errors, errors
    claimed = [c for _w, got, _err in results for c in got]
    assert len(claimed) == processes * claims
    return claimed
