"""``python -m tests.model.child`` (job as JSON on stdin): one batch in its own process and Spark, for
the checker's real SIGKILL. Prints the batch's record count when it finishes."""

from __future__ import annotations

import json
import sys
from datetime import datetime

from streamledger.batch import LocalSparkRunner, run_batch
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.model.ops import Batch, PipelineSpec
from tests.model.world import batch_config, run_id


def main() -> int:
    job = json.load(sys.stdin)
    op = Batch(**job["op"])
    cfg = batch_config(PipelineSpec(**job["spec"]), op, url=job["url"], stream=job["stream"],
                       root=job["root"], boundaries=[datetime.fromisoformat(b) for b in job["boundaries"]])
    assert cfg is not None
    with Ledger(job["ledger"]) as ledger, StreamClient.connect(job["url"]) as client:
        res = run_batch(cfg, run=run_id(op), ledger=ledger, broker=client,
                        runner=LocalSparkRunner(conf={"spark.ui.enabled": "false"}))
    print(f"{res.records} record(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
