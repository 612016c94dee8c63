"""Stream batches as Dagster assets: each materialization is one ledgered, bounded batch.

:func:`build_stream_batch_asset` returns an ordinary ``AssetsDefinition`` whose step runs
:func:`streamledger.batch.run_batch` once: one half-open offset range per partition of the super
stream (or the one stream), read by one Spark job into staging, committed in the ledger, published
as ``<output_root>/<pipeline>/<broker>/<stream>/<start>-<end>/``, then the broker's stored offset follows the
ledger's low watermark. The delivery rules are those of :mod:`streamledger.batch`; this module only
adds the Dagster side:

* **identity** — the range is claimed under (root run id, asset key, partition key), see
  :mod:`streamledger.dagster.identity`. A step retry or a re-execution of a failed or killed run
  gets the very same range back (and finishes it); a new run continues after it. A killed run's
  claim is released for others once the Dagster instance reports its run finished, or after the
  batch's ``claim_timeout`` without heartbeat.
* **time-window partitions** (optional) — partition ``[t0, t1)`` reads, per stream, from the
  ledger's end up to the first offset stamped at or after ``t1`` (chunk timestamps, broker clock,
  chunk granularity). Windows must be done in order; a window whose predecessors still hold
  unprocessed offsets is refused with an error naming them, instead of silently folding their data
  into the later window. Empty windows need no run; a window run again after it was done finds
  nothing new (its range is in the ledger and its directory is published once).
* **metadata** — ranges, records, output paths, ledger range ids and stored offsets of every stream,
  each range of the batch on its own in ``pieces`` (:func:`streamledger.batch.lineage.lineage_of`),
  and the lag left after the batch (``streamledger/lag_seconds``, from chunk timestamps:
  :mod:`streamledger.dagster.freshness`); with a table sink (``sink="iceberg"`` /
  ``"delta"``) also the table (``streamledger/table``: format, identifier, location, snapshot id or
  version) and ``dagster/uri`` = the table's location.
"""


from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AutomationCondition,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    TimeWindowPartitionsDefinition,
    asset,
)

from streamledger.batch import BatchConfig, BatchResult, run_batch
from streamledger.batch.lineage import lineage_of
from streamledger.batch.position import PipelineSource
from streamledger.batch.rules import sink_library_problem
from streamledger.batch.spec import Door, PipelineSpec, spec_settings
from streamledger.dagster.freshness import lag_by_stream
from streamledger.dagster.identity import holder_alive, run_id_for
from streamledger.errors import MissingExtra, StreamledgerError

DEFAULT_BROKER_KEY = "rabbitmq"
DEFAULT_LEDGER_KEY = "ledger"
DEFAULT_SPARK_KEY = "spark"
#: Materialization metadata: seconds of stream time not yet in the output (max over the streams).
LAG_KEY = "streamledger/lag_seconds"


class StreamBatchOrderError(StreamledgerError):
    """A time-window partition was asked for while earlier windows still hold unprocessed offsets."""


def batch_metadata(result: BatchResult) -> dict[str, Any]:
    """Materialization metadata of one batch: every range (``pieces``) and the per-stream maps, from
    :func:`~streamledger.batch.lineage.lineage_of` (docs/dagster.md, "Materialization metadata")."""
    lineage = lineage_of(result)
    rows = [
        f"| {p.stream} | {p.epoch} | [{p.start}, {p.end}) | {p.records} | {p.status} | "
        f"{'' if p.range_id is None else p.range_id} | "
        f"{'' if p.offset_stored is None else p.offset_stored} | {p.output or ''} |"
        for p in lineage.pieces
    ]
    table = "\n".join(
        ["| stream | epoch | range | records | status | range id | stored offset | output |",
         "|---|---|---|---|---|---|---|---|", *rows]
    )
    return {
        "dagster/row_count": MetadataValue.int(lineage.records),
        "records": MetadataValue.int(lineage.records),
        "pipeline": MetadataValue.text(lineage.pipeline),
        "broker": MetadataValue.text(lineage.broker),
        "empty": MetadataValue.bool(lineage.empty),
        "ranges": MetadataValue.json(lineage.ranges),
        "outputs": MetadataValue.json(lineage.outputs()),
        "stored_offsets": MetadataValue.json(lineage.stored_offsets()),
        "ledger_range_ids": MetadataValue.json(lineage.range_ids()),
        "pieces": MetadataValue.json([p.to_dict() for p in lineage.pieces]),
        "batch": MetadataValue.md(table),
    }


