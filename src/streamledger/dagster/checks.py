"""The ledger audit as a Dagster asset check.

``Ledger.audit`` proves the exactly-once invariants of a pipeline (no overlapping or missing
committed spans, no stale claims, broker stored offsets not ahead of the ledger, ...). As an asset
check it runs after each materialization (or on its own) and its violations become check metadata,
so a broken pipeline is red in the UI next to the asset it feeds.
"""


from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from itertools import pairwise
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    AssetsDefinition,
    MetadataValue,
    asset_check,
)

from streamledger.batch.proof import audit, check_outputs
from streamledger.dagster.assets import DEFAULT_BROKER_KEY, DEFAULT_LEDGER_KEY
from streamledger.dagster.identity import DAG_ID, task_id
from streamledger.errors import StreamledgerError
from streamledger.ledger.types import RangeStatus, is_retired


def audit_metadata(report: Any) -> dict[str, Any]:
    data = report.to_dict()
    kinds = Counter(str(v.kind) for v in report.violations)
    return {
        "violations": MetadataValue.int(len(report.violations)),
        "violation_kinds": MetadataValue.json(dict(kinds)),
        "report": MetadataValue.md(f"```\n{report.to_text()}\n```"),
        "audit": MetadataValue.json(data),
    }


def build_ledger_audit_check(
    asset: AssetsDefinition | AssetKey | str | Sequence[str],
    *,
    pipeline: str,
    name: str = "ledger_audit",
    blocking: bool = False,
    stale_after: timedelta = timedelta(hours=1),
    broker_resource_key: str = DEFAULT_BROKER_KEY,
    ledger_resource_key: str = DEFAULT_LEDGER_KEY,
    catalog_resource_key: str | None = None,
) -> AssetChecksDefinition:
    """An ERROR-severity check that passes exactly when ``Ledger.audit(pipeline, broker=…)`` is clean.

    :param blocking: block downstream assets when the audit fails.
    :param stale_after: a claim older than this counts as stale (a run that died without failing).
    :param catalog_resource_key: key of an :class:`IcebergCatalogResource` when the pipeline's
        Iceberg table lives in a non-default catalog (the table part of the audit reads it there).
    """
    target = asset if isinstance(asset, AssetsDefinition) else AssetKey.from_coercible(asset)

    @asset_check(
        asset=target,
        name=name,
        blocking=blocking,
        required_resource_keys={broker_resource_key, ledger_resource_key}
        | ({catalog_resource_key} if catalog_resource_key else set()),
        description=f"Ledger audit of pipeline {pipeline}: ranges, claims and broker offsets agree.",
    )
    def _ledger_audit(context: AssetCheckExecutionContext) -> AssetCheckResult:
        ledger = getattr(context.resources, ledger_resource_key).get_ledger()
        catalog = (getattr(context.resources, catalog_resource_key).catalog_properties()
                   if catalog_resource_key else None)
        with getattr(context.resources, broker_resource_key).get_client() as client:
            report = audit(ledger, pipeline, broker=client, stale_after=stale_after, catalog=catalog)
        return AssetCheckResult(
            passed=bool(report.clean), severity=AssetCheckSeverity.ERROR, metadata=audit_metadata(report)
        )

    return _ledger_audit


def partition_ranges(ledger: Any, pipeline: str, asset_key: AssetKey, partition_key: str) -> list[Any]:
    """The ranges claimed for one asset partition: the identity's task id names asset and partition."""
    task = task_id(asset_key, partition_key)
    return [r for r in ledger.ranges(pipeline) if r.run.dag_id == DAG_ID and r.run.task_id == task]


def _where(source: Any) -> str:
    """A source's stream, with its history's broker identity when that history is a retired epoch's
    (``...#epochN``: the stream as it was before it was re-created)."""
    return f"{source.stream} ({source.broker})" if is_retired(source.broker) else source.stream


