"""Structured Streaming over RabbitMQ streams: ``spark.readStream.format("rabbitmq_stream")``.

The source offset is one next-offset per stream (partition), carried as JSON in Spark's checkpoint.
A micro-batch is the half-open range ``[start, end)`` of every stream between two source offsets;
its partitions are the batch source's :class:`StreamSlice` s, read by the batch source's
:func:`read_slice` (same columns, same Arrow path, same slice check: no second decoder).

Admission control (Spark 4.2): ``maxOffsetsPerTrigger`` becomes the default ``ReadMaxRows`` and
``latestOffset(start, limit)`` admits at most that many offsets across the streams (offsets have
gaps, so a batch holds at most that many records). ``Trigger.AvailableNow`` fixes the committed
tails in ``prepareForTriggerAvailableNow``; nothing past them is ever admitted.

The offset JSON also carries the source's query id (a UUID chosen when the query first starts: a
Python source cannot see Spark's query id) and the source's batch number, so a query restarted from
its checkpoint keeps its identity in the ledger; ``from`` holds the start of streams the previous
offset did not fix (the first batch, a new super-stream partition), so a replayed batch reads
exactly what the first attempt planned even when ``latest`` or ``earliest`` moved in between.

Ledger recording (opt-in ``ledger`` + ``pipeline``, public :class:`~streamledger.ledger.Ledger`
API only): each micro-batch claims one range per stream with
``RunIdentity("spark-streaming:<query id>", "batch-<n>", <stream>)`` when Spark plans it, and the
claims are committed (without staging, so published with the commit) once Spark says the batch is
done, then the broker offset is stored at the ledger's watermark. Spark 4.2 calls ``commit(end)``
of batch *n* only when it plans batch *n+1*, so the claims are also settled when
``latestOffset(start)`` is called (Spark asks for a new batch only after the previous one reached
the commit log): the last batch of a run is recorded in that run. The recording is the batch layer's
:class:`~streamledger.batch.microbatch.MicroBatchRecorder`: it records exactly the span each batch's
checkpointed offsets name, or fails the query with one line.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from streamledger.errors import StreamledgerError
from streamledger.sources import super_stream_partitions
from streamledger.spark.admission import TriggerOptions, admit_bytes
from streamledger.spark.planning import (
    OffsetBound,
    PlannedRange,
    PlanningError,
    option_getter,
    resolve_bound,
)
from streamledger.spark.reading import DATA_SOURCE_NAME, ReadOptions, StreamSlice, read_slice, slices_for

if TYPE_CHECKING:
    from streamledger.batch.microbatch import MicroBatchRecorder

log = logging.getLogger(__name__)


class StreamingError(StreamledgerError):
    """A streaming query cannot go on (an offset this source did not write, a batch without a start);
    a ledger history that disagrees with the query raises
    :class:`~streamledger.batch.microbatch.MicroBatchError`."""


@dataclass(frozen=True)
class StreamingOptions:
    """The batch source's options plus the streaming ones, parsed once."""

    read: ReadOptions
    trigger: TriggerOptions = field(default_factory=TriggerOptions)
    ledger_url: str | None = field(default=None, repr=False)  # may carry a password
    ledger_on: bool = False
    pipeline: str | None = None
    ledger_output: str | None = None
    broker_name: str | None = None

    @property
    def max_offsets(self) -> int | None:
        return self.trigger.max_offsets

    @classmethod
    def parse(cls, options: Any) -> StreamingOptions:
        get = option_getter(options)
        for key, why in (("endingOffsets", "a stream has no end"), ("ranges", "use startingOffsets")):
            if get(key):
                raise PlanningError(
                    f"{DATA_SOURCE_NAME} (streaming): option {key!r} is for batch reads; {why}"
                )
        for key in ("endingTimestamp", "endingOffsetsByTimestamp"):
            if get(key):
                raise PlanningError(
                    f"{DATA_SOURCE_NAME} (streaming): option {key!r} is for batch reads; a stream has no end"
                )
        read = ReadOptions.parse(options)
        trigger = TriggerOptions.parse(get)
        ledger_text = (get("ledgerUrl") or get("ledger") or "").strip()
        ledger_on = bool(ledger_text) and ledger_text.lower() not in ("false", "none", "off")
        pipeline = (get("pipeline") or "").strip() or None
        output = (get("ledgerOutput") or "").strip() or None
        if ledger_on and (pipeline is None or output is None):
            raise PlanningError(
                f"{DATA_SOURCE_NAME}: option 'ledger' needs 'pipeline' (the ledger's pipeline name) and "
                "'ledgerOutput' (where each recorded range's _manifest.json goes)"
            )
        if pipeline is not None and not ledger_on:
            raise PlanningError(f"{DATA_SOURCE_NAME}: option 'pipeline' needs 'ledger' (a URL or 'default')")
        url = None if not ledger_on or ledger_text.lower() in ("default", "true") else ledger_text
        return cls(
            read=read,
            trigger=trigger,
            ledger_url=url,
            ledger_on=ledger_on,
            pipeline=pipeline,
            ledger_output=output,
            broker_name=(get("brokerName") or "").strip() or None,
        )