def table_metadata(table: Mapping[str, Any]) -> dict[str, Any]:
    """A table sink's table after the batch (the sink's ``describe()``: no credentials)."""
    out: dict[str, Any] = {"streamledger/table": MetadataValue.json(dict(table))}
    if table.get("location"):
        out["dagster/uri"] = MetadataValue.text(str(table["location"]))
    return out


def lag_metadata(lag: Mapping[str, float]) -> dict[str, Any]:
    """Lag left after the batch (chunk timestamps; see :mod:`streamledger.dagster.freshness`)."""
    return {
        LAG_KEY: MetadataValue.float(max(lag.values(), default=0.0)),
        "lag_seconds_by_stream": MetadataValue.json(dict(lag)),
    }


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def check_window_order(
    client: Any,
    ledger: Any,
    *,
    source: PipelineSource,
    streams: Sequence[str],
    window_start: datetime,
    partition: str,
    first_window_start: datetime | None,
) -> None:
    """Refuse a window while offsets stamped before it are neither processed nor in flight.

    The ledger's live ranges (claimed, committed, lost) end where the pipeline continues; if that is
    below the first offset of the window, the gap belongs to earlier windows that were not run (or
    whose range failed). Without ledger history the pipeline begins at the first window of the
    partitions definition (``first_window_start``; ``None`` when it starts elsewhere, e.g. "first").
    """
    from streamledger.offsets import OffsetSpec

    def offset_at(stream: str, moment: datetime) -> int:
        return int(client.resolve_offset(stream, OffsetSpec.timestamp(_millis(moment))))

    pipeline = source.pipeline
    identity = source.identity(client)
    for stream in streams:
        found = ledger.position(pipeline, source.ref(identity, stream)).end
        if found is not None:
            end = found
        elif first_window_start is not None and first_window_start < window_start:
            end = offset_at(stream, first_window_start)
        else:
            continue
        begin = offset_at(stream, window_start)
        if end < begin:
            raise StreamBatchOrderError(
                f"stream {stream!r}: offsets [{end}, {begin}) were published before partition {partition} "
                f"and pipeline {pipeline!r} has not processed them; materialize the earlier partitions "
                "first (time windows run in order)"
            )


SPEC_LACKS: dict[str, str] = {}
"""Spec fields the asset factory deliberately does not take, each with the reason (it takes every
other field of :func:`~streamledger.batch.spec.spec_settings` by its own name, through
``**settings``; tests/unit/batch/test_spec_faces.py holds it to that)."""


def asset_spec(
    *,
    pipeline: str,
    output_root: str,
    windowed: bool,
    initial_position: Literal["first", "tail", "interval_start"] | int | None = None,
    catalog_given: bool = False,
    door: Door = Door.ASSET,
    **settings: Any,
) -> PipelineSpec:
    """The pipeline an asset runs, with the asset's defaults: a time-window asset starts at its first
    window (``initial_position="interval_start"``), any other at the stream's first offset.
    ``settings``: any other field of the spec a user sets (``stream``, ``fmt``, ``bound_by_interval``...;
    :func:`~streamledger.batch.spec.spec_settings`), the spec's default where left out.
    Validated here, when the definitions load, not at the first run."""
    unknown = sorted(set(settings) - set(spec_settings()) | set(settings) & set(SPEC_LACKS))
    if unknown:
        raise TypeError(f"pipeline {pipeline!r}: {', '.join(unknown)}: no setting of a pipeline spec "
                        f"an asset takes ({', '.join(spec_settings())})")
    default_position: Literal["first", "interval_start"] = "interval_start" if windowed else "first"
    return PipelineSpec(
        pipeline=pipeline, output_root=output_root,
        initial_position=initial_position if initial_position is not None else default_position,
        catalog_given=catalog_given, intervals=windowed, door=door, **settings,
    )


