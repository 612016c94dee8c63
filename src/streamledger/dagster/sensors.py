"""A backlog sensor whose cursor can never run ahead of committed work.

The usual Kafka-style Dagster sensor commits consumer offsets when it *requests* a run, so a run that
fails loses its data. Here the sensor commits nothing: on every tick it recomputes its cursor from
the ledger — per stream, the end of the contiguous committed prefix (the *frontier*) — and compares
it with the broker's committed tail. The cursor is therefore a report of what is done, never a
promise; a failed or killed run leaves it where it was, still covering that run's offsets.

Per tick:

* a range still ``claimed`` by a live holder means a run is in flight: no request, the skip reason
  names the range and its run. A claim is *gone* when the Dagster instance reports every run of the
  holder's re-execution family finished (a killed run, once marked failed) or its heartbeat is
  older than the batch's ``claim_timeout``; a run is then requested, and the batch redoes that span
  (re-executing the killed run would get the same range back, too);
* otherwise, if the streams hold at least ``min_backlog`` user records beyond the frontier, one run
  is requested with a run key made of the frontier and the ids of failed, not yet redone ranges. The
  key repeats while nothing changes (Dagster then starts no duplicate), and changes after a commit
  (next batch) or a failure (a new run, which redoes exactly the failed span).

Backlog is counted in *records*, read from the frontier and stopped as soon as ``min_backlog`` are
seen, not in offsets: every stored broker offset appends a tracking chunk that takes an offset
(measured on 4.3: 100 records, stored offset 99, committed tail 101). Counting offsets would make
each batch request the next one, forever, for a range holding only that tracking chunk.
"""


import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AssetKey,
    AssetsDefinition,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from streamledger.batch import BatchConfig, RunId
from streamledger.dagster.assets import DEFAULT_BROKER_KEY, DEFAULT_LEDGER_KEY
from streamledger.dagster.identity import holder_alive
from streamledger.errors import StreamledgerError

PIPELINE_TAG = "streamledger/pipeline"
BACKLOG_TAG = "streamledger/backlog_offsets"
_DONE = ("committed", "lost")
#: The batch's default; a claim without heartbeat for this long is redone by the next run.
DEFAULT_CLAIM_TIMEOUT: float = BatchConfig.__dataclass_fields__["claim_timeout"].default  # type: ignore[assignment]


@dataclass
class StreamState:
    """What the ledger and the broker say about one stream of the pipeline."""

    stream: str
    frontier: int | None  # end of the contiguous committed/lost prefix; None without history
    tail: int
    start: int  # where the next batch begins: the frontier, else stored offset + 1, else first
    claimed: list[Any] = field(default_factory=list)
    failed: list[Any] = field(default_factory=list)
    gone: list[Any] = field(default_factory=list)  # claims whose holder is gone: work to redo

    @property
    def offsets(self) -> int:
        """Offsets past the start: an upper bound on the records waiting."""
        return max(0, self.tail - self.start)


def records_waiting(client: Any, state: StreamState, need: int) -> int:
    """User records in ``[start, tail)``, counting no further than ``need`` (cheap when small)."""
    from streamledger.protocol.rabbitmq import DataLossError

    if state.offsets == 0 or need <= 0:
        return 0
    seen = 0
    try:
        batches = client.read_range(state.stream, state.start, state.tail, decode="raw")
        try:
            for batch in batches:
                seen += len(batch)
                if seen >= need:
                    break
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    except DataLossError:
        return need  # retention ran past the start: the batch must run to record (or refuse) the loss
    return seen


def frontier(ranges: Sequence[Any]) -> int | None:
    """End of the contiguous run of committed (or lost) ranges from the pipeline's first range."""
    done = sorted((r for r in ranges if str(r.status) in _DONE), key=lambda r: (r.start, r.end))
    if not done:
        return None
    end = int(done[0].start)
    for r in done:
        if r.start > end:
            break  # a hole: whatever lies beyond is not safely done
        end = max(end, int(r.end))
    return end


def claim_gone(rng: Any, alive: Callable[[RunId], bool], claim_timeout: float, now: datetime) -> bool:
    """A claim nobody will finish: its heartbeat stopped, or the instance saw its run family end."""
    beat = rng.heartbeat_at or rng.claimed_at
    if beat.tzinfo is None:
        beat = beat.replace(tzinfo=UTC)
    if (now - beat).total_seconds() > claim_timeout:
        return True
    h = rng.run
    return not alive(RunId(h.dag_id, h.run_id, h.task_id, h.map_index, h.try_number))


def stream_state(
    client: Any,
    ledger: Any,
    pipeline: str,
    stream: str,
    alive: Callable[[RunId], bool] = lambda holder: True,
    claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
    ranges: Sequence[Any] | None = None,
    now: datetime | None = None,
) -> StreamState:
    """``ranges`` and ``now`` (the ledger's clock) when the caller has them already: one query per tick."""
    if ranges is None:
        ranges = ledger.ranges(pipeline, stream=stream)
    front = frontier(ranges)
    tail = int(client.committed_tail(stream))
    if front is not None:
        start = front
    else:
        stored = client.query_offset(stream, pipeline)
        start = int(stored) + 1 if stored is not None else int(client.first_offset(stream))
    below = front if front is not None else -1
    if now is None:
        now = ledger.clock()  # the clock the heartbeats were stamped by: this host's may be off
    open_claims = [r for r in ranges if str(r.status) == "claimed"]
    gone = [r for r in open_claims if claim_gone(r, alive, claim_timeout, now)]
    claimed = [r for r in open_claims if r not in gone]
    redone = {(r.start, r.end) for r in ranges if str(r.status) in _DONE}
    failed = [
        r for r in ranges
        if str(r.status) == "failed" and r.end > below and (r.start, r.end) not in redone
    ]
    return StreamState(stream, front, tail, start, claimed, failed, gone)


