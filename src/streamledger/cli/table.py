"""Plain-text tables for people (``ledger ranges``): a header, columns padded to their widest cell,
and the last column left unpadded so long paths do not push every row wide."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime


def when(moment: datetime | None) -> str:
    """A ledger time (naive UTC) to the second, marked UTC; ``-`` when there is none."""
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%SZ")


def render(header: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[str] = ()) -> str:
    """The table as text; columns named in ``right`` are right-aligned (numbers)."""
    cells = [list(header), *[["-" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        out = []
        for i, cell in enumerate(row):
            last = i == len(row) - 1
            if header[i] in right:
                out.append(cell.rjust(widths[i]))
            else:
                out.append(cell if last else cell.ljust(widths[i]))
        lines.append("  ".join(out).rstrip())
    return "\n".join(lines)
