"""A plain ``spark.read`` records nothing in the ledger, so it refuses the ledger's options in one line
(issue 43, item 6) instead of reading as if recorded. RabbitMQ 4.3, local Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.spark.helpers import create_stream, read_df

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("options", [
    {"ledger": "default", "pipeline": "p-plain", "ledgerOutput": "OUT"},
    {"ledger": "default", "pipeline": "p-plain", "ledgerOutput": "OUT", "filterPushdown": "true"},
    {"pipeline": "p-plain"},
])
def test_a_plain_read_refuses_the_ledger_options_in_one_line(
    spark: Any, rabbitmq_url: str, stream_name: Any, tmp_path: Path, options: dict[str, str]
) -> None:
    s = stream_name("plain-ledger")
    create_stream(rabbitmq_url, s, 5)
    given = {k: (str(tmp_path) if v == "OUT" else v) for k, v in options.items()}
    with pytest.raises(Exception) as refused:
        read_df(spark, rabbitmq_url, stream=s, **given).collect()
    text = str(refused.value)
    assert "ledger-recorded reads are streaming queries (spark.readStream) or run_batch" in text, text
    line = next(x for x in text.splitlines() if "PlanningError: rabbitmq_stream: option(s)" in x)
    assert "'pipeline'" in line and line.rstrip().endswith("or run_batch"), line
    assert read_df(spark, rabbitmq_url, stream=s).count() == 5
