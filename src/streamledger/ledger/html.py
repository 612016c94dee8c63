"""A self-contained HTML audit report with a coverage timeline per source.

Each source gets one bar spanning its first to last offset; committed, lost and claimed spans are
drawn as coloured segments and the audit's gaps and unretried failures in red, so a missing span
is visible at a glance. The spans come from :mod:`streamledger.ledger.coverage` (merged in SQL),
the same ones the Airflow UI page draws.
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import TYPE_CHECKING

from streamledger.ledger.audit import AuditReport
from streamledger.ledger.coverage import coverage

if TYPE_CHECKING:
    from streamledger.ledger.store import Ledger

_COLOURS = {
    "committed": "#16a34a",
    "lost": "#f59e0b",
    "claimed": "#3b82f6",
    "gap": "#dc2626",
    "failed": "#b91c1c",
    "stuck": "#7c3aed",
}
_MAX_SEGMENTS = 5000

Segment = tuple[str, int, int, int]


def _bar(segments: list[Segment]) -> str:
    low = min(s[1] for s in segments)
    high = max(s[2] for s in segments)
    width = max(high - low, 1)
    parts = []
    for kind, start, end, count in segments[:_MAX_SEGMENTS]:
        left = 100.0 * (start - low) / width
        size = max(100.0 * (end - start) / width, 0.15)
        title = html.escape(f"{kind} [{start}, {end}) {count} range(s)")
        parts.append(
            f'<div class="seg" title="{title}" style="left:{left:.4f}%;width:{size:.4f}%;'
            f'background:{_COLOURS.get(kind, "#6b7280")}"></div>'
        )
    axis = f'<div class="axis"><span>{low}</span><span>{high}</span></div>'
    return f'<div class="bar">{"".join(parts)}</div>{axis}'


def render_html(ledger: Ledger, report: AuditReport, *, pipeline: str | None = None) -> str:
    """The report as one HTML page (no external assets)."""
    by_source: dict[tuple[str, str], list[Segment]] = defaultdict(list)
    for cov in coverage(ledger, report, pipeline=pipeline):
        if cov.spans:
                by_source[(cov.pipeline, cov.stream)].extend(
                    (s.kind, s.start, s.end, s.ranges) for s in cov.spans)

    rows = []
    for (name, stream), segments in sorted(by_source.items()):
        segments.sort(key=lambda s: (s[1], s[2]))
        issues = [v for v in report.violations if (v.pipeline, v.stream) == (name, stream)]
        badge = "clean" if not issues else f"{len(issues)} violation(s)"
        rows.append(
            f"<tr><td>{html.escape(name)}</td><td>{html.escape(stream)}</td>"
            f'<td class="{"ok" if not issues else "bad"}">{badge}</td><td>{_bar(segments)}</td></tr>'
        )
    findings = "".join(
        f"<tr><td>{html.escape(v.kind.value)}</td><td>{html.escape(v.pipeline)}</td>"
        f"<td>{html.escape(v.stream)}</td><td>{'' if v.start is None else v.start}</td>"
        f"<td>{'' if v.end is None else v.end}</td><td>{html.escape(v.detail)}</td></tr>"
        for v in report.violations
    )
    legend = " ".join(f'<span class="key" style="background:{c}"></span>{k}' for k, c in _COLOURS.items())
    verdict = "CLEAN" if report.clean else f"{len(report.violations)} VIOLATION(S)"
    summary = html.escape(report.to_text().splitlines()[0])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>streamledger ledger audit</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #111827; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border-bottom: 1px solid #e5e7eb; padding: 4px 8px; text-align: left; vertical-align: middle; }}
.bar {{ position: relative; height: 16px; background: #f3f4f6; min-width: 400px; }}
.seg {{ position: absolute; top: 0; height: 16px; }}
.axis {{ display: flex; justify-content: space-between; font-size: 11px; color: #6b7280; }}
.ok {{ color: #15803d; }} .bad {{ color: #b91c1c; font-weight: bold; }}
.key {{ display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; }}
</style></head><body>
<h1>Ledger audit: <span class="{"ok" if report.clean else "bad"}">{verdict}</span></h1>
<p>{summary}</p>
<h2>Coverage per source</h2><p>{legend}</p>
<table><tr><th>pipeline</th><th>stream</th><th>audit</th><th>offsets</th></tr>{"".join(rows)}</table>
<h2>Violations</h2>
<table><tr><th>kind</th><th>pipeline</th><th>stream</th><th>start</th><th>end</th><th>detail</th></tr>
{findings or '<tr><td colspan="6">none</td></tr>'}</table>
</body></html>
"""
