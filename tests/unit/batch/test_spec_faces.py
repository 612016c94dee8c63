"""Issue 41 item 1: the pipeline spec is the one declaration. Every face (``streamledger batch run``,
``StreamBatchOperator``, the asset factory, ``StreamBatchComponent``) offers every field a user sets
(:func:`~streamledger.batch.spec.spec_settings`) or names it, with the reason, in its ``SPEC_LACKS``;
what a face offers has the spec's default and reaches the spec it builds.

A new field of ``PipelineSpec`` fails these tests until each face offers it (one entry per face: the
CLI's ``SPEC_OPTIONS``, a keyword of the operator, a field of the component; the asset factory takes
any field) or says why not, and until ``SAMPLES`` below holds a value to carry through the faces.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from streamledger.batch.spec import FACE_SET, PipelineSpec, spec_default, spec_settings

SQL_FILE = Path(__file__).with_name("records.sql")
BASE: dict[str, Any] = {"pipeline": "p", "stream": "s", "output_root": "/tmp/streamledger-out"}

SAMPLES: dict[str, dict[str, Any]] = {
    "pipeline": {"pipeline": "p2"},
    "output_root": {"output_root": "/tmp/elsewhere"},
    "stream": {"stream": "s2"},
    "super_stream": {"stream": None, "super_stream": "events"},
    "initial_position": {"initial_position": 7},
    "fmt": {"fmt": "orc"},
    "splits": {"splits": 3},
    "store_offset": {"store_offset": False},
    "store_timeout": {"store_timeout": 2.5},
    "on_data_loss": {"on_data_loss": "record"},
    "max_offsets": {"max_offsets": 100},
    "broker_name": {"broker_name": "b1"},
    "heartbeat_interval": {"heartbeat_interval": 5.0},
    "claim_timeout": {"claim_timeout": 90.0},
    "sink": {"sink": "delta"},
    "table": {"sink": "delta", "table": "/tmp/lake/t"},
    "bound_by_interval": {"bound_by_interval": True},
    "interval_grace": {"bound_by_interval": True, "interval_grace": 5.0},
    "sql": {"sql": "SELECT offset FROM records"},
    "sql_file": {"sql_file": str(SQL_FILE)},
    "transform": {"transform": "tests.integration.batch.order_transforms:items"},
    "body_format": {"body_format": "json", "body_schema": "id STRING"},
    "body_schema": {"body_format": "json", "body_schema": "id STRING, n INT"},
    "on_bad_record": {"body_format": "json", "body_schema": "id STRING", "on_bad_record": "dead_letter"},
}
"""For each spec field a user sets: settings (beside ``BASE``) that give it a value other than its
default; ``None`` leaves a setting out."""


@dataclass(frozen=True)
class Face:
    name: str
    lacks: Mapping[str, str]
    offered: Callable[[], Mapping[str, Any]]  # field -> the face's default for it
    build: Callable[[dict[str, Any]], PipelineSpec]


def _cli() -> Face:
    from streamledger.cli import batch as face
    from streamledger.cli import build_parser

    def build(settings: dict[str, Any]) -> PipelineSpec:
        argv = ["batch", "run", "--broker-url", "rabbitmq-stream://127.0.0.1:1/"]
        for name, value in settings.items():
            argv += face.SPEC_OPTIONS[name].argv(value)
        args = build_parser().parse_args(argv)
        return face._spec(args)

    def offered() -> dict[str, Any]:
        args = build_parser().parse_args(["batch", "run", "--stream", "s", "--pipeline", "p",
                                          "--output-root", "o"])
        spec = face._spec(args)  # what the face gives for an option left out
        return {name: getattr(spec, name) for name in face.SPEC_OPTIONS if name not in BASE}

    return Face("batch run", face.SPEC_LACKS, offered, build)


def _operator() -> Face:
    from streamledger.operators import batch as face

    params = inspect.signature(face.StreamBatchOperator.__init__).parameters

    def build(settings: dict[str, Any]) -> PipelineSpec:
        op = face.StreamBatchOperator(task_id="t", **settings)
        return op._spec(rendered=True)

    def offered() -> dict[str, Any]:
        return {name: params[name].default for name in spec_settings() if name in params and name not in BASE}

    return Face("StreamBatchOperator", face.SPEC_LACKS, offered, build)


ASSET_DEFAULTS = {"initial_position": None}
"""The asset's own defaults (None: a time-window asset starts at its first window, any other at the
first offset: :func:`~streamledger.dagster.assets.asset_spec`)."""


def _asset() -> Face:
    from streamledger.dagster import assets as face

    params = inspect.signature(face.build_stream_batch_asset).parameters
    assert inspect.signature(face.asset_spec).parameters["settings"].kind is inspect.Parameter.VAR_KEYWORD
    assert params["settings"].kind is inspect.Parameter.VAR_KEYWORD  # the factory takes every field

    def build(settings: dict[str, Any]) -> PipelineSpec:
        return face.asset_spec(**settings, windowed=_windowed(settings))

    def offered() -> dict[str, Any]:
        spec = face.asset_spec(**BASE, windowed=False)
        return {name: ASSET_DEFAULTS.get(name, getattr(spec, name)) if name not in params else
                params[name].default for name in spec_settings() if name not in BASE}

    return Face("build_stream_batch_asset", face.SPEC_LACKS, offered, build)


def _component() -> Face:
    from streamledger.dagster import components as face

    fields = {f.name: f for f in dataclasses.fields(face.StreamBatchComponent)}

    def build(settings: dict[str, Any]) -> PipelineSpec:
        from dagster import DailyPartitionsDefinition

        windows = DailyPartitionsDefinition(start_date="2026-01-01") if _windowed(settings) else None
        component = face.StreamBatchComponent(**settings, broker_url_env="STREAMLEDGER_RABBITMQ_URL",
                                              partitions_def=windows)
        return component.pipeline_spec(windowed=_windowed(settings))

    def offered() -> dict[str, Any]:
        return {name: fields[name].default for name in spec_settings() if name in fields and name not in BASE}

    return Face("StreamBatchComponent", face.SPEC_LACKS, offered, build)


FACES: dict[str, Callable[[], Face]] = {"cli": _cli, "operator": _operator, "asset": _asset,
                                        "component": _component}


def _windowed(settings: Mapping[str, Any]) -> bool:
    return bool(settings.get("bound_by_interval"))


@pytest.mark.parametrize("face", FACES)
def test_each_face_offers_every_spec_field_or_says_why_not(face: str) -> None:
    f = FACES[face]()
    offered = set(f.offered()) | (set(BASE) - set(f.lacks))
    missing = [n for n in spec_settings() if n not in offered and n not in f.lacks]
    assert not missing, f"{f.name} lacks {missing}: offer them, or say why in its SPEC_LACKS"
    assert all(isinstance(why, str) and why.strip() for why in f.lacks.values()), f.lacks
    assert not set(f.lacks) & set(f.offered()), f"{f.name} offers what it says it lacks"
    assert not set(f.lacks) - set(spec_settings()), f"{f.name}: SPEC_LACKS names no field of the spec"


@pytest.mark.parametrize("face", FACES)
def test_each_face_takes_the_specs_defaults(face: str) -> None:
    f = FACES[face]()
    for name, default in f.offered().items():
        if face in ("asset", "component") and name in ASSET_DEFAULTS:
            assert default == ASSET_DEFAULTS[name]
            continue
        assert default == spec_default(name), f"{f.name}: {name} defaults to {default!r}, the spec's is " \
                                              f"{spec_default(name)!r}"


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("field", spec_settings())
def test_a_setting_given_to_a_face_reaches_its_spec(face: str, field: str) -> None:
    assert field in SAMPLES, f"add a value for {field!r} to SAMPLES (a new field of PipelineSpec)"
    f = FACES[face]()
    if field in f.lacks:
        return
    settings = {k: v for k, v in {**BASE, **SAMPLES[field]}.items() if v is not None}
    spec = f.build(settings)
    assert getattr(spec, field) == SAMPLES[field][field], f"{f.name}: {field} did not reach the spec"


def test_the_fields_a_face_sets_itself_are_fields_of_the_spec() -> None:
    names = {f.name for f in dataclasses.fields(PipelineSpec)}
    assert set(FACE_SET) <= names
    assert set(spec_settings()) == names - set(FACE_SET)
