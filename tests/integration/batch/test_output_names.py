"""Issue 19, item 4: names that escape or collide in the output tree.

Against the real RabbitMQ 4.3 broker (it accepts stream names such as ``../../x`` or ones holding a
NUL), local Spark and a real SQLite ledger (the fixtures of ``conftest.py``): a stream, a pipeline
and a broker identity each become one reversibly encoded path component (``streamledger.paths``),
so nothing leaves the output root, distinct names never share a directory, and a name no ledger or
file system can hold is refused before anything is claimed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamledger.batch import BatchConfig, BatchError, RunId, run_batch
from streamledger.ledger import Ledger, OffsetRange, RangeStatus
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.batch.helpers import CountingRunner
from tests.integration.spark.helpers import body, create_stream, publish

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq, pytest.mark.timeout(300)]


@pytest.fixture
def odd_streams(client: StreamClient) -> Iterator[list[str]]:
    """Streams with names the CLI clean-up cannot pass on (``..``, NUL): deleted through the client."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            client.delete_stream(name)
        except Exception:  # best effort, like the shared clean-up
            pass


def committed(ledger: Ledger, pipeline: str) -> list[OffsetRange]:
    return [r for r in ledger.ranges(pipeline) if r.status == RangeStatus.COMMITTED and r.records]


def published_bodies(r: OffsetRange) -> list[bytes]:
    """The range's published records, after checking its manifest names this very range."""
    assert r.output is not None
    manifest = json.loads((Path(r.output) / "_manifest.json").read_text())
    assert manifest["range_id"] == r.id and manifest["output"] == r.output
    return sorted(pq.read_table(r.output, columns=["body"]).column("body").to_pylist())


def files_outside(tmp_path: Path, root: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("*") if p.is_file() and root not in p.parents
            and not p.name.startswith("ledger.sqlite")]


def test_a_stream_named_dot_dot_writes_inside_the_output_root(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    odd_streams: list[str], tmp_path: Path, spark: Any,
) -> None:
    s = f"../../{stream_name('dotdot')}"
    odd_streams.append(s)
    create_stream(rabbitmq_url, s, 25)
    root = tmp_path / "deep" / "out"
    cfg = BatchConfig(pipeline="p-names", url=rabbitmq_url, output_root=str(root), stream=s)
    run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
    (r,) = committed(ledger, "p-names")
    assert r.output is not None
    assert root.resolve() in Path(r.output).resolve().parents, f"{r.output} lies outside {root}"
    assert files_outside(tmp_path, root) == []
    assert published_bodies(r) == sorted(body(s, i) for i in range(25))
    assert spark.read.parquet(r.output).count() == 25  # Hadoop neither unquotes nor globs the escapes
    assert client.query_offset(s, "p-names") == 24


