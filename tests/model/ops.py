"""The operations of a scenario: typed records, replayable as a JSON list (the minimal reproduction)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

#: Where a batch can be stopped dead (the batch's ``on_step`` names), ``None`` for no kill.
KILL_STEPS = ("planned", "claimed", "probed", "job", "read", "committed", "table_committed", "published",
              "stored")
#: How a batch dies: ``kill`` a BaseException nothing in the batch catches (SIGKILL as far as it can
#: tell), ``fail`` an ordinary exception (the batch's own failure handling runs), ``sigkill`` a real
#: SIGKILL of a subprocess running the batch, ``delay`` seconds after it started.
KillKind = Literal["kill", "fail", "sigkill"]
#: The transforms a pipeline may carry (see :attr:`PipelineSpec.transform`).
TRANSFORMS = ("filter", "explode", "aggregate")
#: Spellings of the default virtual host in the broker URL (one vhost, three ways to write it).
SPELLINGS = ("/", "/%2F", "/%2f")


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline of the scenario. Each has its own output root, so every file under it is its own."""

    name: str
    sink: Literal["directory", "iceberg", "delta"] = "directory"
    pinned: bool = False
    on_data_loss: Literal["fail", "record"] = "record"
    max_offsets: int | None = None
    #: where a pipeline without history starts: ``first`` (what the stream still holds at its first
    #: run) or, pinned only, ``interval_start`` (its history begins at the origin, the DAG's start)
    initial_position: Literal["first", "interval_start"] = "first"
    #: the user's SQL between the read and the sink (issue 42), per range: ``filter`` keeps the records
    #: whose id's sequence number is not a multiple of 3, ``explode`` writes 1-3 rows per record,
    #: ``aggregate`` one row per bucket of ids (count, the ids, the first offset); None lands raw records
    transform: Literal["filter", "explode", "aggregate"] | None = None


@dataclass(frozen=True)
class Publish:
    """Publish ``n`` records, each body ``<id>|<pad bytes>``; ``pad`` fills retention segments."""

    n: int
    pad: int = 0
    kind: str = "publish"


@dataclass(frozen=True)
class Tick:
    """Close the current data interval: the next boundary is now (pinned pipelines' schedule)."""

    kind: str = "tick"


@dataclass(frozen=True)
class Batch:
    """One attempt of a run: ``run`` names the run identity (``iv<i>`` for pinned interval ``i``),
    ``attempt`` its try number; killed after ``kill_at`` if given."""

    pipe: int
    run: str
    attempt: int = 1
    kill_at: str | None = None
    how: KillKind = "kill"
    delay: float = 0.0
    store_offset: bool = True
    spelling: str = "/"
    interval: int | None = None
    kind: str = "batch"


@dataclass(frozen=True)
class Pair:
    """Two batches at once (threads of one process, one Spark session)."""

    a: Batch
    b: Batch
    kind: str = "pair"


@dataclass(frozen=True)
class Recreate:
    """Delete the stream and create it again (same retention settings): offsets restart at 0."""

    kind: str = "recreate"


@dataclass(frozen=True)
class NewEpoch:
    """``ledger new-epoch`` for the pipeline's source on the stream (what the batch's refusal asks)."""

    pipe: int
    kind: str = "new_epoch"


#: The operator's cures the checker tries, wrong requests among them (issue 43): a skip reaching past
#: the broker's committed tail, a skip over committed offsets, ``new-epoch`` (refused unless the stream
#: was re-created since the history began), and ``distinct-brokers`` / ``rename-broker`` naming one
#: broker in two spellings. A wrong request the product accepts is a disagreement.
CURES = ("skip_past_tail", "skip_overlap", "new_epoch_cli", "distinct_spellings", "rename_spellings")


@dataclass(frozen=True)
class Cure:
    """One of :data:`CURES` for the pipeline, through the CLI (``--broker-url`` the world's broker,
    the broker named in ``spelling``); ``extra`` offsets past the tail for ``skip_past_tail``."""

    pipe: int
    what: str
    spelling: str = "/"
    extra: int = 1
    kind: str = "cure"


@dataclass(frozen=True)
class ReleaseStale:
    """``ledger release-stale --older-than 0``: every open claim is failed."""

    kind: str = "release_stale"


@dataclass(frozen=True)
class AuditCli:
    """``streamledger ledger audit --broker-url <spelling>``: its verdict is judged like the API's."""

    pipe: int
    spelling: str = "/"
    kind: str = "audit_cli"


