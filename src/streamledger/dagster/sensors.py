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
from dataclasses import dataclass
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
from streamledger.batch.position import (
    PipelineSource,
    StreamPosition,
    measure,
    source_problem,
    user_records_many,
)
from streamledger.dagster.assets import DEFAULT_BROKER_KEY, DEFAULT_LEDGER_KEY
from streamledger.dagster.identity import holder_alive
from streamledger.errors import StreamledgerError

PIPELINE_TAG = "streamledger/pipeline"
BACKLOG_TAG = "streamledger/backlog_offsets"
#: The batch's default; a claim without heartbeat for this long is redone by the next run.
DEFAULT_CLAIM_TIMEOUT: float = BatchConfig.__dataclass_fields__["claim_timeout"].default  # type: ignore[assignment]


def waiting_offsets(position: StreamPosition) -> int:
    """Offsets past where the done work ends: an upper bound on the records waiting."""
    return max(0, position.tail - position.resume)


def stream_state(
    client: Any,
    ledger: Any,
    pipeline: str,
    stream: str,
    alive: Callable[[RunId], bool] = lambda holder: True,
    claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
    *,
    identity: str,
) -> StreamPosition:
    """One stream's position for ``pipeline`` on the broker the ledger names ``identity``."""
    source = PipelineSource(pipeline, "", stream=stream)
    (position,) = measure(client, ledger, source, streams=[stream], holder_alive=alive,
                          claim_timeout=claim_timeout, identity=identity, last_user=False)
    return position


@dataclass
class Backlog:
    """What waits for a pipeline: each stream's state, claims in flight, user records counted."""

    states: list[StreamPosition]
    claimed: list[tuple[str, Any]]  # (stream, range) held by a live run
    records: int  # user records beyond the frontiers, counted up to the ``need`` asked for

    @property
    def offsets(self) -> int:
        return sum(waiting_offsets(s) for s in self.states)


def backlog_of(client: Any, ledger: Any, source: PipelineSource, *, need: int,
               alive: Callable[[RunId], bool] = lambda holder: True,
               claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> Backlog:
    """One look at a pipeline's backlog on one broker connection (the sensor and the automation
    condition both ask this): positions from the ledger and the broker, then user records counted
    from each frontier until ``need`` are seen, every stream's in one round to the broker (a caught-up
    pipeline ends each partition in the tracking chunk its stored offset wrote, so every stream must
    be looked at). With a claim in flight nothing is counted."""
    positions = measure(client, ledger, source, holder_alive=alive, claim_timeout=claim_timeout,
                        last_user=False)  # user records are counted below instead
    claimed = [(p.stream, r) for p in positions for r in p.claimed]
    found = 0
    if not claimed and need > 0:
        waiting = {p.stream: (p.resume, p.tail) for p in positions if waiting_offsets(p) > 0}
        found = min(need, sum(user_records_many(client, waiting, need).values()))
    return Backlog(positions, claimed, found)


def cursor_of(positions: Sequence[StreamPosition]) -> dict[str, Any]:
    """The sensor's memory: the frontier per stream and the failed or abandoned ranges to redo."""
    redo = {p.stream: [*p.ledger.holes, *p.gone] for p in positions}
    return {
        "committed": {p.stream: p.frontier for p in positions},
        "failed": {stream: sorted(int(r.id) for r in ranges) for stream, ranges in redo.items() if ranges},
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
    problem = source_problem(pipeline, stream, super_stream)
    if problem is not None:
        raise StreamledgerError(problem)
    if isinstance(asset, AssetsDefinition) and asset.partitions_def is not None:
        raise StreamledgerError(
            f"pipeline {pipeline!r}: the backlog sensor drives an unpartitioned asset; schedule a "
            "time-window partitioned one with build_schedule_from_partitioned_job"
        )
    if min_backlog < 1:
        raise StreamledgerError(f"pipeline {pipeline!r}: min_backlog must be >= 1, got {min_backlog}")
    key = asset.key if isinstance(asset, AssetsDefinition) else AssetKey.from_coercible(asset)

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
        broker = getattr(context.resources, broker_resource_key)
        with broker.get_client() as client:
            source = PipelineSource(pipeline, str(broker.url), stream=stream, super_stream=super_stream)
            alive = holder_alive(context.instance, current_run_id="")
            waiting = backlog_of(client, ledger, source, need=min_backlog, alive=alive,
                                 claim_timeout=claim_timeout)
        cursor = cursor_of(waiting.states)
        text = json.dumps(cursor, sort_keys=True)
        if waiting.claimed:
            held_stream, held = waiting.claimed[0]
            return SensorResult(
                skip_reason=SkipReason(
                    f"pipeline {pipeline}: {held_stream} [{held.start}, {held.end}) is claimed by "
                    f"{held.run.dag_id}/{held.run.run_id}, still running"
                ),
                cursor=text,
            )
        found, offsets = waiting.records, waiting.offsets
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
