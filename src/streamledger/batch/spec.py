"""One pipeline spec: what a pipeline reads, where it writes and how it claims, validated once.

The Airflow operator, the Dagster asset factory and the Dagster component (its YAML resolves into
one) each build a :class:`PipelineSpec` when their definitions load; a run binds it to what only a
run knows (the broker URL, the data interval, the catalog's properties) and so gets a
:class:`~streamledger.batch.config.BatchConfig`, which *is* a spec. The rules themselves live one
room below (:mod:`streamledger.batch.rules`); this record is the one place that asks all of them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
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

__all__ = ["Door", "InitialPosition", "PipelineSpec", "SpecError"]

InitialPosition = Literal["first", "tail", "interval_start"] | int


class SpecError(BatchError, ValueError):
    """A pipeline's settings cannot work (one line naming the pipeline and the setting); a
    ``ValueError`` too, as Airflow expects of an operator refused when its DAG is parsed."""


class Door(enum.Enum):
    """Which front door built a spec. Only how a refusal names the settings depends on it: the
    operator's keywords (``stream=``), the setting that brings an Iceberg catalog."""

    PYTHON = "python"
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
                   or fmt_problem(self.fmt) or self._sink_problem() or self._interval_problem())
        return None if problem is None else f"{name}: {problem}"

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