def partition_findings(ledger: Any, pipeline: str, ranges: Sequence[Any], broker: Any = None,
                       stale_after: timedelta = timedelta(hours=1)) -> list[str]:
    """Why one partition's ranges are not done exactly once, as one line each (empty: they are).

    Per source (a stream in one epoch: a re-created stream's offsets start again) the partition's
    ranges must be committed (a failed range must have been redone over the same span), contiguous,
    free of ledger-audit violations, and each published output must hold exactly the range's records
    (rows counted in the data files).
    """
    findings: list[str] = []
    done: dict[Any, list[Any]] = {}
    for r in ranges:
        if r.status in (RangeStatus.COMMITTED, RangeStatus.LOST):
            done.setdefault(r.source, []).append(r)
    spans = {(r.source, r.start, r.end) for rs in done.values() for r in rs}
    for r in ranges:
        if r.status is RangeStatus.CLAIMED:
            findings.append(f"{_where(r.source)} [{r.start}, {r.end}) is still claimed by {r.run.run_id}")
        elif r.status is RangeStatus.FAILED and (r.source, r.start, r.end) not in spans:
            findings.append(f"{_where(r.source)} [{r.start}, {r.end}) failed and was not redone")
    for source, rs in sorted(done.items(), key=lambda item: (item[0].stream, item[0].broker)):
        rs.sort(key=lambda r: (r.start, r.end))
        findings.extend(
            f"{_where(source)}: gap [{a.end}, {b.start}) between ranges {a.id} and {b.id}"
            for a, b in pairwise(rs)
            if b.start != a.end
        )
    ids = {r.id for r in ranges}
    if ids:
        report = ledger.audit(pipeline, broker=broker, stale_after=stale_after)
        findings.extend(
            f"{v.kind}: {v.stream} [{v.start}, {v.end}) {v.detail}"
            for v in report.violations
            if v.range_id in ids
        )
        findings.extend(
            f"{v.kind}: {v.stream} [{v.start}, {v.end}) {v.detail}"
            for v in check_outputs([r for rs in done.values() for r in rs], deep=True)
        )
    return findings


def build_partition_audit_check(
    asset: AssetsDefinition,
    *,
    pipeline: str,
    name: str = "partition_audit",
    blocking: bool = False,
    stale_after: timedelta = timedelta(hours=1),
    broker_resource_key: str = DEFAULT_BROKER_KEY,
    ledger_resource_key: str = DEFAULT_LEDGER_KEY,
) -> AssetChecksDefinition:
    """A check per time-window partition: that window's ranges are committed once and match the output.

    The source-level :func:`build_ledger_audit_check` proves the whole pipeline; this one answers
    "is yesterday's partition right?" with only that partition's ranges (see :func:`partition_findings`).
    A partition that was never run (or whose window held no events) has no ranges and passes.
    """
    partitions_def = asset.partitions_def
    if partitions_def is None:
        raise StreamledgerError(
            f"pipeline {pipeline!r}: a partition audit check needs a partitioned asset; use "
            "build_ledger_audit_check for an unpartitioned one"
        )
    key = asset.key

    @asset_check(
        asset=asset,
        name=name,
        blocking=blocking,
        partitions_def=partitions_def,
        required_resource_keys={broker_resource_key, ledger_resource_key},
        description=f"Ledger audit of one time window of pipeline {pipeline}: its ranges only.",
    )
    def _partition_audit(context: AssetCheckExecutionContext) -> AssetCheckResult:
        partition = context.partition_key
        ledger = getattr(context.resources, ledger_resource_key).get_ledger()
        ranges = partition_ranges(ledger, pipeline, key, partition)
        with getattr(context.resources, broker_resource_key).get_client() as client:
            findings = partition_findings(ledger, pipeline, ranges, broker=client, stale_after=stale_after)
        table = {  # one entry per range: a failed range and its redo share a span
            f"{_where(r.source)} [{r.start}, {r.end}) range {r.id}": {"status": str(r.status),
                                                                     "records": r.records}
            for r in ranges
        }
        return AssetCheckResult(
            passed=not findings,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "partition": MetadataValue.text(partition),
                "ranges": MetadataValue.json(table),
                "records": MetadataValue.int(sum(int(r.records or 0) for r in ranges
                                                 if str(r.status) == "committed")),
                "findings": MetadataValue.json(findings),
            },
        )

    return _partition_audit