@dataclass(frozen=True)
class Stream:
    """A ledger-recorded Structured Streaming query of the pipeline, run to an available-now trigger:
    its rows written per micro-batch (``foreachBatch``, idempotent by batch id:
    :mod:`tests.model.streaming`) under the pipeline's output root, its ranges recorded in the
    pipeline's ledger history between its batches.
    ``checkpoint``: a ``new`` query (it starts where the ledger ends, or at the first offset of a
    pipeline without history) or the pipeline's last query restarted from its checkpoint
    (``reuse``). ``fail_at``: the query dies before writing its micro-batch number ``fail_at`` (its
    claims stay open, its rows unwritten). ``kill_at``: the query runs in a child process SIGKILLed
    (with its Spark) at its micro-batch number ``kill_at``, before or after the micro-batch's rows
    are written (``kill_when``; planned and claimed, never committed), then is restarted from its
    checkpoint. Any pipeline: a pinned one's too, and its rows go to a sink of the pipeline's kind."""

    pipe: int
    max_offsets: int | None = None
    checkpoint: Literal["new", "reuse"] = "new"
    fail_at: int | None = None
    fail_on_data_loss: bool = True
    spelling: str = "/"
    kill_at: int | None = None
    kill_when: Literal["before_write", "after_write"] = "after_write"
    kind: str = "stream"


Op = Publish | Tick | Batch | Pair | Recreate | NewEpoch | ReleaseStale | AuditCli | Stream | Cure

_KINDS: dict[str, type[Any]] = {"publish": Publish, "tick": Tick, "batch": Batch, "pair": Pair,
                                "recreate": Recreate, "new_epoch": NewEpoch, "release_stale": ReleaseStale,
                                "audit_cli": AuditCli, "stream": Stream, "cure": Cure}


@dataclass(frozen=True)
class Scenario:
    """Everything a replay needs: the pipelines and the operations, in order."""

    pipelines: tuple[PipelineSpec, ...]
    ops: tuple[Op, ...]
    retention: bool = True
    seed: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def with_ops(self, ops: list[Op] | tuple[Op, ...]) -> Scenario:
        return Scenario(self.pipelines, tuple(ops), self.retention, self.seed, self.notes)

    def to_json(self) -> str:
        return json.dumps({"seed": self.seed, "retention": self.retention,
                           "pipelines": [asdict(p) for p in self.pipelines],
                           "ops": [asdict(o) for o in self.ops]}, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Scenario:
        data = json.loads(text)
        return Scenario(tuple(PipelineSpec(**p) for p in data["pipelines"]),
                        tuple(op_from_dict(o) for o in data["ops"]), data.get("retention", True),
                        data.get("seed"))


def op_from_dict(data: dict[str, Any]) -> Op:
    kind = data["kind"]
    if kind == "pair":
        return Pair(Batch(**data["a"]), Batch(**data["b"]))
    op: Op = _KINDS[kind](**data)
    return op


def describe(op: Op) -> str:
    """One short line per operation for the progress log and the reproduction."""
    if isinstance(op, Publish):
        return f"publish {op.n}" + (f" pad {op.pad}" if op.pad else "")
    if isinstance(op, Batch):
        kill = f" {op.how}@{op.kill_at}" if op.kill_at else ""
        if op.how == "sigkill" and not op.kill_at:
            kill = f" sigkill+{op.delay:.1f}s"
        store = "" if op.store_offset else " no-store"
        return f"batch p{op.pipe} {op.run}.t{op.attempt}{kill}{store} url{op.spelling}"
    if isinstance(op, Pair):
        return f"pair [{describe(op.a)}] || [{describe(op.b)}]"
    if isinstance(op, NewEpoch):
        return f"new-epoch p{op.pipe}"
    if isinstance(op, AuditCli):
        return f"audit-cli p{op.pipe} url{op.spelling}"
    if isinstance(op, Cure):
        return f"cure {op.what.replace('_', '-')} p{op.pipe} broker{op.spelling}" + (
            f" +{op.extra}" if op.what == "skip_past_tail" else "")
    if isinstance(op, Stream):
        limit = f" max{op.max_offsets}" if op.max_offsets else ""
        fail = f" fail@{op.fail_at}" if op.fail_at is not None else ""
        loss = "" if op.fail_on_data_loss else " no-fail-on-loss"
        kill = f" sigkill@{op.kill_at}:{op.kill_when}" if op.kill_at is not None else ""
        return f"stream p{op.pipe} {op.checkpoint}{limit}{fail}{kill}{loss} url{op.spelling}"
    return op.kind.replace("_", "-")
