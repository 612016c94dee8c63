"""``python -m tests.model [--seed N] [--seeds K] [--ops N] [--ledger sqlite|postgresql]``: the model
checker's soak (``make soak``). Seeds ``seed .. seed+K-1`` are drawn and run; the first disagreement
of each seed is shrunk to a minimal operation list and printed as a replayable JSON scenario
(``--replay JSON``). Exit 1 when any seed disagrees."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.model.generator import Options, draw
from tests.model.ops import SPELLINGS, Scenario
from tests.model.runner import Disagreement, report, reproduction, run_scenario, shrink
from tests.model.world import Servers


def servers(ledger: str) -> tuple[Servers, Callable[[], None]]:
    """The local 4.3 broker, PostgreSQL (for ``postgresql``) and a local Spark session, as the suite's
    fixtures start them; returns them and a clean-up of what this process made."""
    from tests.support.rabbitmq import ensure_broker
    from tests.support.spark import SHORT_JVM_ENV, local_session

    for key, value in SHORT_JVM_ENV.items():
        os.environ.setdefault(key, value)
    url = ensure_broker("4.3").url
    made: list[str] = []
    if ledger == "postgresql":
        from tests.support.postgres import create_database, drop_database, start_server

        admin = start_server()

        def make(_where: Path) -> str:
            name = f"sl_model_{uuid.uuid4().hex[:12]}"
            made.append(name)
            return create_database(admin, name)

        def cleanup() -> None:
            for name in made:
                drop_database(admin, name)
    else:
        def make(_where: Path) -> str:
            return f"sqlite:///{_where / 'ledger.sqlite'}"

        def cleanup() -> None:
            return None

    spark = local_session()

    def stop() -> None:
        cleanup()
        spark.stop()

    return Servers(url, spark, make, ledger), stop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1, help="how many consecutive seeds")
    p.add_argument("--ops", type=int, default=40, help="operations per seed (before the final drain)")
    p.add_argument("--ledger", choices=("sqlite", "postgresql"), default="sqlite")
    p.add_argument("--no-sigkill", action="store_true", help="no subprocess batches (no extra JVMs)")
    p.add_argument("--no-hostile", action="store_true", help="ordinary pipeline names only")
    p.add_argument("--no-streaming", action="store_true", help="no streaming queries (the draws before them)")
    p.add_argument("--no-cures", action="store_true",
                   help="leave out the operator's cures as operations (skip, new-epoch, distinct-brokers, "
                   "rename-broker, wrong requests among them)")
    p.add_argument("--no-compose", action="store_true",
                   help="streaming queries only on directory pipelines not pinned, never SIGKILLed")
    p.add_argument("--no-transforms", action="store_true",
                   help="no pipeline carries a transform (filter / explode / aggregate)")
    p.add_argument("--one-spelling", action="store_true", help="the broker URL always ends in /")
    p.add_argument("--shrink-budget", type=float, default=600.0, metavar="S", help="seconds per shrink")
    p.add_argument("--shrink-all", action="store_true", help="shrink every distinct disagreement")
    p.add_argument("--replay", action="append", default=[], metavar="JSON",
                   help="run this scenario (JSON, or @file) instead of drawing; repeatable")
    p.add_argument("--keep", action="store_true", help="keep every scenario's directory")
    a = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="streamledger-model-"))
    srv, stop = servers(a.ledger)
    bad = 0
    totals = {"ops": 0, "transformed": 0, "predicted": 0,
              "streams": 0, "kills": 0, "sigkills": 0, "injected": 0, "records": 0, "checked": 0,
              "disagreements": 0}
    started = time.monotonic()
    try:
        opts = Options(ops=a.ops, sigkill=not a.no_sigkill, hostile=not a.no_hostile,
                       streaming=not a.no_streaming, compose=not a.no_compose, cures=not a.no_cures,
                       transforms=0 if a.no_transforms else 2,
                       spellings=("/",) if a.one_spelling else SPELLINGS)
        given = [Path(r[1:]).read_text() if r.startswith("@") else r for r in a.replay]
        todo = [(f"replay{n}", Scenario.from_json(r)) for n, r in enumerate(given)] or [
            (str(seed), draw(seed, opts)) for seed in range(a.seed, a.seed + a.seeds)]
        for seed, scenario in todo:
            print(f"== {seed} on {a.ledger}: {len(scenario.ops)} op(s)", flush=True)
            out = run_scenario(srv, scenario, base / f"seed-{seed}", log=lambda m: print(m, flush=True),
                               keep=a.keep, stop_at_first=not a.replay)  # a replay shows every one
            print(report(out), flush=True)
            if out.disagreements:
                bad += 1
            distinct: list[Disagreement] = []
            for d in out.disagreements:
                if not any(d.same(x) for x in distinct):
                    distinct.append(d)
            for d in distinct[: None if a.shrink_all else 1]:
                if a.shrink_budget <= 0:
                    break
                print(f"== shrinking: {d.line()} (budget {a.shrink_budget:.0f} s)", flush=True)
                minimal, tries = shrink(srv, scenario, d, base, budget_s=a.shrink_budget,
                                        log=lambda m: print(m, flush=True))
                print(f"   {tries} replay(s)\n  DISAGREEMENT {d.line()}\n{reproduction(minimal)}", flush=True)
            totals["ops"] += out.figures.ops
            totals["streams"] += out.figures.streams
            totals["transformed"] += out.figures.transformed
            totals["predicted"] += out.figures.ranges_predicted
            totals["kills"] += out.figures.kills
            totals["sigkills"] += out.figures.sigkills
            totals["injected"] += out.figures.injected
            totals["checked"] += out.figures.records_checked
            totals["records"] += out.figures.published
            totals["disagreements"] += len(out.disagreements)
    finally:
        stop()
        if not a.keep and not bad:
            shutil.rmtree(base, ignore_errors=True)
    kept = f"; scenario directories kept under {base}" if bad else ""
    print(f"== total on {a.ledger}: {totals['ops']} op(s) ({totals['streams']} streaming quer(ies)), "
          f"{totals['transformed']} batch(es) with a transform ({totals['predicted']} range output(s) "
          f"predicted), {totals['kills']} kill(s) "
          f"({totals['kills'] - totals['sigkills']} at a step, {totals['sigkills']} SIGKILL) and "
          f"{totals['injected']} failure(s) injected at a step, {totals['records']} record(s) published, "
          f"{totals['checked']} record check(s), {totals['disagreements']} disagreement(s) in {bad} seed(s), "
          f"{time.monotonic() - started:.0f} s{kept}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
