"""``StreamBatchComponent``: a stream batch pipeline configured in a ``defs.yaml``, no Python needed.

The component is a thin YAML front to the factories (:func:`stream_batch_asset`, its YAML resolved
into a :class:`~streamledger.batch.spec.PipelineSpec` as the asset factory's keywords are,
:func:`build_ledger_audit_check`, :func:`build_partition_audit_check`,
:func:`build_stream_backlog_sensor`): it resolves the YAML, asks its translator for the asset's
spec, and calls them, so a component and a Python code location run the very same batch.

It is a ``StateBackedComponent``: the partitions of a super stream are discovered by
``dg utils refresh-defs-state`` (a broker call) and written to the component's state; loading the
code location only reads that state, so a location whose broker is down still loads, and a changed
partition count shows up after the next refresh. The state is informational (asset metadata): a
batch and the sensor always ask the broker for the current partitions when they run, so a partition
added since the refresh is read, never skipped.

Resources are the component's own, under keys derived from the pipeline (two components in one
project never share or clash on a resource). The broker URL is best given as ``broker_url_env``
(the name of an environment variable): it becomes an ``EnvVar``, resolved at run time and masked in
the UI, while ``{{ env.X }}`` templating would write the password into the resolved configuration.

``asset_attributes.automation_condition`` may use ``{{ backlog_above(n, max_lag_seconds=s) }}``:
:class:`~streamledger.dagster.automation.BacklogAbove` bound to this component's pipeline, broker
variable and ledger; the component then adds an automation sensor evaluated on the code server.
"""


import json
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from dagster import (
    AssetKey,
    AssetSpec,
    Definitions,
    EnvVar,
    FreshnessPolicy,
)
from dagster.components import (
    ComponentLoadContext,
    DefsStateConfig,
    DefsStateConfigArgs,
    Model,
    Resolvable,
    ResolvedDefsStateConfig,
    Resolver,
    Scaffolder,
    ScaffoldRequest,
    StateBackedComponent,
    scaffold_with,
)
from dagster.components.resolved.core_models import (
    DailyPartitionsDefinitionModel,
    HourlyPartitionsDefinitionModel,
    TimeWindowPartitionsDefinitionModel,
    WeeklyPartitionsDefinitionModel,
    resolve_partitions_def,
)
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from dagster_shared.serdes.objects.models.defs_state_info import DefsStateManagementType

from streamledger.batch.position import PipelineSource, source_problem
from streamledger.batch.rules import sink_library_problem
from streamledger.batch.spec import Door, PipelineSpec, SpecError, spec_default, spec_settings
from streamledger.dagster.assets import asset_spec, stream_batch_asset
from streamledger.dagster.checks import build_ledger_audit_check, build_partition_audit_check
from streamledger.dagster.resources import (
    IcebergCatalogResource,
    StreamLedgerResource,
    StreamSourceResource,
    StreamSparkResource,
)
from streamledger.dagster.sensors import build_stream_backlog_sensor
from streamledger.errors import StreamledgerError

__all__ = [
    "BacklogSensorModel",
    "FreshnessModel",
    "StreamBatchComponent",
    "StreamBatchScaffolder",
    "StreamBatchSource",
    "StreamBatchTranslator",
]


class ComponentConfigError(StreamledgerError):
    """A ``StreamBatchComponent``'s YAML cannot work (named field, never a secret)."""


@dataclass(frozen=True)
class StreamBatchSource:
    """What the translator sees: the pipeline, its source and the partitions discovered (if any)."""

    pipeline: str
    stream: str | None
    super_stream: str | None
    output_root: str
    fmt: str
    partitions: tuple[str, ...] | None  # None: not discovered yet (no refresh-defs-state)
    broker_url_env: str | None = None  # where the broker and the ledger are, for backlog_above
    ledger_url: str | None = None
    ledger_url_env: str | None = None
    sink: str = "directory"

    @property
    def name(self) -> str:
        return str(self.super_stream or self.stream)


