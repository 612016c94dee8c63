"""Seeded draws of scenarios: the pipelines, then operations the way users combine them (a shadow
of which runs failed, so retries and clears name real runs; which intervals are closed)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Literal

from tests.model.ops import (
    CURES,
    KILL_STEPS,
    SPELLINGS,
    TRANSFORMS,
    AuditCli,
    Batch,
    Cure,
    NewEpoch,
    Op,
    Pair,
    PipelineSpec,
    Publish,
    Recreate,
    ReleaseStale,
    Scenario,
    Stream,
    Tick,
)

#: Pipeline names a user might pick; the hostile ones are the names of tests/integration/batch's
#: output-name tests (a name that leaves the root, spaces, colons).
NAMES = ("orders", "orders v2", "team:orders", "../../escape")


@dataclass(frozen=True)
class Options:
    """What the generator may draw. ``sigkill``: real SIGKILLs of subprocess batches (a JVM each,
    10-20 s: the soak's, not the short form's). ``hostile``: pipeline names outside [a-z0-9-]."""

    ops: int = 20
    pipelines: int = 2
    sigkill: bool = True
    hostile: bool = True
    recreate: bool = True
    pairs: bool = True
    spellings: tuple[str, ...] = SPELLINGS
    #: ledger-recorded streaming queries (available-now) on the directory-sink pipelines not pinned to
    #: intervals; off, the draws are those of the checker before it had them
    streaming: bool = True
    #: streaming queries composed with the rest: on table-sink pipelines (rows into a Delta or Iceberg
    #: table of the query's), on pinned pipelines, and (with ``sigkill``) SIGKILLed mid-batch, then
    #: restarted from the checkpoint; off, the streaming draws are the ones before them
    compose: bool = True
    #: the operator's cures as operations (:data:`tests.model.ops.CURES`, wrong requests among them);
    #: off, the draws are those of the checker before it had them
    cures: bool = False
    #: pipelines carrying a transform (issue 42: filter, explode or aggregate per range), drawn from a
    #: random source of their own so every other draw of a seed stays what it was without them: 0 none,
    #: 1 one pipeline (which, and its transform, drawn), more: each pipeline draws none or one
    transforms: int = 2


@dataclass
class _Shadow:
    runs: int = 0
    attempts: dict[tuple[int, str], int] = field(default_factory=dict)
    failed: list[tuple[int, str]] = field(default_factory=list)
    closed: int = 0  # intervals closed by ticks
    recreated: bool = False
    queried: set[int] = field(default_factory=set)  # pipelines with a streaming query's checkpoint


def _pipelines(rnd: random.Random, opts: Options) -> tuple[PipelineSpec, ...]:
    out = []
    for k in range(opts.pipelines):
        base = rnd.choice(NAMES if opts.hostile else NAMES[:1])
        sink: Literal["directory", "iceberg", "delta"] = rnd.choice(("directory", "iceberg", "delta"))
        pinned = rnd.random() < 0.35
        loss: Literal["fail", "record"] = rnd.choice(("fail", "record"))
        out.append(PipelineSpec(
            name=f"{base}-{k}", sink=sink, pinned=pinned, on_data_loss=loss,
            max_offsets=None if pinned else rnd.choice((None, 40, 120)),
            # both starts of a pinned history, without a draw (earlier seeds keep their scenarios)
            initial_position="interval_start" if pinned and k % 2 else "first",
        ))
    if opts.streaming and not opts.compose and not any(p.sink == "directory" and not p.pinned for p in out):
        # a streaming query needs one: the first pipeline becomes it (no draw: the rest stays as drawn)
        out[0] = PipelineSpec(name=out[0].name, sink="directory", on_data_loss=out[0].on_data_loss,
                              max_offsets=out[0].max_offsets or 40)
    return tuple(out)


def _batch(rnd: random.Random, sh: _Shadow, pipes: tuple[PipelineSpec, ...], opts: Options,
           *, in_pair: bool = False) -> Batch:
    pipe = rnd.randrange(len(pipes))
    theirs = [f for f in sh.failed if f[0] == pipe]
    if theirs and rnd.random() < 0.5:  # a retry now, or the operator clears it later
        key = rnd.choice(theirs)
        sh.failed.remove(key)
        run = key[1]
    elif pipes[pipe].pinned:
        # out of order as a catching-up scheduler does, the newest interval most often
        run = f"iv{rnd.choice([sh.closed - 1] * 2 + list(range(sh.closed)))}" if sh.closed else "iv0"
    else:
        sh.runs += 1
        run = f"r{sh.runs}"
    attempt = sh.attempts.get((pipe, run), 0) + 1
    sh.attempts[(pipe, run)] = attempt
    kill_at: str | None = None
    how = "kill"
    delay = 0.0
    roll = rnd.random()
    if roll < 0.4:
        kill_at = rnd.choice(KILL_STEPS)
        how = rnd.choice(("kill", "kill", "fail"))
    elif roll < 0.48 and opts.sigkill and not in_pair:
        how, delay = "sigkill", round(rnd.uniform(4.0, 25.0), 1)
    if kill_at or how == "sigkill":
        sh.failed.append((pipe, run))
    interval = int(run[2:]) if run.startswith("iv") else None
    return Batch(pipe=pipe, run=run, attempt=attempt, kill_at=kill_at, how=how, delay=delay,  # type: ignore[arg-type]
                 store_offset=rnd.random() < 0.8, spelling=rnd.choice(opts.spellings), interval=interval)


def _stream(rnd: random.Random, sh: _Shadow, pipes: tuple[PipelineSpec, ...], opts: Options
            ) -> Stream | None:
    able = [k for k, p in enumerate(pipes) if opts.compose or (p.sink == "directory" and not p.pinned)]
    if not able:
        return None
    pipe = rnd.choice(able)
    reuse = pipe in sh.queried and rnd.random() < 0.4
    sh.queried.add(pipe)
    op = Stream(pipe=pipe, max_offsets=rnd.choice((None, None, 30)), checkpoint="reuse" if reuse else "new",
                fail_at=rnd.choice((0, 1)) if rnd.random() < 0.2 else None,
                fail_on_data_loss=rnd.random() < 0.7, spelling=rnd.choice(opts.spellings))
    if opts.compose and opts.sigkill and rnd.random() < 0.3:  # drawn after the rest: earlier draws stay
        op = replace(op, fail_at=None, kill_at=rnd.choice((0, 0, 1)),
                     kill_when=rnd.choice(("before_write", "after_write")))
    return op


def draw(seed: int, opts: Options | None = None) -> Scenario:
    """A scenario of ``opts.ops`` operations, the same for the same seed and options."""
    opts = opts or Options()
    rnd = random.Random(seed)
    pipes = _pipelines(rnd, opts)
    own = random.Random(f"transforms-{seed}")
    if opts.transforms == 1:
        k, chosen = own.randrange(len(pipes)), own.choice(TRANSFORMS)
        pipes = tuple(replace(p, transform=chosen) if n == k else p for n, p in enumerate(pipes))
    elif opts.transforms > 1:
        pipes = tuple(replace(p, transform=own.choice((None, *TRANSFORMS))) for p in pipes)
    sh = _Shadow()
    ops: list[Op] = [Publish(rnd.randint(20, 80))]
    weights = {
        "publish": 14, "tick": 8, "batch": 30, "pair": 6 if opts.pairs else 0, "truncate": 4,
        "recreate": 2 if opts.recreate else 0, "new_epoch": 0, "release": 3, "audit_cli": 3,
        "stream": 8 if opts.streaming else 0,  # last: without it every other draw is as before
        "cure": 4 if opts.cures else 0,  # after it, for the same reason
    }
    while len(ops) < opts.ops:
        if sh.recreated and rnd.random() < 0.5:
            sh.recreated = False
            ops.extend(NewEpoch(k) for k in range(len(pipes)))
            continue
        kind = rnd.choices(list(weights), weights=list(weights.values()))[0]
        if kind == "publish":
            ops.append(Publish(rnd.randint(5, 60)))
        elif kind == "tick":
            ops.append(Tick())
            sh.closed += 1
        elif kind == "batch":
            ops.append(_batch(rnd, sh, pipes, opts))
        elif kind == "pair":
            a = _batch(rnd, sh, pipes, opts, in_pair=True)
            ops.append(Pair(a, _batch(rnd, sh, pipes, opts, in_pair=True)))
        elif kind == "truncate":  # padded records roll segments; retention drops the oldest
            ops.append(Publish(rnd.randint(30, 60), pad=1500))
        elif kind == "recreate":
            ops.append(Recreate())
            sh.recreated = True
        elif kind == "release":
            ops.append(ReleaseStale())
        elif kind == "stream":
            op = _stream(rnd, sh, pipes, opts)
            if op is not None:
                ops.append(op)
        elif kind == "audit_cli":
            ops.append(AuditCli(rnd.randrange(len(pipes)), rnd.choice(opts.spellings)))
        elif kind == "cure":
            ops.append(Cure(rnd.randrange(len(pipes)), rnd.choice(CURES), rnd.choice(opts.spellings),
                            rnd.choice((1, 50, 900))))
    return Scenario(pipes, tuple(ops[:opts.ops]), retention=True, seed=seed)
