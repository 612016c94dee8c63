"""Pure planning: names and numbers a batch derives from its configuration and the broker's
answers, with no side effect. Which range a run processes is *not* decided here: the ledger's one
claim rule (``Ledger.claim``) decides it; planning only supplies the claim's inputs (where a
brand-new pipeline starts, how far a new range may reach) and, afterwards, which offset the broker
should store (the ledger's watermark)."""

from __future__ import annotations

import enum
from datetime import datetime, timedelta

from streamledger.batch.config import BatchConfig, Broker, IntervalNotReady, RunId
from streamledger.fs import join, parent
from streamledger.ledger.types import SourcePosition, Watermark
from streamledger.paths import broker_component, encode_component, fit_component
from streamledger.sources import source_identity


def broker_identity(url: str, name: str | None = None) -> str:
    """A credential-free, stable name for the log server in the ledger: ``<kind>://<name>[/<vhost>]``.

    ``name`` is the cluster name the broker reports (or one the user sets). The rule, per kind of log
    (``rabbitmq://`` for stream URLs, ``mewbase://`` for a mewbase server), is
    :func:`streamledger.sources.source_identity`.
    """
    return source_identity(url, name)


def pipeline_dir(root: str, pipeline: str) -> str:
    """``<root>/<pipeline>``: the directory of a pipeline's published ranges (and a Delta sink's
    default table), its name one encoded component, so no pipeline name leaves ``root``."""
    return join(root, encode_component(pipeline))


def range_dir(base: str, broker: str, stream: str, start: int, end: int, *, epoch: int = 0) -> str:
    """``<base>/<broker>/<stream>/<start>-<end>``: a range's directory under a pipeline's directory
    (or a Delta table's root), each name one encoded component (the broker's readable:
    :func:`streamledger.paths.broker_component`). Ranges of a re-created stream
    (``epoch`` > 0, see ``Ledger.new_epoch``) are named ``e<epoch>-<start>-<end>`` so they never
    meet the old stream's ranges of the same span."""
    span = f"{start:012d}-{end:012d}"
    leaf = f"e{epoch}-{span}" if epoch else span
    return join(base, broker_component(broker), encode_component(stream), leaf)


def output_dir(root: str, pipeline: str, broker: str, stream: str, start: int, end: int, *,
               epoch: int = 0) -> str:
    """A range's published directory, ``<root>/<pipeline>/<broker>/<stream>/<start>-<end>``: a pure
    function of its inputs (one per committed range). Each name is one component
    (:func:`streamledger.paths.encode_component`): nothing leaves the root, distinct pipelines,
    brokers (identities as :func:`broker_identity` gives them) or streams never share a directory
    (:func:`pipeline_dir`, then :func:`range_dir`)."""
    return range_dir(pipeline_dir(root, pipeline), broker, stream, start, end, epoch=epoch)


def staging_dir(root: str, pipeline: str, broker: str, run: RunId, token: str) -> str:
    """Where one attempt's job writes (every partition of the batch): outside the pipeline's
    published tree (``<root>/_staging/<pipeline>/<broker>/...``; no encoded pipeline is
    ``_staging``), so a reader globbing ``<root>/<pipeline>/`` never sees unpublished files, yet on
    the same file system for the rename."""
    return join(parent(staging_prefix(root, pipeline, broker, run)), f"{attempt_name(run)}.{token}")


_WHO_BYTES = 200
"""Room for ``dag.run.task.map`` in a staging name, leaving ``.t<try>.<token>`` within one component."""


def attempt_name(run: RunId) -> str:
    """``dag.run.task.map.tN``: staging names start with the run identity, then the try. The parts
    are encoded with every ``.`` escaped, so the dots separate them unambiguously and one run's
    prefix (:func:`staging_prefix`) never matches another run's attempts."""
    parts = [encode_component(p, keep_dots=False) for p in (run.dag_id, run.run_id, run.task_id)]
    who = fit_component(".".join([*parts, str(run.map_index)]), _WHO_BYTES)
    return f"{who}.t{run.try_number}"


def staging_prefix(root: str, pipeline: str, broker: str, run: RunId) -> str:
    """The common prefix of every attempt's staging directory of this run identity."""
    who = attempt_name(run).rsplit(".t", 1)[0]
    return join(root, "_staging", encode_component(pipeline), broker_component(broker), f"{who}.t")


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def resolve_time(broker: Broker, stream: str, moment: datetime) -> int:
    """The first offset of the first chunk stamped at or after ``moment`` (the tail if none)."""
    from streamledger.offsets import OffsetSpec

    return int(broker.resolve_offset(stream, OffsetSpec.timestamp(millis(moment))))


def claim_limit(cfg: BatchConfig, broker: Broker, stream: str, tail: int) -> int:
    """How far a new range of this batch may reach: the committed tail ``tail``, or the first
    offset stamped at or after the data interval's end."""
    if cfg.interval_end is None:
        return tail
    return min(tail, resolve_time(broker, stream, cfg.interval_end))


