"""One pipeline spec: what a pipeline reads, where it writes and how it claims, validated once.

The Airflow operator, the Dagster asset factory and the Dagster component (its YAML resolves into
one) each build a :class:`PipelineSpec` when their definitions load; a run binds it to what only a
run knows (the broker URL, the data interval, the catalog's properties) and so gets a
:class:`~streamledger.batch.config.BatchConfig`, which *is* a spec. The rules themselves live one
room below (:mod:`streamledger.batch.rules`); this record is the one place that asks all of them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from streamledger.batch.rules import (
    absolute_location,
    catalog_problem,
    fmt_problem,
    initial_position_problem,
    on_data_loss_problem,
    placement_problem,
    sink_problem,
    source_problem,
    splits_problem,
)
from streamledger.errors import BatchError
from streamledger.fs import credentials_problem, redact
from streamledger.transform import Transform, TransformError

__all__ = ["FACE_SET", "Door", "InitialPosition", "PipelineSpec", "SpecError", "spec_default",
           "spec_settings"]

InitialPosition = Literal["first", "tail", "interval_start"] | int


class SpecError(BatchError, ValueError):
    """A pipeline's settings cannot work (one line naming the pipeline and the setting); a
    ``ValueError`` too, as Airflow expects of an operator refused when its DAG is parsed."""


class Door(enum.Enum):
    """Which front door built a spec. Only how a refusal names the settings depends on it: the
    operator's keywords (``stream=``), the setting that brings an Iceberg catalog."""

    PYTHON = "python"
    CLI = "cli"
    OPERATOR = "operator"
    ASSET = "asset"
    COMPONENT = "component"

    def catalog_problem(self, sink: str) -> str | None:
        """Why a catalog given through this door cannot be used with ``sink``, or None."""
        if self is Door.COMPONENT:
            return catalog_problem(sink, "catalog settings are", iceberg="sink: iceberg")
        given = {Door.OPERATOR: "catalog_conn_id is", Door.ASSET: "catalog_resource_key is"}
        return catalog_problem(sink, given.get(self, "catalog is"))


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSpec:
    """A pipeline as its definition states it.

    What it reads: ``pipeline`` (the ledger's history and the broker's consumer reference), one of
    ``stream`` / ``super_stream``, ``initial_position`` (where a partition without history starts),
    ``on_data_loss``, ``bound_by_interval`` (each range pinned to the run's data interval,
    ``interval_grace`` seconds for an idle stream's end). Where it writes: ``output_root``, ``fmt``,
    ``splits``, ``sink`` and ``table``; ``catalog_given`` says an Iceberg catalog's properties come
    at run time. How it claims: ``max_offsets`` (a new range's span in offsets), ``broker_name`` (the
    ledger's name for the broker; default the cluster's own), ``heartbeat_interval`` /
    ``claim_timeout`` (a claim not renewed that long is abandoned), ``store_offset`` /
    ``store_timeout`` (the broker's stored offset follows the ledger).

    What runs between read and sink (:mod:`streamledger.transform`, per range): ``sql`` over the
    view ``records`` (or ``sql_file``, a file holding it), or ``transform`` (an import path
    ``"package.module:function"``, ``DataFrame -> DataFrame``; a callable where the job runs in this
    process); ``body_format="json"`` with ``body_schema`` (Spark DDL) decodes the body first, and
    ``on_bad_record`` (``fail``, ``null``, ``dead_letter``) says what a body that does not decode does.

    ``intervals`` says whether runs bring a data interval: True (time-window partitions), False
    (never), None (known only when a run starts). ``door`` names the front door, for the wording
    of a refusal only.
    """

    pipeline: str
    output_root: str
    stream: str | None = None
    super_stream: str | None = None
    initial_position: InitialPosition = "first"
    fmt: str = "parquet"
    splits: int = 1
    store_offset: bool = True
    store_timeout: float = 10.0
    on_data_loss: Literal["fail", "record"] = "fail"
    max_offsets: int | None = None
    broker_name: str | None = None
    heartbeat_interval: float = 30.0
    claim_timeout: float = 600.0
    sink: Literal["directory", "iceberg", "delta"] = "directory"
    table: str | None = None
    catalog_given: bool = False
    bound_by_interval: bool = False
    interval_grace: float = 60.0
    intervals: bool | None = None
    sql: str | None = None
    sql_file: str | None = None
    transform: str | Callable[[Any], Any] | None = None
    body_format: Literal["raw", "json"] = "raw"
    body_schema: str | None = None
    on_bad_record: Literal["fail", "null", "dead_letter"] = "fail"
    door: Door = field(default=Door.PYTHON, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_root", absolute_location(self.output_root))
        if self.sink == "delta" and self.table is not None:  # a location, as the root
            object.__setattr__(self, "table", absolute_location(self.table))
        problem = self.problem()
        if problem is not None:
            raise SpecError(problem)

    def problem(self) -> str | None:
        """Why this spec cannot work, or None: every rule of :mod:`streamledger.batch.rules`, asked
        once, in the order a user fixes them."""
        problem = source_problem(self.pipeline, self.stream, self.super_stream,
                                 keywords=self.door is Door.OPERATOR)
        if problem is not None:
            return problem
        name = f"pipeline {self.pipeline!r}"
        if self.max_offsets is not None and self.max_offsets < 1:
            return f"{name}: max_offsets must be >= 1, got {self.max_offsets}"
        problem = (splits_problem(self.splits) or on_data_loss_problem(self.on_data_loss)
                   or self._claim_problem() or initial_position_problem(self.initial_position)
                   or fmt_problem(self.fmt) or self._sink_problem() or self._interval_problem()
                   or self._transform_problem())
        return None if problem is None else f"{name}: {problem}"

    def _transform_problem(self) -> str | None:
        if self.sql is not None and self.sql_file is not None:
            return "give sql or sql_file, not both"
        try:
            made = self.transformation()
        except TransformError as exc:
            return str(exc)
        if made is not None and self.sink != "directory" and self.fmt != "parquet":
            return f"a {self.sink} table takes Parquet files; a transform's format must be parquet"
        return None if made is None else made.problem()

    @property
    def transformed(self) -> bool:
        """Whether anything runs between read and sink (asked without reading ``sql_file``)."""
        return (self.sql is not None or self.sql_file is not None or self.transform is not None
                or self.body_format != "raw")

    def transformation(self) -> Transform | None:
        """What runs between read and sink (``sql_file`` read here), or None for raw records."""
        sql = self.sql
        if self.sql_file is not None:
            try:
                sql = Path(self.sql_file).read_text()
            except OSError as exc:
                raise TransformError(f"sql_file {self.sql_file!r} cannot be read: "
                                     f"{exc.strerror or exc}") from None
        made = Transform(sql=sql, function=self.transform, body_format=self.body_format,
                         body_schema=self.body_schema, on_bad_record=self.on_bad_record)
        return made if made.active or made.problem() else None

    def _claim_problem(self) -> str | None:
        if self.heartbeat_interval <= 0 or self.claim_timeout <= self.heartbeat_interval:
            return (f"need 0 < heartbeat_interval ({self.heartbeat_interval}) < claim_timeout "
                    f"({self.claim_timeout})")
        return None

    def _sink_problem(self) -> str | None:
        problem = (sink_problem(self.sink, self.table, None, self.fmt)
                   or placement_problem(self.output_root, self.sink, self.table))
        if problem is None and self.catalog_given:
            problem = self.door.catalog_problem(self.sink)
        where = credentials_problem(self.output_root)
        if problem is None and where is not None:
            problem = f"output root {redact(self.output_root)}: {where}"
        return problem

    def _interval_problem(self) -> str | None:
        if self.intervals is False and self.initial_position == "interval_start":
            return "initial_position 'interval_start' needs an interval"
        if self.intervals is False and self.bound_by_interval:
            return "bound_by_interval needs the data interval (interval_start/end)"
        if self.bound_by_interval and self.max_offsets is not None:
            return "bound_by_interval pins each range to its interval; max_offsets cannot split it"
        if self.bound_by_interval and self.interval_grace < 0:
            return f"interval_grace must be >= 0 seconds, got {self.interval_grace}"
        return None

    def settings(self) -> dict[str, Any]:
        """The spec's fields by name (what a run's configuration starts from)."""
        return {f.name: getattr(self, f.name) for f in fields(PipelineSpec)}



FACE_SET: dict[str, str] = {
    "door": "which face built the spec: each face names itself",
    "intervals": "whether runs bring a data interval: known from the face (time-window partitions, "
                 "a DAG's data interval, --interval-start)",
    "catalog_given": "an Iceberg catalog's properties come at run time through the face's own "
                     "setting (a connection, a resource, YAML catalog settings, --catalog)",
}
"""The spec's fields a face sets itself, from what it knows, instead of offering them as settings."""


def spec_settings() -> tuple[str, ...]:
    """The spec's fields a user sets (every field but :data:`FACE_SET`), in declaration order: what
    every face offers, each under its own name (tests/unit/batch/test_spec_faces.py holds
    every face to it)."""
    return tuple(f.name for f in fields(PipelineSpec) if f.name not in FACE_SET)


def spec_default(name: str) -> Any:
    """The spec's default for field ``name`` (a face repeats no default; a required field has none:
    ``dataclasses.MISSING``)."""
    (found,) = (f for f in fields(PipelineSpec) if f.name == name)
    return found.default
