"""The ledger audit as a Dagster asset check.

``Ledger.audit`` proves the exactly-once invariants of a pipeline (no overlapping or missing
committed spans, no stale claims, broker stored offsets not ahead of the ledger, ...). As an asset
check it runs after each materialization (or on its own) and its violations become check metadata,
so a broken pipeline is red in the UI next to the asset it feeds.
"""


from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
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

from streamledger.batch.proof import audit
from streamledger.dagster.assets import DEFAULT_BROKER_KEY, DEFAULT_LEDGER_KEY


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
) -> AssetChecksDefinition:
    """An ERROR-severity check that passes exactly when ``Ledger.audit(pipeline, broker=…)`` is clean.

    :param blocking: block downstream assets when the audit fails.
    :param stale_after: a claim older than this counts as stale (a run that died without failing).
    """
    target = asset if isinstance(asset, AssetsDefinition) else AssetKey.from_coercible(asset)

    @asset_check(
        asset=target,
        name=name,
        blocking=blocking,
        required_resource_keys={broker_resource_key, ledger_resource_key},
        description=f"Ledger audit of pipeline {pipeline}: ranges, claims and broker offsets agree.",
    )
    def _ledger_audit(context: AssetCheckExecutionContext) -> AssetCheckResult:
        ledger = getattr(context.resources, ledger_resource_key).get_ledger()
        with getattr(context.resources, broker_resource_key).get_client() as client:
            report = audit(ledger, pipeline, broker=client, stale_after=stale_after)
        return AssetCheckResult(
            passed=bool(report.clean), severity=AssetCheckSeverity.ERROR, metadata=audit_metadata(report)
        )

    return _ledger_audit