@dataclass(frozen=True)
class SourceOffset:
    """What Spark checkpoints for this source (see the module docstring)."""

    query: str
    batch: int
    offsets: dict[str, int]
    starts: dict[str, int] = field(default_factory=dict)  # JSON "from"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"query": self.query, "batch": self.batch,
                               "offsets": {s: self.offsets[s] for s in sorted(self.offsets)}}
        if self.starts:
            out["from"] = {s: self.starts[s] for s in sorted(self.starts)}
        return out

    @classmethod
    def from_json(cls, data: Any) -> SourceOffset:
        try:
            return cls(str(data["query"]), int(data["batch"]),
                       {str(k): int(v) for k, v in data["offsets"].items()},
                       {str(k): int(v) for k, v in (data.get("from") or {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError):
            raise StreamingError(
                f"{DATA_SOURCE_NAME}: the checkpoint holds an offset this source did not write: {data!r}"
            ) from None

    def start_of(self, stream: str, previous: SourceOffset) -> int:
        """Where this offset's batch starts reading ``stream`` (``from`` wins over the previous end)."""
        if stream in self.starts:
            return self.starts[stream]
        if stream in previous.offsets:
            return previous.offsets[stream]
        raise StreamingError(f"stream {stream!r}: the micro-batch ending at {self.to_json()} has no start")


def admit(starts: Mapping[str, int], tails: Mapping[str, int], max_offsets: int | None) -> dict[str, int]:
    """Ends for one trigger: every stream up to its tail, or at most ``max_offsets`` offsets in all,
    shared in proportion to each stream's backlog (the rest of the division goes to the streams in
    name order; a non-empty backlog always admits at least one offset)."""
    backlog = {s: max(0, tails[s] - starts[s]) for s in starts}
    total = sum(backlog.values())
    if max_offsets is None or total <= max_offsets:
        return {s: starts[s] + backlog[s] for s in starts}
    share = {s: max_offsets * backlog[s] // total for s in starts}
    left = max_offsets - sum(share.values())
    for s in sorted(starts):
        if left <= 0:
            break
        more = min(left, backlog[s] - share[s])
        share[s] += more
        left -= more
    return {s: starts[s] + share[s] for s in starts}


class RabbitMQStreamMicroBatchReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader. Spark keeps one instance per query run in a driver-side Python process
    (every method but ``read``) and pickles fresh ones to the executors for ``read``: the live
    connection and ledger are opened lazily and never pickled."""

    def __init__(self, options: StreamingOptions) -> None:
        self.options = options
        self._query = str(uuid.uuid4())  # used only when the query has no checkpointed offset yet
        self._target: dict[str, int] | None = None
        self._client: Any = None
        self._recorder: MicroBatchRecorder | None = None
        #: stream -> (tail before, tail after) our own last StoreOffset, whose tracking entry takes an
        #: offset: a tail that moved only by it is no new data (else every batch is followed by an
        #: empty one, and an empty range in the ledger).
        self._own: dict[str, tuple[int, int]] = {}
        #: When this run last admitted a batch (Kafka's maxTriggerDelay clock; 0: the first trigger
        #: never waits).
        self._last_trigger_ms = 0
        #: stream -> the committed tail the last trigger saw (recorded with the claims: audit rule 10)
        self._seen: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_recorder": None}

    # -- driver side ------------------------------------------------------------------------------

    def client(self) -> Any:
        from streamledger.protocol.rabbitmq import StreamClient

        if self._client is None:
            self._client = StreamClient.connect(self.options.read.url)
        return self._client

    def _call(self, fn: Any) -> Any:
        """Run ``fn(client)``; a dropped connection is reopened once (the runner lives for hours)."""
        from streamledger.protocol.rabbitmq import ConnectionClosed, ConnectionFailed

        try:
            return fn(self.client())
        except (ConnectionClosed, ConnectionFailed, OSError):
            self._drop_client()
            return fn(self.client())

    def _drop_client(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # already broken
                pass
            self._client = None

    def recorder(self) -> MicroBatchRecorder | None:
        """The ledger's recorder of this query's micro-batches (opt-in ``ledger`` + ``pipeline``)."""
        if self.options.ledger_on and self._recorder is None:
            from streamledger.batch.microbatch import MicroBatchRecorder
            from streamledger.batch.plan import broker_identity
            from streamledger.ledger import Ledger
            from streamledger.sources import shared_name_problem

            opts = self.options
            assert opts.pipeline is not None and opts.ledger_output is not None
            name = opts.broker_name or self.client().cluster_name
            problem = shared_name_problem(opts.read.url, name, opts.broker_name)
            if problem is not None:
                raise StreamingError(f"pipeline {opts.pipeline!r}: {problem}")
            broker = broker_identity(opts.read.url, name)
            ledger = Ledger(opts.ledger_url, create=True)
            # Rows recorded under another spelling of this broker's identity are this query's history.
            legacy = broker_identity(opts.read.url) if name else None
            ledger.adopt_identity(opts.pipeline, broker, legacy=legacy)
            self._recorder = MicroBatchRecorder(ledger, opts.pipeline, opts.ledger_output, broker,
                                                opts.read.super_stream)
        return self._recorder

    def streams(self, client: Any) -> list[str]:
        """The streams read now: the listed ones, or the super stream's partitions as of this call."""
        read = self.options.read
        if read.super_stream:
            return sorted(super_stream_partitions(client, read.super_stream, error=PlanningError))
        return sorted(read.names)

    def initialOffset(self) -> dict[str, Any]:
        def initial(client: Any) -> dict[str, Any]:
            streams = self.streams(client)
            read = self.options.read
            bounds = read.start_bounds(streams, default=OffsetBound.latest())
            given = read.starting is not None or read.times.starting is not None or read.times.starting_by
            recorder = self.recorder()
            offsets: dict[str, int] = {}
            for s in streams:
                resume = recorder.resume_point(s) if recorder and not given else None
                if resume is not None:
                    offsets[s] = resume  # the pipeline's ledger history says where it stopped
                    continue
                first, tail = int(client.first_offset(s)), int(client.committed_tail(s))
                offsets[s] = resolve_bound(client, s, bounds[s], first=first, tail=tail,
                                           past_tail=read.times.strategy)
            return SourceOffset(self._query, -1, offsets).to_json()

        result: dict[str, Any] = self._call(initial)
        return result

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.options.trigger.default_limit()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._call(lambda c: {s: int(c.committed_tail(s)) for s in self.streams(c)})
        log.info("availableNow: reading up to the committed tails %s", self._target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = SourceOffset.from_json(start)

        def latest(client: Any) -> dict[str, Any]:
            starts = dict(begin.offsets)
            new: dict[str, int] = {}
            for s in self.streams(client):
                if s not in starts:  # a super-stream partition added since: read from its first offset
                    new[s] = starts[s] = int(client.first_offset(s))
                    log.info("stream %r joined the query at offset %d", s, new[s])
            tails = {s: int(client.committed_tail(s)) for s in starts}
            self._seen = dict(tails)  # what the stream held: recorded with the next batch's claims
            behind = sorted(s for s in starts if tails[s] < starts[s])
            recorder = self.recorder()
            if behind and recorder is not None:  # a re-created stream is refused, and the refusal kept
                recorder.check_same_streams(behind, client)
            for s in behind:  # the stream lost offsets the query already passed
                new[s] = starts[s] = self._restart(client, s, starts[s], tails[s])
            for s, (before, after) in self._own.items():
                if starts.get(s) == before and tails.get(s) == after:
                    tails[s] = before
            self._own = {}
            if recorder is not None:  # Spark asks for batch n+1 only after batch n committed
                for s in recorder.settle(begin.query, begin.batch, begin.offsets, client):
                    after = int(client.committed_tail(s))
                    if after == tails[s] + 1:  # only our entry came in: else a record may hide there
                        self._own[s] = (tails[s], after)
            if self._target is not None:
                tails = {s: max(starts[s], min(t, self._target.get(s, starts[s]))) for s, t in tails.items()}
            budget = self.options.trigger.budget(limit, available_now=self._target is not None)
            now = int(time.time() * 1000)
            backlog = sum(max(0, tails[s] - starts[s]) for s in starts)
            if (not new and backlog < budget.min_offsets
                    and now - self._last_trigger_ms < self.options.trigger.max_trigger_delay_ms):
                return start  # Kafka's minOffsetsPerTrigger: wait for more, up to maxTriggerDelay
            ends = admit(starts, tails, budget.max_offsets)
            if budget.max_bytes is not None:
                sizes = {s: client.bytes_per_offset(s) or 0.0 for s in starts if ends[s] > starts[s]}
                ends = admit_bytes(starts, ends, sizes, budget.max_bytes)
            if not new and ends == begin.offsets:
                return start
            self._last_trigger_ms = now
            from_ = dict(starts) if begin.batch < 0 else new
            return SourceOffset(begin.query, begin.batch + 1, ends, from_).to_json()

        result: dict[str, Any] = self._call(latest)
        return result

    def _restart(self, client: Any, stream: str, start: int, tail: int) -> int:
        """The stream's committed tail fell below the query's offset (deleted and recreated, or
        truncated): Kafka's failOnDataLoss. An error by default; else read on from its first offset."""
        if self.options.read.fail_on_data_loss:
            raise StreamingError(
                f"stream {stream!r}: the committed tail {tail} is below the query's offset {start} (the "
                "stream was deleted and recreated, or truncated); set failOnDataLoss=false to read on "
                "from its first offset"
            )
        first = int(client.first_offset(stream))
        log.warning("stream %r: the committed tail %d is below the query's offset %d; reading on from "
                    "offset %d (failOnDataLoss=false)", stream, tail, start, first)
        return first

    def reportLatestOffset(self) -> dict[str, Any] | None:
        tails = self._call(lambda c: {s: int(c.committed_tail(s)) for s in self.streams(c)})
        return {"offsets": tails}

    def planned(self, start: dict[str, Any], end: dict[str, Any]) -> tuple[SourceOffset, list[PlannedRange]]:
        """The batch's range per stream, with retention applied (``failOnDataLoss``)."""
        from streamledger.protocol.rabbitmq import DataLossError

        begin, stop = SourceOffset.from_json(start), SourceOffset.from_json(end)

        def plan(client: Any) -> list[PlannedRange]:
            from streamledger.batch.position import log_offsets

            out = []
            spans = {s: (stop.start_of(s, begin), stop.offsets[s]) for s in sorted(stop.offsets)}
            tails, _ = log_offsets(client, [s for s, (a, b) in spans.items() if a < b], "", stored=False)
            for s, (a, b) in spans.items():
                if a > b:
                    raise StreamingError(f"stream {s!r}: micro-batch start {a} is after its end {b}")
                if a < b and tails[s] < b:  # a tail never shrinks: the checkpoint read another stream
                    raise StreamingError(
                        f"stream {s!r}: micro-batch {stop.batch} of query {stop.query} reads [{a}, {b}) but "
                        f"the committed tail is {tails[s]} (the stream was deleted and re-created?); nothing "
                        "claimed; restart the query with a new checkpoint"
                    )
                first = int(client.first_offset(s)) if a < b else a
                effective = a
                if a < first:
                    if self.options.read.fail_on_data_loss:
                        raise DataLossError(s, a, first)
                    effective = min(first, b)
                    log.warning("stream %r: offsets [%d, %d) were removed by retention before micro-batch %d "
                                "read them; skipped (failOnDataLoss=false)", s, a, effective, stop.batch)
                out.append(PlannedRange(s, effective, b, a))
            return out

        ranges: list[PlannedRange] = self._call(plan)
        return stop, ranges

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        stop, ranges = self.planned(start, end)
        recorder = self.recorder()
        if recorder is not None:
            self._call(lambda c: recorder.check_same_streams(sorted({r.stream for r in ranges}), c))
            for r in ranges:
                reason = f"removed by retention before micro-batch {stop.batch} of query {stop.query}"
                recorder.claim(stop.query, stop.batch, r.stream, r.start, r.end,
                               requested_start=r.requested_start, lost_reason=reason if r.lost else None)
            # if a stream is deleted and re-created, `new-epoch` records what it held unread as lost
            tails = {s: t for s, t in self._seen.items() if s in stop.offsets}
            spans = {r.stream: (r.start, r.end) for r in ranges}
            self._call(lambda c: recorder.saw_tails(tails, spans, c))
        return slices_for(ranges, self.options.read)

    def commit(self, end: dict[str, Any]) -> None:
        if self.options.ledger_on:
            upto = SourceOffset.from_json(end)
            self._call(lambda c: self.recorder().settle(upto.query, upto.batch, upto.offsets, c))  # type: ignore[union-attr]

    def stop(self) -> None:
        self._drop_client()
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None

    # -- executor side ----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, StreamSlice):
            return iter(())
        return read_slice(self.options.read, partition)
