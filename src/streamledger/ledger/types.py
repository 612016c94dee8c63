"""Value types the ledger hands out and accepts.

They are frozen dataclasses, not ORM objects, so callers (Airflow operators, the batch runner, the
CLI) can keep, compare, pickle and serialise them after the ledger's transaction is gone.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from streamledger.offsets import ChunkPrint
from streamledger.paths import name_problem
from streamledger.runs import LEDGER_DAG

MAX_PIPELINE_BYTES = 255
"""The broker's consumer reference (the pipeline name, used for StoreOffset) is a stream-protocol
string of at most 255 *bytes* of UTF-8 (RabbitMQ refuses longer ones at StoreOffset)."""
MAX_PIPELINE_LENGTH = MAX_PIPELINE_BYTES  # kept for callers of 0.1; it counts bytes now


def pipeline_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a pipeline (a broker consumer reference), or None when it can.

    The one place this rule lives: the ledger, the batch configuration and the CLI all ask here,
    so a name that would commit and then fail at StoreOffset forever is refused up front.
    """
    if not isinstance(name, str) or not name:
        return "pipeline name must be a non-empty string (it is the broker's consumer reference)"
    problem = name_problem("pipeline", name)
    if problem is not None:
        return problem
    size = len(name.encode("utf-8"))
    if size > MAX_PIPELINE_BYTES:
        return (
            f"pipeline name {name[:40]!r}... is {size} bytes of UTF-8; the broker's consumer reference "
            f"allows at most {MAX_PIPELINE_BYTES}"
        )
    return None


_RETIRED = re.compile(r"#epoch(\d+)$")


def retired_broker(broker: str, epoch: int) -> str:
    """The broker identity a source's history keeps once its stream was re-created (a new epoch
    began): no broker answers to it, so no claim and no broker check ever reaches it again."""
    return f"{broker}#epoch{epoch}"


def live_broker(broker: str) -> str:
    """The broker a source's identity names, a retired epoch's ``#epoch<N>`` suffix removed (the
    epoch itself is the source's, ``Source.epoch``)."""
    return _RETIRED.sub("", broker)


def is_retired(broker: str) -> bool:
    """Whether a source's broker identity is a retired epoch's (see :func:`retired_broker`)."""
    return _RETIRED.search(broker) is not None


class RangeStatus(enum.StrEnum):
    """Where a range is in its life: ``claimed -> committed | failed``; ``lost`` is recorded directly."""

    CLAIMED = "claimed"
    COMMITTED = "committed"
    FAILED = "failed"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class SourceRef:
    """One readable stream: a broker URL (without credentials), the stream and its super stream, if any."""

    broker: str
    stream: str
    super_stream: str | None = None

    def __post_init__(self) -> None:
        if not self.broker:
            raise ValueError("SourceRef.broker must not be empty")
        if not self.stream:
            raise ValueError("SourceRef.stream must not be empty")


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """Who processes a range: the Airflow task instance, Dagster run or any scheduler's equivalent
    (``streamledger.batch.RunId`` is this same type: one identity from the scheduler to the ledger).

    ``(dag_id, run_id, task_id, map_index)`` is the idempotency key: claiming again with the same key
    returns the same range. ``try_number`` is recorded (the latest attempt) but is not part of the key,
    so a retry of a crashed attempt gets its range back instead of claiming a new one.
    """

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    try_number: int = 1

    def __str__(self) -> str:
        mapped = f"[{self.map_index}]" if self.map_index >= 0 else ""
        return f"{self.dag_id}/{self.run_id}/{self.task_id}{mapped} try {self.try_number}"

    def key(self) -> tuple[str, str, str, int]:
        """The idempotency key: everything but the try."""
        return (self.dag_id, self.run_id, self.task_id, self.map_index)

    def attempt_token(self, nonce: str) -> str:
        """This attempt's name as a publish-lease holder: the identity, the try and a nonce (two
        batches of one try never share a lease)."""
        who = [self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number]
        return f"{json.dumps(who, separators=(',', ':'))}#{nonce}"

    @classmethod
    def from_attempt_token(cls, token: str) -> RunIdentity | None:
        """The identity inside an :meth:`attempt_token`, None when the token is not one."""
        try:
            dag_id, run_id, task_id, map_index, try_number = json.loads(token.rsplit("#", 1)[0])
            return cls(str(dag_id), str(run_id), str(task_id), int(map_index), int(try_number))
        except (ValueError, TypeError):
            return None


SKIP_RUN_DAG = LEDGER_DAG
SKIP_RUN_TASK = "skip"
"""A span recorded as deliberately skipped (``Ledger.record_skipped``) is a ``lost`` range held by
``streamledger/skip-<start>-<end>/skip``: what tells it from retention's losses (audit rule 6)."""


def skip_identity(start: int, end: int) -> RunIdentity:
    """Who holds a skipped span: one identity per span (one live range per identity and source)."""
    return RunIdentity(SKIP_RUN_DAG, f"skip-{start}-{end}", SKIP_RUN_TASK)