def test_pipelines_a_slash_b_and_a_underscore_b_get_distinct_directories(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    s = stream_name("slash")
    create_stream(rabbitmq_url, s, 30)
    root = tmp_path / "out"
    for pipeline in ("a/b", "a_b"):  # no StoreOffset: its tracking chunk would shift the next range
        cfg = BatchConfig(pipeline=pipeline, url=rabbitmq_url, output_root=str(root), stream=s,
                          store_offset=False)
        run_batch(cfg, run=RunId("dag", pipeline, "t"), ledger=ledger, broker=client, runner=runner)
    (slash,), (underscore,) = committed(ledger, "a/b"), committed(ledger, "a_b")
    assert (slash.start, slash.end) == (underscore.start, underscore.end) == (0, 30)
    assert slash.output and underscore.output
    trees = {Path(r).relative_to(root).parts[0] for r in (slash.output, underscore.output)}
    assert len(trees) == 2, f"both pipelines publish under {root / trees.pop()}"
    expected = sorted(body(s, i) for i in range(30))
    assert published_bodies(slash) == expected and published_bodies(underscore) == expected
    assert not list(root.rglob("*.superseded-*")), "a committed output was moved aside"


def test_two_brokers_of_one_pipeline_and_stream_publish_apart(
    ledger: Ledger, runner: CountingRunner, broker_43: Any, broker_40: Any, stream_name: Any, tmp_path: Path,
) -> None:
    """One pipeline reads a stream of one name on two brokers (the 4.3 and the 4.0 server, named east
    and west): each history publishes apart. (One broker under two names is refused instead:
    test_node_named_broker_identity.)"""
    s = stream_name("brokers")
    root = tmp_path / "out"
    outputs = {}
    for name, where in (("east", broker_43), ("west", broker_40)):
        create_stream(where.url, s, 20)
        cfg = BatchConfig(pipeline="p-two", url=where.url, output_root=str(root), stream=s, broker_name=name)
        with StreamClient.connect(where.url) as client:
            result = run_batch(cfg, run=RunId("dag", name, "t"), ledger=ledger, broker=client, runner=runner)
        (part,) = result.partitions
        assert (part.start, part.end, part.records) == (0, 20, 20)
        outputs[name] = part.output
    ranges = committed(ledger, "p-two")
    assert sorted(r.source.broker for r in ranges) == ["rabbitmq://east/%2F", "rabbitmq://west/%2F"]
    assert outputs["east"] != outputs["west"]
    for r in ranges:  # both still published where the ledger says, each with its own manifest
        assert published_bodies(r) == sorted(body(s, i) for i in range(20))
    assert not list(root.rglob("*.superseded-*")), "one broker's committed output was moved aside"


def test_a_nul_in_a_stream_name_is_refused_before_anything_is_claimed(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    odd_streams: list[str], tmp_path: Path,
) -> None:
    s = f"{stream_name('nul')}\x00x"
    odd_streams.append(s)
    create_stream(rabbitmq_url, s, 5)  # the broker takes it
    with pytest.raises(BatchError, match=r"^stream .*NUL") as caught:
        cfg = BatchConfig(pipeline="p-nul", url=rabbitmq_url, output_root=str(tmp_path / "out"), stream=s)
        run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
    assert "\n" not in str(caught.value)
    assert ledger.ranges("p-nul") == []
    assert client.query_offset(s, "p-nul") is None
    assert not (tmp_path / "out").exists()


def test_a_super_stream_partition_with_a_nul_is_refused_before_any_partition_is_claimed(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path,
) -> None:
    sup = stream_name.super_stream("nulpart")
    client.create_super_stream(sup, binding_keys=["ok", "bad\x00"])
    bad, ok = sorted(client.partitions(sup))  # as the broker lists them
    assert bad == f"{sup}-bad\x00" and ok == f"{sup}-ok"
    publish(rabbitmq_url, ok, 10)
    cfg = BatchConfig(pipeline="p-nul-part", url=rabbitmq_url, output_root=str(tmp_path / "out"),
                      super_stream=sup)
    with pytest.raises(BatchError, match=rf"^super stream {sup!r}: partition .*NUL"):
        run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
    assert ledger.ranges("p-nul-part") == []
    assert not (tmp_path / "out").exists()


# -- every sink, one encoding (issue 30, defect 4) -------------------------------------------------

def hostile_pipelines(tmp_path: Path) -> list[str]:
    """Pipeline names that escape or break a path written unchanged (the absolute one points into the
    test's own directory, so a sink that writes there is caught without touching the machine)."""
    return [str(tmp_path / "evil"), "../../escape", "orders v2", "team:orders"]


def rows_read_back(r: OffsetRange, ledger: Ledger, root: Path) -> Any:
    """What a reader of the range's sink sees: the range directory, or the table (pyiceberg / deltalake)."""
    if r.sink_table is None:
        assert r.output is not None
        return pq.read_table(r.output)
    kind, _, where = r.sink_table.partition(":")
    if kind == "delta":
        from deltalake import DeltaTable

        assert root.resolve() in Path(where).resolve().parents, f"delta table {where} lies outside {root}"
        return DeltaTable(where).to_pyarrow_table()
    from streamledger.batch.sinks.iceberg import catalog_properties, load_catalog

    catalog = load_catalog(catalog_properties(None, ledger_url=ledger.url, output_root=str(root)))
    table = catalog.load_table(where)
    assert root.resolve() in Path(table.location().removeprefix("file://")).resolve().parents
    return table.scan().to_arrow()


@pytest.mark.parametrize("sink", ["directory", "iceberg", "delta"])
def test_hostile_pipeline_names_publish_inside_the_output_root_with_every_sink(
    sink: str, ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str,
    stream_name: Any, odd_streams: list[str], tmp_path: Path,
) -> None:
    """Issue 30, defect 4: pipelines ``/abs/evil``, ``../../escape``, ``orders v2``, ``team:orders``
    reading a stream ``../../x`` into each sink: every batch publishes (no "files are not under the
    table" after the ledger commit), the table and every file stay under the output root, the rows
    read back with deltalake / pyiceberg / pyarrow are the stream's, and the audit is clean."""
    from streamledger.batch.proof import audit

    s = f"../../{stream_name(f'hostile-{sink}')}"
    odd_streams.append(s)
    create_stream(rabbitmq_url, s, 20)
    root = tmp_path / "deep" / "out"
    for i, pipeline in enumerate(hostile_pipelines(tmp_path)):
        cfg = BatchConfig(pipeline=pipeline, url=rabbitmq_url, output_root=str(root), stream=s, sink=sink,
                          store_offset=False)
        run_batch(cfg, run=RunId("dag", f"r{i}", "t"), ledger=ledger, broker=client, runner=runner)
        (r,) = committed(ledger, pipeline)
        assert r.published_at is not None, f"{pipeline!r}: range {r.id} never published"
        assert r.output is not None and root.resolve() in Path(r.output).resolve().parents, r.output
        rows = rows_read_back(r, ledger, root).sort_by("offset")
        assert rows.column("offset").to_pylist() == list(range(20)), pipeline
        assert rows.column("body").to_pylist() == [body(s, k) for k in range(20)], pipeline
        report = audit(ledger, pipeline)
        assert report.clean, report.to_text()
        assert files_outside(tmp_path, root) == [], pipeline


# -- the readable broker directory and the layout before it (issue 33) ------------------------------

def test_ranges_published_under_the_old_layout_are_still_audited(
    ledger: Ledger, client: StreamClient, runner: CountingRunner, rabbitmq_url: str, stream_name: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The release before named the broker's directory by its whole escaped identity
    (``rabbitmq~3A~2F~2F<cluster>~2F~252F``): the first batch here runs with that one rule as it was
    (the only difference between the two layouts), the next one with the readable name. Both ranges
    audit clean where the ledger recorded them, and damage to the old-layout output is found."""
    from streamledger.batch import plan
    from streamledger.batch.proof import audit
    from streamledger.ledger import ViolationKind
    from streamledger.paths import broker_component, encode_component

    s = stream_name("old-layout")
    create_stream(rabbitmq_url, s, 40)
    root = tmp_path / "out"
    cfg = BatchConfig(pipeline="p-layout", url=rabbitmq_url, output_root=str(root), stream=s, max_offsets=20)
    with monkeypatch.context() as old_release:
        old_release.setattr(plan, "broker_component", encode_component)
        run_batch(cfg, run=RunId("dag", "r1", "t"), ledger=ledger, broker=client, runner=runner)
    run_batch(cfg, run=RunId("dag", "r2", "t"), ledger=ledger, broker=client, runner=runner)
    old, new = sorted(committed(ledger, "p-layout"), key=lambda r: r.start)
    assert (old.start, old.end, new.start) == (0, 20, 20)
    identity = old.source.broker
    assert old.output is not None and new.output is not None
    assert Path(old.output).relative_to(root).parts[:2] == ("p-layout", encode_component(identity))
    assert Path(new.output).relative_to(root).parts[:2] == ("p-layout", broker_component(identity))
    assert "~3A~2F~2F" not in new.output and "%" not in new.output
    assert published_bodies(old) + published_bodies(new) == sorted(body(s, i) for i in range(40))

    report = audit(ledger, "p-layout", broker=client, deep=True)
    assert report.clean, report.to_text()

    (victim,) = [p for p in Path(old.output).iterdir() if p.suffix == ".parquet"][:1]
    victim.unlink()
    report = audit(ledger, "p-layout", broker=client)
    assert [v.kind for v in report.violations] == [ViolationKind.OUTPUT_MISMATCH], report.to_text()
    assert old.output in report.to_text()