def build_stream_batch_asset(
    *,
    pipeline: str,
    output_root: str,
    key: AssetKey | str | Sequence[str] = "stream_batch",
    partitions_def: PartitionsDefinition[str] | None = None,
    initial_position: Literal["first", "tail", "interval_start"] | int | None = None,
    catalog_resource_key: str | None = None,
    broker_resource_key: str = DEFAULT_BROKER_KEY,
    ledger_resource_key: str = DEFAULT_LEDGER_KEY,
    spark_resource_key: str = DEFAULT_SPARK_KEY,
    group_name: str | None = None,
    description: str | None = None,
    tags: Mapping[str, str] | None = None,
    kinds: Sequence[str] | None = None,
    owners: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    automation_condition: AutomationCondition[Any] | None = None,
    freshness_policy: FreshnessPolicy | None = None,
    **settings: Any,
) -> AssetsDefinition:
    """An asset whose materialization is one bounded batch of ``pipeline`` (see the module docstring).

    :param pipeline: consumer reference; one pipeline per asset (two assets sharing one would split
        each other's ranges).
    :param output_root: directory (or URI Spark can write: ``file://``, ``s3a://``...) under which
        each range's files are written.
    :param super_stream: read every partition of this super stream; or give ``stream``.
    :param partitions_def: ``None`` (each run reads up to the committed tail), or a
        ``TimeWindowPartitionsDefinition`` (each partition reads its window, in order).
    :param initial_position: where a stream without history starts: ``"first"`` (default when
        unpartitioned), ``"interval_start"`` (default when partitioned), ``"tail"`` or an offset.
    :param settings: any other field of :class:`~streamledger.batch.spec.PipelineSpec` by its name,
        the spec's default where left out: ``stream``, ``fmt``, ``splits``, ``store_offset``,
        ``store_timeout``, ``on_data_loss``, ``broker_name``, ``heartbeat_interval``,
        ``claim_timeout``... ``max_offsets``: cap a new range at that many offsets per stream
        (bounded catch-up). ``bound_by_interval`` (time-window partitions only): pin each window's
        range to ``[first offset stamped at or after its start, first offset stamped at or after its
        end)``, the same however often and in whichever order windows run (no window order check);
        ``interval_grace``: seconds after a window's end after which an idle stream's end is its
        committed tail. A window whose end the broker has not passed fails its run
        (``IntervalNotReady``, nothing claimed): run it again later.
    :param sink: ``"directory"`` (default: a directory per range), ``"iceberg"`` or ``"delta"`` (one
        table commit per batch, see :mod:`streamledger.batch.sinks`); ``table``: Iceberg
        ``namespace.name`` / Delta location (the sink's default when ``None``).
    :param catalog_resource_key: Iceberg only: key of an :class:`IcebergCatalogResource` (default:
        the SQL catalog in the ledger's database).
    :param broker_resource_key: key of a :class:`StreamSourceResource` (any source URL: a RabbitMQ
        stream or super stream, a mewbase channel as ``stream``); likewise ledger / spark.
    :param kinds: replace the default kinds (``rabbitmq``, ``spark``, the format; give
        ``kinds=["mewbase", "spark", "parquet"]`` for a mewbase source); ``owners``,
        ``metadata`` (merged), ``automation_condition`` and ``freshness_policy`` go to the asset as is.
    """
    _check_partitions(pipeline, partitions_def)
    spec = asset_spec(
        pipeline=pipeline, output_root=output_root, windowed=partitions_def is not None,
        initial_position=initial_position, catalog_given=catalog_resource_key is not None, **settings,
    )
    problem = sink_library_problem(spec.sink)
    if problem is not None:  # one line now, as the component says it, not a traceback at the first run
        raise MissingExtra(f"pipeline {pipeline!r}: {problem}")
    return stream_batch_asset(
        spec, key=key, partitions_def=partitions_def, catalog_resource_key=catalog_resource_key,
        broker_resource_key=broker_resource_key, ledger_resource_key=ledger_resource_key,
        spark_resource_key=spark_resource_key, group_name=group_name, description=description, tags=tags,
        kinds=kinds, owners=owners, metadata=metadata, automation_condition=automation_condition,
        freshness_policy=freshness_policy,
    )


def _check_partitions(pipeline: str, partitions_def: PartitionsDefinition[str] | None) -> None:
    if partitions_def is not None and not isinstance(partitions_def, TimeWindowPartitionsDefinition):
        raise StreamledgerError(
            f"pipeline {pipeline!r}: partitions_def must be a TimeWindowPartitionsDefinition "
            f"(got {type(partitions_def).__name__}); time windows are mapped to offsets by chunk timestamps"
        )


