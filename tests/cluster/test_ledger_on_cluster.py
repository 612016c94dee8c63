"""The ledger keeps one history whichever cluster node the batch's URL names: the source identity
comes from the cluster name the broker reports (issue 10's rule), and the real batch (local Spark,
SQLite ledger) continues the same range sequence through each of the three nodes."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from streamledger.batch import BatchConfig, LocalSparkRunner, RunId, run_batch
from streamledger.ledger import Ledger, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.cluster.conftest import Cluster
from tests.cluster.test_cluster import _delete, _stream
from tests.integration.spark.helpers import publish


def test_the_ledger_keeps_one_history_whichever_node_the_url_names(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    name = _stream(cluster, node=1)
    runner = LocalSparkRunner()
    runner._spark = spark
    try:
        publish(cluster.stream_url(1), name, 30)
        with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", create=True) as ledger:
            for i, node in enumerate((1, 2, 3)):
                if i:
                    publish(cluster.stream_url(node), name, 20, start=30 + 20 * (i - 1))
                url = cluster.stream_url(node)
                cfg = BatchConfig(pipeline="p-cluster", url=url, output_root=str(tmp_path / "out"),
                                  stream=name)
                with StreamClient.connect(url) as client:
                    assert client.cluster_name == "streamledger-cluster"
                    run_batch(cfg, run=RunId("dag", f"run-{node}", "t"), ledger=ledger, broker=client,
                              runner=runner)
            ranges = ledger.ranges("p-cluster")
            # one contiguous history (each StoreOffset takes an offset of its own: ends are not 30/50/70)
            assert [(r.records, r.status) for r in ranges] == [(30, RangeStatus.COMMITTED),
                                                               (20, RangeStatus.COMMITTED),
                                                               (20, RangeStatus.COMMITTED)]
            assert ranges[0].start == 0 and all(a.end == b.start for a, b in itertools.pairwise(ranges))
            assert {r.source.broker for r in ranges} == {"rabbitmq://streamledger-cluster/%2F"}
            with StreamClient.connect(cluster.stream_url(2)) as client:
                assert client.query_offset(name, "p-cluster") == ranges[-1].last_seen
                assert ledger.audit("p-cluster", broker=client).clean
    finally:
        _delete(cluster, name)
