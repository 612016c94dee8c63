"""``python -m tests.model.child`` (job as JSON on stdin): one batch, or one streaming query, in its own
process and Spark, for the checker's real SIGKILL. Prints the batch's record count when it finishes;
a query that SIGKILLs itself mid-batch (``QueryJob.kill_at``) prints nothing."""

from __future__ import annotations

import json
import sys
from datetime import datetime

from streamledger.batch import LocalSparkRunner, run_batch
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient
from tests.model.ops import Batch, PipelineSpec
from tests.model.world import batch_config, run_id


def query(job: dict[str, object]) -> int:
    from tests.model.streaming import QueryJob, run_query
    from tests.support.spark import local_session

    spark = local_session()
    error = run_query(spark, QueryJob(**job))  # type: ignore[arg-type]
    print(f"query ended: {error or 'ok'}"[:300])
    return 0 if error is None else 1


def main() -> int:
    job = json.load(sys.stdin)
    if "query" in job:
        return query(job["query"])
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