def identifier(text: str) -> str:
    """``text`` as a Python identifier / asset key part (``orders-eu`` -> ``orders_eu``)."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return out if out and not out[0].isdigit() else f"_{out}"


class StreamBatchTranslator:
    """The asset's spec for a source; subclass and override ``get_asset_spec`` to change it in Python.

    The default: key ``<pipeline>`` (as an identifier), group ``streamledger``, kinds ``rabbitmq``,
    ``spark`` and the format (or the table sink: ``iceberg`` / ``delta``), and the discovered
    partitions as metadata. YAML ``asset_attributes`` are applied on top (with ``{{ pipeline }}``,
    ``{{ stream }}``, ``{{ super_stream }}`` usable).
    """

    def get_asset_spec(self, source: StreamBatchSource) -> AssetSpec:
        metadata: dict[str, Any] = {"streamledger/stream": source.name}
        description = (f"Bounded batches of {source.name} (pipeline {source.pipeline}) written as "
                       f"{source.fmt} under {source.output_root}.")
        if source.super_stream is not None:
            undiscovered = "not discovered (run: dg utils refresh-defs-state)"
            found = list(source.partitions) if source.partitions is not None else None
            metadata["streamledger/partitions"] = found if found is not None else undiscovered
            # in the description too, so `dg list defs` shows what the last refresh found
            description += f" Partitions at the last refresh: {', '.join(found) if found else undiscovered}."
        return AssetSpec(
            key=AssetKey(identifier(source.pipeline)),
            group_name="streamledger",
            kinds={"rabbitmq", "spark", source.fmt if source.sink == "directory" else source.sink},
            description=description,
            metadata=metadata,
        )


class BacklogSensorModel(Model, Resolvable):
    """The backlog sensor (unpartitioned assets only): request a batch when records wait."""

    enabled: bool = True
    min_backlog: int = 1
    minimum_interval_seconds: int = 30
    running: bool = False  # start it with the code location (else: turn it on in the UI)


class FreshnessModel(Model, Resolvable):
    """A ``FreshnessPolicy.time_window``: fail (warn) when no materialization in that many seconds."""

    fail_after_seconds: int
    warn_after_seconds: int | None = None


PartitionsField = Annotated[
    Any,
    Resolver(
        resolve_partitions_def,
        model_field_type=HourlyPartitionsDefinitionModel
        | DailyPartitionsDefinitionModel
        | WeeklyPartitionsDefinitionModel
        | TimeWindowPartitionsDefinitionModel
        | None,
        description="Time-window partitions: each partition reads its window of the stream, in order.",
    ),
]


def backlog_above_for(source: StreamBatchSource) -> Any:
    """``{{ backlog_above(min_backlog, max_lag_seconds=None) }}`` in ``asset_attributes``: a
    :class:`~streamledger.dagster.automation.BacklogAbove` on this component's pipeline and ledger,
    and-ed with "no run in progress" (templates have no ``&``/``~``), so one run at a time."""

    def backlog_above(min_backlog: int | None = None, max_lag_seconds: float | None = None) -> Any:
        from dagster import AutomationCondition

        from streamledger.dagster.automation import BacklogAbove

        if source.broker_url_env is None:
            raise ComponentConfigError(
                f"StreamBatchComponent(pipeline={source.pipeline!r}): backlog_above needs broker_url_env "
                "(the condition keeps the variable's name, never a URL)"
            )
        backlog = BacklogAbove(
            pipeline=source.pipeline, min_backlog=min_backlog, max_lag_seconds=max_lag_seconds,
            stream=source.stream, super_stream=source.super_stream, broker_url_env=source.broker_url_env,
            ledger_url=source.ledger_url, ledger_url_env=source.ledger_url_env,
        )
        return (backlog & ~AutomationCondition.in_progress()).with_label("backlog_above")

    return backlog_above


def _template_vars(source: StreamBatchSource) -> Mapping[str, Any]:
    return {"pipeline": source.pipeline, "stream": source.stream, "super_stream": source.super_stream,
            "source": source, "backlog_above": backlog_above_for(source)}


AssetAttributesField = Annotated[
    TranslationFn[StreamBatchSource] | None,
    TranslationFnResolver[StreamBatchSource](_template_vars),
]


def _state_defaults() -> DefsStateConfigArgs:
    # Discovery only when asked (dg utils refresh-defs-state), never as a side effect of a load.
    return DefsStateConfigArgs(management_type=DefsStateManagementType.LOCAL_FILESYSTEM, refresh_if_dev=False)


_D: dict[str, Any] = {name: spec_default(name) for name in spec_settings()}
"""The pipeline spec's defaults, which the component's fields take (it repeats none)."""

SPEC_LACKS: dict[str, str] = {}
"""Spec fields the component deliberately does not offer in its YAML, each with the reason (every
other field of :func:`~streamledger.batch.spec.spec_settings` is a field of the same name;
tests/unit/batch/test_spec_faces.py holds the component to it)."""

class StreamBatchScaffolder(Scaffolder[Any]):
    """``dg scaffold defs streamledger.dagster.StreamBatchComponent <path>``: a commented defs.yaml."""

    def scaffold(self, request: ScaffoldRequest[Any]) -> None:
        target = Path(request.target_path)
        target.mkdir(parents=True, exist_ok=True)
        (target / "defs.yaml").write_text(scaffold_yaml(request.type_name))


def scaffold_yaml(type_name: str) -> str:
    return textwrap.dedent(f"""\
        type: {type_name}

        attributes:
          # Consumer reference: the ledger's pipeline and the broker's offset name. One per component.
          pipeline: my-pipeline
          # Read every partition of a super stream ... (or one stream: `stream: my-stream`)
          super_stream: events
          # Where each range's files go: <output_root>/<pipeline>/<stream>/<start>-<end>/
          output_root: /var/tmp/streamledger/output
          # Name of the environment variable holding the broker URL (rabbitmq-stream://user:pass@host:5552/);
          # resolved at run time, never shown in the UI. Or `broker_url:` for a URL without a password.
          broker_url_env: STREAMLEDGER_RABBITMQ_URL
          # The SQL ledger; unset = $STREAMLEDGER_LEDGER_URL or SQLite under $STREAMLEDGER_HOME.
          # ledger_url_env: STREAMLEDGER_LEDGER_URL
          # Spark: an in-process local master, or Spark Connect (`spark_remote: sc://host:15002`).
          spark_master: local[2]
          # Land the ranges in a table: `sink: iceberg` (or delta), one table commit per batch.
          # sink: iceberg
          # table: lake.events            # Iceberg namespace.name / Delta location; unset = the default
          # Iceberg catalog (unset = a SQL catalog in the ledger's database); secrets from the environment:
          # catalog: {{type: rest, warehouse: my-warehouse}}
          # catalog_uri_env: ICEBERG_CATALOG_URI
          # catalog_credential_env: ICEBERG_CATALOG_CREDENTIAL
          # Cap each new range at this many offsets per stream (bounded catch-up); unset = up to the tail.
          # max_offsets: 100000
          # Time-window partitions (each reads its window, in order); then no backlog sensor.
          # partitions_def:
          #   type: daily
          #   start_date: "2026-01-01"
          # Asset key, group, kinds, tags, owners, automation condition ({{{{ pipeline }}}} is available).
          asset_attributes:
            key: "streams/{{{{ pipeline }}}}"
            group_name: streamledger
            # owners: ["team:data"]
            # automation_condition: "{{{{ automation_condition.on_cron('0 * * * *') }}}}"
            # or once 1000 records wait, one run at a time (max_lag_seconds=600: or 10 min behind):
            # automation_condition: "{{{{ backlog_above(1000, max_lag_seconds=600) }}}}"
          # Fail the asset's freshness when nothing was materialized for this long.
          # freshness:
          #   fail_after_seconds: 3600
          # Request a batch when at least min_backlog records wait (unpartitioned only).
          backlog_sensor:
            min_backlog: 1
            minimum_interval_seconds: 30
        """)


def uses_python_condition(condition: Any) -> bool:
    """Whether an automation condition tree holds a :class:`BacklogAbove` anywhere."""
    from streamledger.dagster.automation import BacklogAbove

    if condition is None:
        return False
    return isinstance(condition, BacklogAbove) or any(uses_python_condition(c) for c in condition.children)


@scaffold_with(StreamBatchScaffolder)
@dataclass
class StreamBatchComponent(StateBackedComponent, Resolvable):
    """Ledgered, exactly-once bounded batches of a RabbitMQ stream or super stream as a Dagster asset.

    Builds the asset, the ledger audit check (and one per time-window partition when partitioned),
    and the backlog sensor, with the same factories as Python code; see docs/dagster.md.
    """

    pipeline: str
    output_root: str
    super_stream: str | None = None
    stream: str | None = None
    broker_url: str | None = None
    broker_url_env: str | None = None
    ledger_url: str | None = None
    ledger_url_env: str | None = None
    spark_master: str = "local[2]"
    spark_remote: str | None = None
    spark_quick_start: bool = True
    spark_conf: dict[str, str] = field(default_factory=dict)
    max_offsets: int | None = _D["max_offsets"]
    initial_position: str | int | None = None  # the asset's: its first window, or the first offset
    fmt: str = _D["fmt"]
    splits: int = _D["splits"]
    store_offset: bool = _D["store_offset"]
    store_timeout: float = _D["store_timeout"]
    on_data_loss: Literal["fail", "record"] = _D["on_data_loss"]
    broker_name: str | None = _D["broker_name"]
    heartbeat_interval: float = _D["heartbeat_interval"]
    claim_timeout: float = _D["claim_timeout"]
    sink: Literal["directory", "iceberg", "delta"] = _D["sink"]
    table: str | None = _D["table"]
    bound_by_interval: bool = _D["bound_by_interval"]
    interval_grace: float = _D["interval_grace"]
    sql: str | None = _D["sql"]
    sql_file: str | None = _D["sql_file"]  # relative: to the directory the Dagster process runs in
    transform: str | None = None  # an import path "package.module:function" (YAML holds no callable)
    body_format: Literal["raw", "json"] = _D["body_format"]
    body_schema: str | None = _D["body_schema"]
    on_bad_record: Literal["fail", "null", "dead_letter"] = _D["on_bad_record"]
    catalog: dict[str, str] = field(default_factory=dict)
    catalog_uri_env: str | None = None
    catalog_credential_env: str | None = None
    partitions_def: PartitionsField = None
    asset_attributes: AssetAttributesField = None
    freshness: FreshnessModel | None = None
    audit_check: bool = True
    backlog_sensor: BacklogSensorModel | None = field(default_factory=BacklogSensorModel)
    defs_state: ResolvedDefsStateConfig = field(default_factory=_state_defaults)

    def __post_init__(self) -> None:
        who = f"StreamBatchComponent(pipeline={self.pipeline!r})"
        self.pipeline_spec(windowed=self.partitions_def is not None)  # the YAML's pipeline, validated
        problem = source_problem(self.pipeline, self.stream, self.super_stream, self.broker_url)
        if problem is not None:  # a broker URL in the YAML: its kind of log is known now
            raise ComponentConfigError(f"StreamBatchComponent: {problem}")
        if (self.broker_url is None) == (self.broker_url_env is None):
            raise ComponentConfigError(f"{who}: give exactly one of broker_url or broker_url_env")
        if self.ledger_url is not None and self.ledger_url_env is not None:
            raise ComponentConfigError(f"{who}: give at most one of ledger_url or ledger_url_env")

    def pipeline_spec(self, *, windowed: bool) -> PipelineSpec:
        """The YAML resolved into the pipeline it describes (one record, validated where every front
        door's is: :class:`~streamledger.batch.spec.PipelineSpec`)."""
        settings = {name: getattr(self, name) for name in spec_settings() if name not in SPEC_LACKS}
        try:
            spec = asset_spec(**settings, windowed=windowed, catalog_given=self.has_catalog,
                              door=Door.COMPONENT)
        except SpecError as exc:
            raise ComponentConfigError(f"StreamBatchComponent: {exc}") from exc
        problem = sink_library_problem(spec.sink)
        if problem is not None:  # one line now, not a traceback at the first run
            raise ComponentConfigError(f"StreamBatchComponent(pipeline={self.pipeline!r}): {problem}")
        return spec

    @property
    def has_catalog(self) -> bool:
        return bool(self.catalog or self.catalog_uri_env or self.catalog_credential_env)

    def catalog_resource(self) -> IcebergCatalogResource:
        """The Iceberg catalog; ``*_env`` fields become ``EnvVar``s (resolved at run time, masked)."""
        uri: Any = EnvVar(self.catalog_uri_env) if self.catalog_uri_env else None
        credential: Any = EnvVar(self.catalog_credential_env) if self.catalog_credential_env else None
        return IcebergCatalogResource(properties=dict(self.catalog), uri=uri, credential=credential)

    # -- state: the super stream's partitions -------------------------------------------------------

    @property
    def defs_state_config(self) -> DefsStateConfig:
        key = f"StreamBatchComponent[{self.pipeline}]"
        return DefsStateConfig.from_args(self.defs_state, default_key=key)

    def broker_resource(self) -> StreamSourceResource:
        url: Any = EnvVar(self.broker_url_env) if self.broker_url_env else self.broker_url
        return StreamSourceResource(url=url)

    def write_state_to_path(self, state_path: Path) -> None:
        """Discovery (``dg utils refresh-defs-state``): the only broker call outside a run or tick."""
        import os

        url = os.environ.get(self.broker_url_env, "") if self.broker_url_env else str(self.broker_url)
        if not url:
            raise ComponentConfigError(
                f"StreamBatchComponent(pipeline={self.pipeline!r}): ${self.broker_url_env} is not set"
            )
        streams: list[str]
        source = PipelineSource(self.pipeline, url, stream=self.stream, super_stream=self.super_stream)
        with StreamSourceResource(url=url).get_client() as client:
            streams = source.streams(client)
        state = {"streams": streams, "discovered_at": datetime.now(UTC).isoformat(timespec="seconds")}
        state_path.write_text(json.dumps(state))

    @staticmethod
    def read_state(state_path: Path | None) -> tuple[str, ...] | None:
        if state_path is None or not Path(state_path).exists():
            return None
        return tuple(json.loads(Path(state_path).read_text())["streams"])

    # -- definitions ---------------------------------------------------------------------------------

    @property
    def translator(self) -> StreamBatchTranslator:
        return StreamBatchTranslator()

    def get_asset_spec(self, source: StreamBatchSource) -> AssetSpec:
        """The translator's spec with the YAML ``asset_attributes`` applied."""
        spec = self.translator.get_asset_spec(source)
        return self.asset_attributes(spec, source) if self.asset_attributes else spec

    def resource_keys(self) -> dict[str, str]:
        base = f"streamledger_{identifier(self.pipeline)}"
        return {"broker": f"{base}_rabbitmq", "ledger": f"{base}_ledger", "spark": f"{base}_spark",
                "catalog": f"{base}_catalog"}

    def build_defs_from_state(self, context: ComponentLoadContext, state_path: Path | None) -> Definitions:
        source = StreamBatchSource(
            pipeline=self.pipeline, stream=self.stream, super_stream=self.super_stream,
            output_root=self.output_root, fmt=self.fmt, partitions=self.read_state(state_path),
            broker_url_env=self.broker_url_env, ledger_url=self.ledger_url,
            ledger_url_env=self.ledger_url_env,
            sink=self.sink,
        )
        spec = self.get_asset_spec(source)
        keys = self.resource_keys()
        freshness = None
        if self.freshness is not None:
            warn = self.freshness.warn_after_seconds
            freshness = FreshnessPolicy.time_window(
                fail_window=timedelta(seconds=self.freshness.fail_after_seconds),
                warn_window=timedelta(seconds=warn) if warn is not None else None,
            )
        partitions_def = spec.partitions_def or self.partitions_def
        asset = stream_batch_asset(
            self.pipeline_spec(windowed=partitions_def is not None), key=spec.key,
            partitions_def=partitions_def,
            catalog_resource_key=keys["catalog"] if self.has_catalog else None,
            broker_resource_key=keys["broker"],
            ledger_resource_key=keys["ledger"], spark_resource_key=keys["spark"],
            group_name=spec.group_name, description=spec.description, tags=spec.tags,
            kinds=sorted(spec.kinds), owners=spec.owners, metadata=spec.metadata,
            automation_condition=spec.automation_condition,
            freshness_policy=freshness or spec.freshness_policy,
        )
        checks = []
        if self.audit_check:
            checks.append(build_ledger_audit_check(
                asset, pipeline=self.pipeline, broker_resource_key=keys["broker"],
                ledger_resource_key=keys["ledger"],
                catalog_resource_key=keys["catalog"] if self.has_catalog else None,
            ))
            if asset.partitions_def is not None:
                checks.append(build_partition_audit_check(
                    asset, pipeline=self.pipeline, broker_resource_key=keys["broker"],
                    ledger_resource_key=keys["ledger"],
                ))
        sensors = []
        sensor_cfg = self.backlog_sensor
        if sensor_cfg is not None and sensor_cfg.enabled and asset.partitions_def is None:
            from dagster import DefaultSensorStatus

            sensors.append(build_stream_backlog_sensor(
                asset, pipeline=self.pipeline, super_stream=self.super_stream, stream=self.stream,
                min_backlog=sensor_cfg.min_backlog,
                minimum_interval_seconds=sensor_cfg.minimum_interval_seconds,
                default_status=(
                    DefaultSensorStatus.RUNNING if sensor_cfg.running else DefaultSensorStatus.STOPPED
                ),
                broker_resource_key=keys["broker"], ledger_resource_key=keys["ledger"],
            ))
        if uses_python_condition(asset.automation_conditions_by_key.get(asset.key)):
            from dagster import AutomationConditionSensorDefinition

            # a Python condition (backlog_above) runs where the code is, not in the daemon
            sensors.append(AutomationConditionSensorDefinition(
                f"{asset.key.to_python_identifier()}_automation", target=[asset.key],
                use_user_code_server=True,
            ))
        ledger_url: Any = EnvVar(self.ledger_url_env) if self.ledger_url_env else self.ledger_url
        resources = {
            keys["broker"]: self.broker_resource(),
            keys["ledger"]: StreamLedgerResource(url=ledger_url),
            keys["spark"]: StreamSparkResource(
                master=self.spark_master, remote=self.spark_remote, conf=dict(self.spark_conf),
                quick_start=self.spark_quick_start,
            ),
        }
        if self.has_catalog:
            resources[keys["catalog"]] = self.catalog_resource()
        return Definitions(assets=[asset], asset_checks=checks, sensors=sensors, resources=resources)
