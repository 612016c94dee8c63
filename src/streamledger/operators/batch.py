"""``StreamBatchOperator``: one bounded, ledgered batch of a stream or super stream per task run.

The operator only adapts Airflow to :mod:`streamledger.batch` (read that module's docstring for the
exact delivery semantics): it resolves connections, takes the run identity and the data interval
from the task context, picks the Spark runner, and publishes the result as an XCom and as Asset
events whose ``extra`` holds the ranges.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowSkipException

from streamledger.batch import (
    BatchConfig,
    BatchError,
    BatchResult,
    IntervalNotReady,
    JobRunner,
    RunId,
    StepHook,
    run_batch,
    summarize,
)
from streamledger.batch.lineage import lineage_of
from streamledger.batch.spec import Door, PipelineSpec, SpecError, spec_default, spec_settings
from streamledger.home import state_dir
from streamledger.hooks.ledger import OffsetLedgerHook
from streamledger.hooks.masking import MaskRenderedUrls, mask_url
from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook
from streamledger.hooks.source import source_hook
from streamledger.manifest import Manifest
from streamledger.spark.runners import (
    SparkConnectRunner,
    SubmitRunner,
    connect_runner,
    job_arguments,
    job_environment,
    local_runner,
    runner_for,
)
from streamledger.transform import Transform

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from streamledger.transform import Transform

__all__ = [
    "SparkConnectRunner", "SparkSubmitRunner", "StreamBatchOperator",
    "connect_runner", "default_output_root", "local_runner", "run_identity",
]

_D: dict[str, Any] = {name: spec_default(name) for name in spec_settings()}
"""The pipeline spec's defaults, which the operator's keywords take (it repeats none)."""

SPEC_LACKS: dict[str, str] = {}
"""Spec fields ``StreamBatchOperator`` deliberately does not take as keywords, each with the reason
(every other field of :func:`~streamledger.batch.spec.spec_settings` is a keyword of the same name;
tests/unit/batch/test_spec_faces.py holds the operator to it)."""

_RAW = ("pipeline", "stream", "super_stream")
"""Templated spec fields checked as given, even before rendering (the rest stand at the spec's
default until rendered)."""


def default_output_root() -> str:
    return os.path.join(state_dir(), "output")


class SparkSubmitRunner(SubmitRunner):
    """Runs the job with the apache-spark provider's ``SparkSubmitHook`` (a Spark cluster or local).

    Only the Airflow part lives here (the hook, the connection's deploy mode, masking); the job's
    arguments and the URL file are :class:`streamledger.spark.runners.SubmitRunner`'s. Environment
    variables are no way to carry the URL: on YARN and Kubernetes the hook turns them into
    ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` arguments, which the
    process list and the logged spark-submit command show. In cluster deploy mode the driver runs
    elsewhere, so the URL file is shipped with ``--files`` (docs/airflow.md, "Secrets").
    """

    def __init__(self, conn_id: str, *, conf: Mapping[str, str] | None = None, name: str = "streamledger",
                 submit_kwargs: Mapping[str, Any] | None = None) -> None:
        self.conn_id = conn_id
        self.conf = dict(conf or {})
        self.name = name
        self.submit_kwargs = dict(submit_kwargs or {})
        self._hook: Any = None

    def cancel(self) -> None:
        """Kill the running spark-submit (and, on a cluster, the driver), via the hook's ``on_kill``."""
        if self._hook is not None:
            self._hook.on_kill()

    def deploy_mode(self) -> str | None:
        """The deploy mode as the hook resolves it: ``deploy_mode`` given, else the connection's
        extra ``deploy-mode``."""
        if self.submit_kwargs.get("deploy_mode"):
            return str(self.submit_kwargs["deploy_mode"])
        from airflow.sdk import BaseHook

        mode = BaseHook.get_connection(self.conn_id).extra_dejson.get("deploy-mode")
        return str(mode) if mode else None

    def hook(self, url_file: Path, *, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str,
             splits: int) -> Any:
        """The ``SparkSubmitHook`` for one run whose URL is in ``url_file``."""
        return self._hook_for(url_file, job_arguments(url_file, ranges=ranges, output=output, fmt=fmt,
                                                      splits=splits))

    def _hook_for(self, url_file: Path, args: list[str]) -> Any:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        kwargs = dict(self.submit_kwargs)
        if self.deploy_mode() == "cluster":
            kwargs["files"] = ",".join(f for f in (kwargs.get("files"), str(url_file)) if f)
        return SparkSubmitHook(conn_id=self.conn_id, conf=self.conf, name=self.name, application_args=args,
                               env_vars=job_environment(), **kwargs)

    def __call__(self, *, url: str, ranges: Mapping[str, tuple[int, int]], output: str, fmt: str,
                 splits: int, transform: Transform | None = None) -> Manifest:
        mask_url(url)  # spark-submit's own output is logged line by line
        return super().__call__(url=url, ranges=ranges, output=output, fmt=fmt, splits=splits,
                                transform=transform)

    def submit(self, application: str, url_file: Path, args: list[str]) -> None:
        self._hook = self._hook_for(url_file, args)
        try:
            self._hook.submit(application=application)
        finally:
            self._hook = None


_ANY_QUERY = "SELECT * FROM records"
"""What an SQL setting stands for until its template or file is rendered (at execute)."""


def _names_a_file(value: str) -> bool:
    """A ``sql_file`` value that still names a file (an absolute path Airflow's template loader does
    not render): the spec reads it; a rendered value is the query itself."""
    from pathlib import Path

    return "\n" not in value and value.strip().endswith(".sql") and Path(value.strip()).is_absolute() \
        and Path(value.strip()).is_file()


def _pending(value: Any) -> bool:
    """Whether ``value`` is still a template (rendered only when the task runs)."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


_ALIVE_STATES = ["scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule",
                 "restarting"]


def _task_alive(ti: Any, holder: RunId) -> bool:
    """Whether the task instance that holds a claim may still run (asked through the Task SDK)."""
    count = ti.get_ti_count(
        dag_id=holder.dag_id, map_index=holder.map_index, task_ids=[holder.task_id],
        run_ids=[holder.run_id], states=_ALIVE_STATES,
    )
    return bool(count)


PARTITION_KEY_FORMAT = "%Y-%m-%dT%H:%M:%S"
"""Airflow's own partition-key format (``CronPartitionTimetable``, the temporal partition mappers)."""


def _partition_key(context: Context) -> str | None:
    """The run's partition: its own ``partition_key`` when the run has one (a partitioned
    timetable), else its data interval's start in UTC, in Airflow's key format."""
    run = context.get("dag_run")
    own = getattr(run, "partition_key", None)
    if own:
        return str(own)
    start = context.get("data_interval_start")
    return None if start is None else start.astimezone(UTC).strftime(PARTITION_KEY_FORMAT)


def run_identity(ti: Any) -> RunId:
    """The ledger identity of a task instance: dag, run, task, map index and try.

    Map index 0 is a real mapped instance; only a missing index (``None``) means "not mapped" (-1).
    """
    map_index = getattr(ti, "map_index", None)
    return RunId(ti.dag_id, ti.run_id, ti.task_id, -1 if map_index is None else int(map_index),
                 int(ti.try_number or 1))


class StreamBatchOperator(MaskRenderedUrls, BaseOperator):
    """Process the next offset range of every partition of a stream or super stream, exactly once.

    :param pipeline: consumer reference (<= 256 chars): names the ledger history and the broker's
        stored offset. Templated. Or a whole :class:`~streamledger.batch.spec.PipelineSpec`: its
        fields instead of the keywords of the same names below, which then stay unset.
    :param stream: a single stream. Templated. Give this or ``super_stream``.
    :param super_stream: a super stream; every partition gets its own range. Templated.
    :param rabbitmq_stream_conn_id: the source connection (default ``rabbitmq_stream_default``): type
        ``rabbitmq_stream`` (a stream or super stream) or ``mewbase`` (a mewbase channel, given as
        ``stream``; super streams are RabbitMQ's), see :mod:`streamledger.hooks.source`.
    :param ledger_conn_id: ledger connection; ``None`` uses ``ledger_url`` or the default SQLite file.
    :param ledger_url: SQLAlchemy URL of the ledger (wins over the connection). Templated.
    :param output_root: where range directories go (``<root>/<pipeline>/<broker>/<stream>/<start>-<end>``,
        each name one escaped component); default ``$STREAMLEDGER_HOME/output``. Templated.
        A path or a URI Spark can write (``file://``, ``hdfs://``, ``s3a://``, ``gs://``; docs/ledger.md).
    :param initial_position: where a partition without ledger or broker history starts:
        ``"first"`` (default), ``"tail"``, ``"interval_start"`` (the data interval's start,
        resolved by timestamp) or an offset.
    :param bound_by_interval: pin each partition's range to the run's data interval: ``[first offset
        stamped at or after its start, first offset stamped at or after its end)``, the same whichever
        run goes first and however often it is rerun, so backfills may run intervals in parallel
        (``max_active_runs`` > 1). Until the broker's committed tail has passed the interval end the
        task *defers* (a ``DateTimeTrigger``, re-checked every ``interval_poll`` seconds, at most until
        the end plus ``interval_grace``: on an idle stream the end is then the committed tail). With
        ``initial_position="interval_start"`` the pipeline's history begins at the DAG's start date.
        Default ``False``: read up to the committed tail.
    :param interval_grace: seconds after the interval end after which an idle stream's end is its
        committed tail (default 60). :param interval_poll: seconds between readiness checks (default 10).
    :param max_offsets: cap each new range at this many offsets (default: no cap; ``max_records`` is its
        deprecated former name, still accepted).
    :param broker_name: the ledger's name for the broker (default: the cluster's own name).
    :param heartbeat_interval: seconds between renewals of the task's claims (default 30);
        ``claim_timeout``: a claim not renewed that long is abandoned, others may take it (default 600).
    :param store_timeout: seconds to store and verify the broker's offset (default 10).
    :param fmt: output format (``parquet``, ``orc``, ``json``). :param splits: Spark partitions per range.
    :param spark_conn_id: when given, run the job through ``SparkSubmitHook`` on this Spark
        connection; default ``None`` runs in-process local Spark (``spark_master``, ``local[2]``).
    :param spark_conf: extra Spark configuration.
    :param spark_connect_conn_id: when given, run the job on the Spark Connect server of this
        connection (the apache-spark provider's ``spark_connect`` type; ``sc://host:port``): the warm
        data plane, no JVM start per task. Excludes ``spark_conn_id``.
    :param skip_on_empty: mark the task *skipped* when every range is empty (default: succeed as a no-op).
    :param store_offset: store and verify the broker offset after commit (default ``True``).
    :param on_data_loss: when retention already removed offsets the pipeline has not read:
        ``"fail"`` (default, the task fails naming the span) or ``"record"`` (the span is recorded as
        ``lost`` in the ledger, visible in the audit, and reading goes on from the first retained offset).
    :param sink: what publishing a committed range means: ``"directory"`` (default, a directory per
        range), ``"iceberg"`` or ``"delta"`` (one table commit per batch; ``streamledger.batch.sinks``).
    :param table: Iceberg ``namespace.name`` (default ``streamledger.<pipeline>``) or the Delta
        table's location (default ``<output_root>/<pipeline>``). Templated.
    :param sql: Spark SQL over the view ``records`` run on each range between read and sink
        (docs/transforms.md); a value ending in ``.sql`` is a file, rendered as a template. Templated.
    :param sql_file: a ``.sql`` file holding the query (relative to the DAG folder or
        ``template_searchpath``), rendered as a Jinja template like the SQL operators' files.
    :param transform: instead of SQL, a function ``DataFrame -> DataFrame`` as an import path
        ``"package.module:function"`` (a callable where the job runs in the task's process).
    :param body_format: ``"raw"`` (default) or ``"json"``: decode each body with ``body_schema``
        (Spark DDL) first; ``on_bad_record``: ``"fail"`` (default), ``"null"`` or ``"dead_letter"``.
    :param catalog_conn_id: Iceberg only: a connection whose extra JSON is the pyiceberg catalog's
        properties (REST, Glue, Hive, SQL...), every secret in it masked; default: a SQL catalog in
        the ledger's own database. The properties never become a template field.

    Templated: ``pipeline``, ``stream``, ``super_stream``, the connection ids, ``ledger_url``,
    ``output_root``, ``initial_position``, ``max_offsets`` (and ``max_records``), ``spark_conn_id``,
    ``spark_conf``, ``on_data_loss``, ``sink`` and ``table`` (checked again once rendered). Mapped tasks
    (``.partial(...).expand(stream=...)``, one task per super-stream partition) each claim under
    their own map index. ``on_kill`` cancels the Spark work in progress; with the OpenLineage
    provider installed the task reports its input partitions (offset ranges as a facet) and output
    directories, or, with a table sink, the table (named by its location as the Iceberg and Delta
    integrations do, the catalog name as a symlink).
    """

    template_fields: Sequence[str] = (
        "pipeline", "stream", "super_stream", "rabbitmq_stream_conn_id", "ledger_conn_id", "ledger_url",
        "output_root", "initial_position", "max_offsets", "max_records", "spark_conn_id", "spark_conf",
        "on_data_loss", "sink", "table", "catalog_conn_id", "sql", "sql_file", "body_schema",
    )
    template_ext: Sequence[str] = (".sql",)  # sql / sql_file naming a .sql file: its text, rendered
    template_fields_renderers = {"spark_conf": "json", "sql": "sql", "sql_file": "sql"}
    ui_color = "#ffedd5"

    def __init__(
        self,
        *,
        pipeline: str | PipelineSpec,
        stream: str | None = None,
        super_stream: str | None = None,
        rabbitmq_stream_conn_id: str = RabbitMQStreamHook.default_conn_name,
        ledger_conn_id: str | None = None,
        ledger_url: str | None = None,
        output_root: str | None = None,
        initial_position: str | int = _D["initial_position"],
        bound_by_interval: bool = _D["bound_by_interval"],
        max_records: int | str | None = None,
        max_offsets: int | str | None = _D["max_offsets"],
        fmt: str = _D["fmt"],
        splits: int = _D["splits"],
        spark_conn_id: str | None = None,
        spark_master: str = "local[2]",
        spark_conf: Mapping[str, str] | None = None,
        skip_on_empty: bool = False,
        store_offset: bool = _D["store_offset"],
        on_data_loss: str = _D["on_data_loss"],
        spark_connect_conn_id: str | None = None,
        interval_grace: float = _D["interval_grace"],
        interval_poll: float = 10.0,
        sink: str = _D["sink"],
        table: str | None = _D["table"],
        catalog_conn_id: str | None = None,
        broker_name: str | None = _D["broker_name"],
        heartbeat_interval: float = _D["heartbeat_interval"],
        claim_timeout: float = _D["claim_timeout"],
        store_timeout: float = _D["store_timeout"],
        sql: str | None = _D["sql"],
        sql_file: str | None = _D["sql_file"],
        transform: str | Callable[[Any], Any] | None = _D["transform"],
        body_format: str = _D["body_format"],
        body_schema: str | None = _D["body_schema"],
        on_bad_record: str = _D["on_bad_record"],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        declared = pipeline if isinstance(pipeline, PipelineSpec) else None
        self.pipeline = pipeline.pipeline if isinstance(pipeline, PipelineSpec) else pipeline
        self.stream = stream
        self.super_stream = super_stream
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.output_root = output_root
        self.initial_position = initial_position
        self.bound_by_interval = bound_by_interval
        self.interval_grace = interval_grace
        self.interval_poll = interval_poll
        self.max_records = max_records  # the old, misleading name of max_offsets
        self.max_offsets = max_offsets
        self.fmt = fmt
        self.splits = splits
        self.spark_conn_id = spark_conn_id
        self.spark_master = spark_master
        self.spark_conf = dict(spark_conf or {})
        self.skip_on_empty = skip_on_empty
        self.store_offset = store_offset
        self.on_data_loss = on_data_loss
        if spark_conn_id and spark_connect_conn_id:
            raise ValueError(f"{self.task_id}: give spark_conn_id or spark_connect_conn_id, not both")
        self.spark_connect_conn_id = spark_connect_conn_id
        self.sink = sink
        self.table = table
        self.catalog_conn_id = catalog_conn_id
        self.broker_name = broker_name
        self.heartbeat_interval = heartbeat_interval
        self.claim_timeout = claim_timeout
        self.store_timeout = store_timeout
        self.sql = sql
        self.sql_file = sql_file
        if sql_file is not None and not sql_file.endswith(".sql"):
            raise ValueError(f"{self.task_id}: sql_file must name a .sql file (rendered as a template, "
                             f"relative to the DAG folder or template_searchpath), got {sql_file!r}")
        self.transform = transform
        self.body_format = body_format
        self.body_schema = body_schema
        self.on_bad_record = on_bad_record
        self._catalog: dict[str, str] | None = None
        self.on_step: StepHook | None = None  # tests only (a cluster policy may set it)
        self._runner_in_use: Any = None
        self._result: BatchResult | None = None
        if declared is not None:
            self._take(declared)
        self._validate(rendered=False)

    def _take(self, spec: PipelineSpec) -> None:
        """The settings of a spec given as ``pipeline=``; the keywords it holds stay unset."""
        flat = [name for name in spec_settings() if name not in (*SPEC_LACKS, "pipeline", "output_root")
                and getattr(self, name) != spec_default(name)]
        if flat or self.output_root is not None or self.max_records is not None:
            named = ", ".join(flat or ["output_root" if self.output_root is not None else "max_records"])
            raise ValueError(f"{self.task_id}: pipeline= is a PipelineSpec, which holds {named}: give "
                             "the pipeline's settings in the spec or as keywords, not both")
        for name in spec_settings():
            if name not in SPEC_LACKS:
                setattr(self, name, getattr(spec, name))

    def _validate(self, *, rendered: bool) -> None:
        """Check the arguments at DAG parse time (templated values are checked once rendered, at execute)."""
        self._spec(rendered=rendered)

    def _cap(self, *, rendered: bool) -> int | None:
        """``max_offsets`` (or its deprecated name ``max_records``) as rendered text turned into a number."""
        for name in ("max_offsets", "max_records"):
            value = getattr(self, name)
            if value in (None, "", "None") or (not rendered and _pending(value)):
                continue
            try:
                cap = int(value)
            except (TypeError, ValueError):
                cap = 0
            if cap < 1:
                raise ValueError(f"{self.task_id}: {name} must be a positive integer, got {value!r}")
            return cap
        return None

    def _spec(self, *, rendered: bool) -> PipelineSpec:
        """The pipeline this task runs (:class:`~streamledger.batch.spec.PipelineSpec`, where every rule is
        asked). Before rendering, a templated setting stands at its default until it is rendered."""
        if not self.pipeline:
            raise ValueError(f"{self.task_id}: pipeline is required")

        def given(name: str) -> Any:
            value = getattr(self, name)
            if rendered or name not in self.template_fields or name in _RAW or not _pending(value):
                return value
            default = spec_default(name)
            return None if default is MISSING else default

        settings = {name: given(name) for name in spec_settings() if name not in SPEC_LACKS}
        if settings.get("sql_file") is not None and not _names_a_file(settings["sql_file"]):
            # Airflow renders a .sql file into the field's value (template_ext): once rendered it is the
            # query itself; before, the file is not read here (it is found relative to the DAG folder).
            settings["sql"] = settings["sql_file"] if rendered else (settings["sql"] or _ANY_QUERY)
            settings["sql_file"] = None
        if not rendered and _pending(settings.get("sql")):
            settings["sql"] = _ANY_QUERY
        if isinstance(settings["initial_position"], str) and settings["initial_position"].isdigit():
            settings["initial_position"] = int(settings["initial_position"])
        try:
            return PipelineSpec(**{
                **settings, "stream": self.stream or None, "super_stream": self.super_stream or None,
                # the default root is made when a run needs it, not when the DAG is parsed
                "output_root": settings["output_root"] or (default_output_root() if rendered else "output"),
                "max_offsets": self._cap(rendered=rendered), "table": settings["table"] or None,
                "catalog_given": bool(self.catalog_conn_id)
                and (rendered or not _pending(self.catalog_conn_id)),
            }, door=Door.OPERATOR)
        except SpecError as exc:
            raise ValueError(f"{self.task_id}: {exc}") from exc

    def _runner(self) -> JobRunner:
        if self.spark_connect_conn_id:
            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            return runner_for(remote=SparkConnectHook(self.spark_connect_conn_id).get_connection_url())
        if self.spark_conn_id:
            return SparkSubmitRunner(
                self.spark_conn_id, conf=self.spark_conf, name=f"streamledger-{self.task_id}"
            )
        return runner_for(master=self.spark_master, conf=self.spark_conf)

    def _config(self, url: str, context: Context) -> BatchConfig:
        spec = self._spec(rendered=True)
        start: datetime | None = None
        end: datetime | None = None
        if spec.bound_by_interval or spec.initial_position == "interval_start":
            start, end = context.get("data_interval_start"), context.get("data_interval_end")
            if start is None or end is None:
                raise BatchError(f"{self.task_id}: this DAG run has no data interval to bound the batch by")
        origin = getattr(context.get("dag"), "start_date", None) if spec.bound_by_interval else None
        return BatchConfig.for_run(spec, url=url, interval_start=start, interval_end=end,
                                   catalog=self._catalog, origin=origin)

    def execute(self, context: Context) -> dict[str, Any]:
        self._validate(rendered=True)
        self._skip_a_repeated_announcement(context)
        broker_hook = source_hook(self.rabbitmq_stream_conn_id)
        url = broker_hook.get_url()
        self._catalog = None
        if self.catalog_conn_id:
            from streamledger.hooks.catalog import catalog_properties

            self._catalog = catalog_properties(self.catalog_conn_id)
        config = self._config(url, context)
        if self.bound_by_interval and config.interval_end is not None and config.interval_start is not None:
            self.log.info("data interval [%s, %s)", config.interval_start, config.interval_end)
        ti = context["ti"]
        run = run_identity(ti)
        ledger = OffsetLedgerHook(self.ledger_conn_id, ledger_url=self.ledger_url).get_conn()
        runner = self._runner()
        self._runner_in_use = runner
        try:
            with broker_hook.get_conn() as client:
                result = run_batch(config, run=run, ledger=ledger, broker=client, runner=runner,
                                   holder_alive=lambda holder: _task_alive(ti, holder),
                                   on_step=self.on_step)
        except IntervalNotReady as exc:
            self._wait_for_interval(exc)
            raise  # pragma: no cover - defer() raises TaskDeferred
        finally:
            self._runner_in_use = None
        self._result = result
        self.log.info("%s", summarize(result))
        if result.table is not None:
            self.log.info("table %s", result.table)
        self._emit_asset_events(context, result)
        if result.empty and self.skip_on_empty:
            raise AirflowSkipException(f"pipeline {self.pipeline}: no new offsets")
        return result.to_dict()

    def _skip_a_repeated_announcement(self, context: Context) -> None:
        """A run started only by announcements redelivered after a triggerer restart (their
        identity already triggered an earlier run) reads nothing: skipped before anything is
        claimed (:mod:`streamledger.triggers.redelivery`)."""
        from streamledger.triggers.redelivery import repeated_in_run

        repeats = repeated_in_run(context, self.pipeline)
        if repeats:
            said = ", ".join(f"{r.announcement} (first in asset event {r.original_event_id})"
                             for r in repeats)
            raise AirflowSkipException(f"pipeline {self.pipeline}: announcement {said} already delivered; "
                                       "this run repeats it after a triggerer restart and reads nothing")

    def _wait_for_interval(self, exc: IntervalNotReady) -> None:
        """Defer until the interval may be resolvable (the next poll, at the latest its ready-by
        time), freeing the worker slot; :meth:`resume` runs the batch again. Nothing was claimed."""
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        moment = min(exc.ready_by, datetime.now(UTC) + timedelta(seconds=self.interval_poll))
        self.log.info("%s: deferring until %s", exc, moment.isoformat())
        self.defer(trigger=DateTimeTrigger(moment), method_name="resume")

    def resume(self, context: Context, event: Any = None) -> dict[str, Any]:
        """After a deferral for a pinned interval that was not ready: run the batch again."""
        return self.execute(context)

    def on_kill(self) -> None:
        """Cancel the Spark work this task started (timeouts and kills call this; see module docs).

        Relies on the runner's ``cancel()``: the in-process runner interrupts its tagged Spark
        operations (classic or Spark Connect), the spark-submit runner kills the submit process. The
        claimed range stays ``claimed`` in the ledger; the retry (same identity) redoes it.
        """
        runner = self._runner_in_use
        cancel = getattr(runner, "cancel", None)
        if runner is None:
            self.log.info("pipeline %s: on_kill with no Spark work in progress", self.pipeline)
            return
        if not callable(cancel):
            self.log.warning("pipeline %s: the runner %s cannot cancel its Spark work", self.pipeline,
                             type(runner).__name__)
            return
        self.log.warning("pipeline %s: task killed, cancelling its Spark work", self.pipeline)
        cancel()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage | None:  # type: ignore[type-arg]
        """OpenLineage: the partitions read (with their offset ranges) and the directories written."""
        if self._result is None:
            return None
        from streamledger.operators.lineage import batch_lineage

        return batch_lineage(self._result, table=self._result.table, catalog=self._result.catalog)

    def _emit_asset_events(self, context: Context, result: BatchResult) -> None:
        """Attach the ranges to every outlet's Asset event (consumers see what was processed): every
        range of the batch, :func:`~streamledger.batch.lineage.lineage_of`'s JSON form."""
        if not self.outlets:
            return
        extra = lineage_of(result).to_dict()
        key = _partition_key(context) if self.bound_by_interval else None
        events = context["outlet_events"]
        for outlet in self.outlets:
            try:
                event = events[outlet]
                event.extra = extra
            except (KeyError, TypeError):  # not an Asset (e.g. an alias we do not own)
                self.log.debug("outlet %r takes no extra", outlet)
                continue
            add_partitions = getattr(event, "add_partitions", None)  # Airflow >= 3.3 (Task SDK 1.3)
            if key is not None and callable(add_partitions):
                try:
                    add_partitions(key)
                except TypeError:  # an asset alias: partition keys belong to concrete assets
                    self.log.debug("outlet %r takes no partition key", outlet)