def stream_batch_asset(
    spec: PipelineSpec,
    *,
    key: AssetKey | str | Sequence[str] = "stream_batch",
    partitions_def: PartitionsDefinition[str] | None = None,
    catalog_resource_key: str | None = None,
    broker_resource_key: str = DEFAULT_BROKER_KEY,
    ledger_resource_key: str = DEFAULT_LEDGER_KEY,
    spark_resource_key: str = DEFAULT_SPARK_KEY,
    group_name: str | None = None,
    description: str | None = None,
    tags: Mapping[str, str] | None = None,
    kinds: Sequence[str] | None = None,
    owners: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    automation_condition: AutomationCondition[Any] | None = None,
    freshness_policy: FreshnessPolicy | None = None,
) -> AssetsDefinition:
    """The asset of a :class:`~streamledger.batch.spec.PipelineSpec` (``asset_spec`` builds one with
    the asset's defaults; the component resolves its YAML into one); the other arguments are the
    asset's own, as for :func:`build_stream_batch_asset`."""
    pipeline, stream, super_stream = spec.pipeline, spec.stream, spec.super_stream
    output_root = spec.output_root
    _check_partitions(pipeline, partitions_def)
    windowed = partitions_def is not None
    if spec.intervals is not windowed:
        raise StreamledgerError(f"pipeline {pipeline!r}: the spec's intervals ({spec.intervals}) do not "
                                f"match the asset's partitions ({'time windows' if windowed else 'none'})")
    if (catalog_resource_key is not None) != spec.catalog_given:
        raise StreamledgerError(f"pipeline {pipeline!r}: catalog_resource_key goes with a spec whose catalog "
                                "is given at run time (catalog_given)")
    kind = spec.fmt if spec.sink == "directory" else spec.sink
    keys = {broker_resource_key, ledger_resource_key, spark_resource_key}
    if catalog_resource_key is not None:
        keys.add(catalog_resource_key)
    source = f"super stream {super_stream}" if super_stream else f"stream {stream}"
    first_window_start: datetime | None = None
    starts_at_window = spec.initial_position == "interval_start"
    if isinstance(partitions_def, TimeWindowPartitionsDefinition) and starts_at_window:
        first_window_start = partitions_def.start
    asset_key = AssetKey.from_coercible(key)
    # a pinned history begins at the first window, whichever window runs first (the operator: the
    # DAG's start date)
    origin = first_window_start if spec.bound_by_interval else None

    @asset(
        key=asset_key,
        partitions_def=partitions_def,
        required_resource_keys=keys,
        group_name=group_name,
        description=description
        or f"Bounded batches of {source} (pipeline {pipeline}) written as {spec.fmt} under {output_root}.",
        kinds=set(kinds) if kinds is not None else {"rabbitmq", "spark", kind},
        tags=dict(tags or {}),
        owners=list(owners) if owners else None,
        metadata={**(metadata or {}), "pipeline": pipeline, "source": source, "output_root": output_root},
        automation_condition=automation_condition,
        freshness_policy=freshness_policy,
    )
    def _stream_batch(context: AssetExecutionContext) -> MaterializeResult:  # type: ignore[type-arg]
        broker = getattr(context.resources, broker_resource_key)
        ledger = getattr(context.resources, ledger_resource_key).get_ledger()
        runner = getattr(context.resources, spark_resource_key).get_runner()
        catalog = None
        if catalog_resource_key is not None:
            catalog = getattr(context.resources, catalog_resource_key).catalog_properties()
        window = context.partition_time_window if windowed else None
        config = BatchConfig.for_run(spec, url=broker.connection_url(), catalog=catalog,
                                     interval_start=window.start if window else None,
                                     interval_end=window.end if window else None, origin=origin)
        run = run_id_for(context)
        context.log.info(
            "pipeline %s on %s: batch as %s/%s/%s try %d",
            pipeline, broker.describe(), run.dag_id, run.run_id, run.task_id, run.try_number,
        )
        with broker.get_client() as client:
            if config.interval_start is not None and not spec.bound_by_interval:  # pinned: any order
                source = PipelineSource(pipeline, config.url, stream=stream, super_stream=super_stream,
                                        broker_name=config.broker_name)
                check_window_order(
                    client, ledger, source=source, streams=source.streams(client),
                    window_start=config.interval_start, partition=context.partition_key,
                    first_window_start=first_window_start,
                )
            result = run_batch(
                config, run=run, ledger=ledger, broker=client, runner=runner,
                holder_alive=holder_alive(context.instance, context.run.run_id),
            )
            lag = lag_by_stream(client, lineage_of(result).ends().items())
        for p in result.partitions:
            context.log.info(
                "%s [%d, %d) %s: %d records, stored offset %s, output %s",
                p.stream, p.start, p.end, p.status, p.records, p.offset_stored, p.output,
            )
        extra: dict[str, Any] = {}
        if result.table is not None:
            extra = table_metadata(result.table)
            context.log.info("table %s", result.table)
        return MaterializeResult(metadata={**batch_metadata(result), **lag_metadata(lag), **extra})

    return _stream_batch