def cursor_of(states: Sequence[StreamState]) -> dict[str, Any]:
    """The sensor's memory: the frontier per stream and the failed or abandoned ranges to redo."""
    return {
        "committed": {s.stream: s.frontier for s in states},
        "failed": {
            s.stream: sorted(int(r.id) for r in s.failed + s.gone) for s in states if s.failed or s.gone
        },
    }


def run_key_of(pipeline: str, cursor: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(cursor, sort_keys=True).encode()).hexdigest()[:16]
    return f"{pipeline}:{digest}"


def build_stream_backlog_sensor(
    asset: AssetsDefinition | AssetKey | str | Sequence[str],
    *,
    pipeline: str,
    super_stream: str | None = None,
    stream: str | None = None,
    name: str | None = None,
    min_backlog: int = 1,
    claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    broker_resource_key: str = DEFAULT_BROKER_KEY,
    ledger_resource_key: str = DEFAULT_LEDGER_KEY,
) -> SensorDefinition:
    """A sensor that requests a materialization of ``asset`` when ``pipeline`` has unread offsets.

    :param asset: the (unpartitioned) stream batch asset, or its key.
    :param min_backlog: user records (summed over the streams) that make a run worth starting.
    :param claim_timeout: the asset's ``BatchConfig.claim_timeout`` (when a silent claim is abandoned).
    """
    if (super_stream is None) == (stream is None):
        raise StreamledgerError(f"pipeline {pipeline!r}: give exactly one of stream or super_stream")
    if isinstance(asset, AssetsDefinition) and asset.partitions_def is not None:
        raise StreamledgerError(
            f"pipeline {pipeline!r}: the backlog sensor drives an unpartitioned asset; schedule a "
            "time-window partitioned one with build_schedule_from_partitioned_job"
        )
    if min_backlog < 1:
        raise StreamledgerError(f"pipeline {pipeline!r}: min_backlog must be >= 1, got {min_backlog}")
    key = asset.key if isinstance(asset, AssetsDefinition) else AssetKey.from_coercible(asset)
    names: list[str] = [stream] if stream is not None else []

    @sensor(
        name=name or f"{key.to_python_identifier()}_backlog_sensor",
        target=[key],
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        required_resource_keys={broker_resource_key, ledger_resource_key},
        description=f"Requests a batch of pipeline {pipeline} when its streams have uncommitted offsets.",
    )
    def _backlog_sensor(context: SensorEvaluationContext, **_direct: Any) -> SensorResult:
        # Resources come from context.resources (keys are configurable); a direct call, as in tests,
        # also passes them as keyword arguments, which ``_direct`` absorbs.
        ledger = getattr(context.resources, ledger_resource_key).get_ledger()
        with getattr(context.resources, broker_resource_key).get_client() as client:
            streams = client.partitions(super_stream) if super_stream else names
            alive = holder_alive(context.instance, current_run_id="")
            now = ledger.clock()
            by_stream: dict[str, list[Any]] = {s: [] for s in streams}
            for r in ledger.ranges(pipeline):  # one query for all streams: 64 partitions, one round trip
                by_stream.setdefault(r.source.stream, []).append(r)
            states = [
                stream_state(client, ledger, pipeline, s, alive, claim_timeout, ranges=by_stream[s], now=now)
                for s in streams
            ]
            cursor = cursor_of(states)
            text = json.dumps(cursor, sort_keys=True)
            claimed = [(s.stream, r) for s in states for r in s.claimed]
            if claimed:
                held_stream, held = claimed[0]
                return SensorResult(
                    skip_reason=SkipReason(
                        f"pipeline {pipeline}: {held_stream} [{held.start}, {held.end}) is claimed by "
                        f"{held.run.dag_id}/{held.run.run_id}, still running"
                    ),
                    cursor=text,
                )
            found = 0
            for state in states:
                found += records_waiting(client, state, min_backlog - found)
        offsets = sum(s.offsets for s in states)
        if found < min_backlog and not cursor["failed"]:
            return SensorResult(
                skip_reason=SkipReason(
                    f"pipeline {pipeline}: {found} records waiting (< {min_backlog}) in {offsets} offsets"
                ),
                cursor=text,
            )
        request = RunRequest(
            run_key=run_key_of(pipeline, cursor),
            tags={PIPELINE_TAG: pipeline, BACKLOG_TAG: str(offsets)},
        )
        context.log.info("pipeline %s: >= %d records waiting -> run %s", pipeline, found, request.run_key)
        return SensorResult(run_requests=[request], cursor=text)

    return _backlog_sensor