UNRECORDED = 0
"""The id of an empty claim answered without a row (:attr:`OffsetRange.recorded`); rows start at 1."""


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """A snapshot of one ledger row: the half-open offset span ``[start, end)`` of one source."""

    id: int
    pipeline: str
    source: SourceRef
    start: int
    end: int
    status: RangeStatus
    run: RunIdentity
    records: int | None
    first_seen: int | None
    last_seen: int | None
    output: str | None
    offset_stored: bool
    offset_verified: bool
    error: str | None
    claimed_at: datetime
    committed_at: datetime | None
    heartbeat_at: datetime | None = None
    staging: str | None = None
    published_at: datetime | None = None
    """When the committed output reached its final place (None: not yet, or nothing to publish)."""
    publisher: str | None = None
    """The attempt holding the publish lease (see ``Ledger.take_publish``)."""
    publish_beat: datetime | None = None
    sink_table: str | None = None
    """The table a table sink published the range into (``iceberg:<ns>.<name>``, ``delta:<uri>``)."""
    sink_commit: int | None = None
    """The commit of ``sink_table`` holding the range: Iceberg snapshot id or Delta version."""
    interval: tuple[datetime, datetime] | None = None
    """A pinned range's data interval ``[start, end)`` (UTC), None for a range claimed at the tail."""
    rows_out: int | None = None
    """With a transform: the rows it wrote for the range (None: a raw range, its rows are its records)."""
    dead_letter: int | None = None
    """With a decoding transform and ``on_bad_record="dead_letter"``: the records set aside."""
    transform: str | None = None
    """The fingerprint of the transform that produced the range's rows (None: raw records)."""

    @property
    def needs_publish(self) -> bool:
        """A committed range with records whose output is not in its final place yet."""
        return self.status == RangeStatus.COMMITTED and bool(self.records) and self.published_at is None

    @property
    def skipped(self) -> bool:
        """True for a span recorded as deliberately skipped (nobody reads it; see :func:`skip_identity`)."""
        return (self.status == RangeStatus.LOST and self.run.dag_id == SKIP_RUN_DAG
                and self.run.task_id == SKIP_RUN_TASK)

    @property
    def empty(self) -> bool:
        """True when the span holds no offsets (``start == end``): nothing to read."""
        return self.start == self.end

    @property
    def recorded(self) -> bool:
        """False for a claim's answer "nothing new" on a source with a history, which is not stored
        (its ``id`` is :data:`UNRECORDED`): an idle batch adds no row per source."""
        return self.id != UNRECORDED

    def describe(self) -> str:
        """A short human label: ``pipeline stream [start, end) status``."""
        return f"{self.pipeline} {self.source.stream} [{self.start}, {self.end}) {self.status.value}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (timestamps in ISO 8601, UTC)."""
        return {
            "id": self.id,
            "pipeline": self.pipeline,
            "broker": self.source.broker,
            "stream": self.source.stream,
            "super_stream": self.source.super_stream,
            "start": self.start,
            "end": self.end,
            "status": self.status.value,
            "dag_id": self.run.dag_id,
            "run_id": self.run.run_id,
            "task_id": self.run.task_id,
            "map_index": self.run.map_index,
            "try_number": self.run.try_number,
            "records": self.records,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "output": self.output,
            "offset_stored": self.offset_stored,
            "offset_verified": self.offset_verified,
            "error": self.error,
            "claimed_at": self.claimed_at.isoformat(),
            "committed_at": self.committed_at.isoformat() if self.committed_at else None,
            "heartbeat_at": self.heartbeat_at.isoformat() if self.heartbeat_at else None,
            "staging": self.staging,
            "published_at": self.published_at.isoformat() if self.published_at else None,
            "publisher": self.publisher,
            "sink_table": self.sink_table,
            "sink_commit": self.sink_commit,
            "interval": [t.isoformat() for t in self.interval] if self.interval else None,
        }


@dataclass(frozen=True, slots=True)
class Watermark:
    """Where a source is provably done: the contiguous prefix of committed (or lost) ranges.

    ``end`` is the exclusive end of that prefix (the first offset that an open claim, a failed hole,
    a committed range whose output is not published yet, or the tail keeps undone), ``last_record``
    the greatest record offset any committed range of the prefix saw (None when the prefix holds no
    record). The broker's stored offset for the pipeline
    must lie in ``[last_record, end - 1]``: it covers every committed record and never passes an
    offset that is not done. ``blocked_by`` is the open claim at ``end``, if that is what stops it.
    """

    end: int | None
    last_record: int | None
    blocked_by: OffsetRange | None = None
    last_record_range: int | None = None
    """The id of the committed range that holds ``last_record`` (marked stored once the broker has it)."""
    unpublished: OffsetRange | None = None
    """The committed range at ``end`` whose output is not published yet, if that is what stops it:
    the broker must not pass a range a reader cannot see yet."""

    def accepts(self, stored: int | None) -> bool:
        """True when a broker stored offset ``stored`` agrees with this watermark."""
        if stored is None:
            return self.last_record is None
        if self.last_record is not None and stored < self.last_record:
            return False
        return self.end is None or stored <= self.end - 1