def pinned_span(cfg: BatchConfig, broker: Broker, stream: str, tail: int, now: datetime) -> tuple[int, int]:
    """A partition's pinned range for the data interval: ``[first offset stamped at or after its
    start, first offset stamped at or after its end)``, by chunk timestamps (a chunk belongs to the
    interval it is stamped in).

    Resolvable once a chunk stamped at or after the end is committed (``tail`` has passed the
    end); chunks are committed in order, so none stamped before the end can come later. On an idle
    stream no such chunk may come for a long time: once ``interval_grace`` has passed after the end,
    the end is the committed tail (chunks stamped before the end have long been committed by then).
    Until either holds: :class:`IntervalNotReady` (nothing is claimed).
    """
    assert cfg.interval_start is not None and cfg.interval_end is not None
    end = resolve_time(broker, stream, cfg.interval_end)
    if end >= tail:
        ready_by = cfg.interval_end + timedelta(seconds=cfg.interval_grace)
        if now < ready_by:
            raise IntervalNotReady(
                f"stream {stream!r}: interval [{cfg.interval_start.isoformat()}, "
                f"{cfg.interval_end.isoformat()}) "
                f"is not ready: no chunk stamped at or after its end is committed yet (tail {tail}); "
                f"it is resolved by {ready_by.isoformat()} at the latest", ready_by)
        end = tail
    return min(resolve_time(broker, stream, cfg.interval_start), end), end


class Origin(enum.StrEnum):
    """Where :func:`initial_start` found a new history's first offset (named in its messages)."""

    BROKER = "broker"
    INITIAL = "initial"
    FIRST = "first"
    TAIL = "tail"
    INTERVAL_START = "interval_start"
    #: a pinned history's origin lies before retention's cut: the history begins at offset 0
    BEFORE_RETENTION = "interval_start (retention took the stream's head)"


def initial_start(cfg: BatchConfig, broker: Broker, stream: str, tail: int,
                  stored: int | None) -> tuple[int, Origin]:
    """Where a pipeline without ledger history starts: after the broker's stored offset
    (``stored``, as the broker answered it), else at the configured initial position. The ledger
    ignores it once the source has ranges."""
    if stored is not None:
        return stored + 1, Origin.BROKER
    position = cfg.initial_position
    if isinstance(position, int):
        return position, Origin.INITIAL
    if position == "first":
        return int(broker.first_offset(stream)), Origin.FIRST
    if position == "tail":
        return tail, Origin.TAIL
    moment = cfg.origin if cfg.bound_by_interval and cfg.origin is not None else cfg.interval_start
    assert moment is not None
    start = min(tail, resolve_time(broker, stream, moment))
    first = int(broker.first_offset(stream))
    if start == first and first > 0:
        # The oldest chunk left is stamped at or after the origin and retention took what came
        # before it: records stamped after the origin may be among them, and nothing can tell. The
        # history then begins before retention's cut, at offset 0, so the first interval's claim
        # reaches back to it and retention's loss is failed or recorded (on_data_loss), never silent.
        return 0, Origin.BEFORE_RETENTION
    return start, Origin.INTERVAL_START


def opens_history(cfg: BatchConfig) -> bool:
    """Whether this run's data interval is the first of a pinned history (its start at or before
    the origin, or no origin: the history begins with the first interval that runs)."""
    if cfg.interval_start is None:
        return False
    return cfg.origin is None or cfg.interval_start <= cfg.origin


def offset_to_store(mark: Watermark, stored: int | None) -> int | None:
    """The offset to store now, or None when the broker must not be written.

    The watermark's ``last_record`` (the last committed record of the done prefix): stored only
    when the broker is behind it, so idle runs write nothing (every StoreOffset takes an offset of
    the stream) and the broker never passes a range that is not done.
    """
    target = mark.last_record
    if target is None:
        return None
    if stored is not None and stored >= target:
        return None
    return target


TRACKING_SPAN = 8
"""New offsets past the ledger's end up to which a settled source (:func:`settled`) is probed for user
records before the claim: the tracking chunks StoreOffsets wrote (one offset each: this pipeline's
last store, other consumers'), which the claim would take and the probe would find empty anyway."""


def settled(cfg: BatchConfig, pos: SourcePosition, tail: int, stored: int | None) -> bool:
    """Whether this batch writes nothing for the source that its identity check (the fingerprint of a
    committed chunk, :func:`streamledger.offsets.same_streams`) guards, when the broker holds no
    user record past the ledger's end: no range with offsets is claimed (the claim rule gives the
    empty range at the end: no claim is open, nothing is left to redo, no interval is pinned), and no
    offset is stored (the broker's stored offset already covers the done prefix, which holds the
    whole history and waits for no publish). Such a batch then leaves the source as if it had not run
    (an empty range at the end; with tracking chunks, a range of them committed with no record), and
    a batch that does not run checks nothing: the check is made by the first batch that reads or
    stores, on the same evidence, so it can neither skip nor double a record. The broker's tail
    bounds the claim (a producer publishing meanwhile lands past it, for the next batch), and a
    claim that comes back reaching past what was seen (the ledger moved meanwhile) is checked before
    it is read (``Batch.check_late``).

    Not settled, and checked as before: a stream whose stored offset is gone or behind (a re-created
    stream has none until a checked batch stores one), a tail below the greatest one a batch saw (a
    committed tail never shrinks: offsets the old stream held past the end must stay recorded as
    unread when a new epoch begins), a source refused before.
    """
    mark = pos.watermark
    return (not cfg.bound_by_interval and pos.replaced is None and pos.end is not None
            and (pos.seen_tail is None or tail >= pos.seen_tail)
            and not pos.open_claims and not pos.holes
            and mark is not None and mark.end == pos.end and mark.unpublished is None
            and stored is not None and offset_to_store(mark, stored) is None)
