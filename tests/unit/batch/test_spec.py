"""One pipeline spec: every front door builds the same record and asks the same rules."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from streamledger.batch import BatchConfig, PipelineSpec, SpecError
from streamledger.batch.spec import Door

URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"


def test_a_batch_config_is_its_spec_bound_to_a_run() -> None:
    spec = PipelineSpec(pipeline="p", output_root="/out", super_stream="ev", max_offsets=5, sink="delta")
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    config = BatchConfig.for_run(spec, url=URL, interval_start=start, interval_end=end)
    assert isinstance(config, PipelineSpec) and config.spec == spec
    assert (config.url, config.interval_start, config.interval_end) == (URL, start, end)
    assert config == BatchConfig(pipeline="p", output_root="/out", super_stream="ev", max_offsets=5,
                                 sink="delta", url=URL, interval_start=start, interval_end=end)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"stream": None}, "give exactly one of stream or super_stream"),
        ({"splits": 0}, "splits must be >= 1"),
        ({"fmt": "csv"}, "fmt 'csv' is not parquet, orc or json"),
        ({"max_offsets": 0}, "max_offsets must be >= 1"),
        ({"sink": "delta", "catalog_given": True}, "catalog is for the iceberg sink"),
        ({"intervals": False, "initial_position": "interval_start"}, "'interval_start' needs an interval"),
        ({"bound_by_interval": True, "max_offsets": 3}, "max_offsets cannot split it"),
        ({"claim_timeout": 1.0}, "heartbeat_interval"),
    ],
)
def test_the_spec_refuses_in_one_line_naming_the_pipeline(settings: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message) as refused:
        PipelineSpec(**{"pipeline": "orders", "output_root": "/out", "stream": "s",  # type: ignore[arg-type]
                        **settings})
    assert "'orders'" in str(refused.value) and "\n" not in str(refused.value)
    assert isinstance(refused.value, ValueError)  # Airflow's way to refuse an operator at parse time


def test_the_door_only_changes_the_wording() -> None:
    with pytest.raises(SpecError, match="catalog_conn_id is for the iceberg sink"):
        PipelineSpec(pipeline="p", output_root="/o", stream="s", sink="delta", catalog_given=True,
                     door=Door.OPERATOR)
    with pytest.raises(SpecError, match=r"stream= or super_stream="):
        PipelineSpec(pipeline="p", output_root="/o", door=Door.OPERATOR)
    assert PipelineSpec(pipeline="p", output_root="/o", stream="s", door=Door.ASSET) == PipelineSpec(
        pipeline="p", output_root="/o", stream="s")


def test_the_operator_the_asset_factory_and_the_component_build_one_spec() -> None:
    from streamledger.dagster.assets import asset_spec
    from streamledger.dagster.components import StreamBatchComponent
    from streamledger.operators.batch import StreamBatchOperator

    op = StreamBatchOperator(task_id="t", pipeline="p", super_stream="ev", output_root="/out", max_offsets=9,
                             sink="iceberg", table="lake.ev")
    factory = asset_spec(pipeline="p", super_stream="ev", output_root="/out", max_offsets=9, sink="iceberg",
                         table="lake.ev", windowed=False)
    component = StreamBatchComponent.resolve_from_yaml(
        "pipeline: p\nsuper_stream: ev\noutput_root: /out\nmax_offsets: 9\nsink: iceberg\ntable: lake.ev\n"
        "broker_url_env: X\n"
    ).pipeline_spec(windowed=False)
    fields = ("pipeline", "super_stream", "output_root", "max_offsets", "sink", "table", "initial_position")
    operator = op._spec(rendered=True)
    assert {f: getattr(operator, f) for f in fields} == {f: getattr(factory, f) for f in fields}
    assert factory == component