@dataclass(frozen=True, slots=True)
class SameBroker:
    """The ledger's record that ``source``'s broker is the one reached under identity ``other`` too,
    for ``pipeline``'s stream (migration 0016): a claim's refusal or the audit found it (the broker
    held the chunks the other name's history committed) and wrote it for both names. Kept when the
    evidence is gone (retention rolled the chunk out), so the decision
    (``streamledger.batch.identity``) rests on it. ``why`` is the finding, one line, as first made;
    ``other_end`` where ``other``'s live history of the stream ends now (None: it has none).
    ``distinct``: the operator's verdict (``streamledger ledger distinct-brokers``) that the two names
    are two brokers after all (mirrors fed the same records hold chunks of one print): such a record
    refuses nothing and no later finding turns it back; ``why`` is then the operator's reason."""

    pipeline: str
    source: SourceRef
    other: str
    why: str
    found_at: datetime
    other_end: int | None = None
    distinct: bool = False


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """Where a pipeline stands on one source, as the ledger knows it: one read, one transaction.

    ``end`` is where the live ranges end, so where a new range begins (None without history);
    ``epoch`` which incarnation of the stream the history belongs to; ``stored`` the greatest
    offset the ledger recorded as stored on the broker (None if it never stored one): a broker whose
    committed tail is below ``end``, or which has no stored offset although the ledger stored one,
    holds another stream. ``watermark`` is the done prefix (the broker's stored offset rule);
    ``frontier`` its end once the prefix holds a committed or lost range (None before: a claim
    alone is not done). ``open_claims`` are the claims in flight; ``stale`` the ids of those not
    heard from for the caller's ``stale_after`` by the ledger's clock (the abandonment rule, decided
    here only); ``holes`` failed ranges holding offsets no live range covers (work the claim rule
    redoes: rule 2, a failed range a later range covers only in part included). ``chunk`` is the newest
    fingerprint of a committed chunk (None before one was taken): a broker whose chunk at its offset
    differs holds another stream (``streamledger.offsets.same_stream``). ``replaced`` is why a batch
    found the broker holding another stream (None if none did): every later batch refuses it too,
    until ``new-epoch``. ``seen_tail`` the greatest committed tail of the stream a batch saw.
    ``elsewhere``: the newest chunk fingerprint of the pipeline's history of the same stream under
    every other live broker identity, ``(identity, print)`` sorted: a broker holding one of them is
    one broker under two names (``streamledger.batch.identity.one_broker``); ``same_broker``: the
    identities the ledger recorded as this very broker (:class:`SameBroker`), which outlive the
    prints; ``same_broker_joined``: when there are such, the stream's records of the other names
    (``source.broker`` another name), which the batch joins into groups: a name recorded with a
    name recorded with a third is one broker with the third. ``pinned_range``: a
    range of the history pinned to a data interval; ``free_range``: a non-empty range a free claim
    made (where the ledger ended: a batch without an interval, a streaming query); a history holds
    one kind only (``streamledger.batch.history.mixed_because``).
    """

    end: int | None
    epoch: int
    stored: int | None
    watermark: Watermark | None = None
    frontier: int | None = None
    open_claims: tuple[OffsetRange, ...] = ()
    stale: frozenset[int] = frozenset()
    holes: tuple[OffsetRange, ...] = ()
    chunk: ChunkPrint | None = None
    replaced: str | None = None
    seen_tail: int | None = None
    elsewhere: tuple[tuple[str, ChunkPrint], ...] = ()
    pinned_range: OffsetRange | None = None
    free_range: OffsetRange | None = None
    same_broker: tuple[SameBroker, ...] = ()
    same_broker_joined: tuple[SameBroker, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One source's part of :meth:`Ledger.claim_many`: the arguments :meth:`Ledger.claim` takes per
    source (the rule applied to them is the same)."""

    source: SourceRef
    end_limit: int
    initial_start: int | None = None
    span: tuple[int, int] | None = None
    """A pinned claim's offsets (with ``interval``): :meth:`Ledger.claim`'s ``span``."""
    interval: tuple[datetime, datetime] | None = None
    record_free: tuple[int, int] | None = None
    """Offsets ``[start, end)`` the caller probed and found to hold no user record (tracking chunks):
    :meth:`Ledger.claim`'s ``record_free``."""


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """One range's part of :meth:`Ledger.commit_many`: the arguments of :meth:`Ledger.commit`."""

    range_id: int
    records: int
    first_seen: int | None
    last_seen: int | None
    output: str | None
    staging: str | None = None
    publisher: str | None = None
    chunk: ChunkPrint | None = None
    rows_out: int | None = None
    """What the transform wrote (None: no transform); see ``OffsetRange.rows_out``."""
    dead_letter: int | None = None
    transform: str | None = None
