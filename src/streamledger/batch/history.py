"""One history, one kind: pinned to data intervals, or free (claimed where the ledger ends).

Why the rule: a pinned claim takes exactly its interval's span wherever no live range covers it; a
free claim (a batch without an interval, a streaming query) takes what follows the ledger's end.
Mixed in one history, a free claim takes offsets of an interval whose run has not come yet, and a
pinned run then finds its span covered in part (refused on every retry: a stall) or in full (it
answers with a range it never read). So a batch and a streaming query ask here, before anything is
claimed, and the ledger's position names a range of each kind (``SourcePosition.pinned_range`` /
``free_range``).
"""

from __future__ import annotations

from streamledger.ledger import SourcePosition
from streamledger.runs import describe

__all__ = ["mixed_because"]


def mixed_because(pipeline: str, stream: str, position: SourcePosition, *, pinned: bool) -> str | None:
    """Why a claim of this kind (``pinned``: bound to a data interval) cannot go on this history, in
    one line naming the pipeline, the stream and a range of the other kind; None when it can."""
    where = f"pipeline {pipeline!r}, stream {stream!r}"
    if pinned and position.free_range is not None:
        r = position.free_range
        return (f"{where}: its history is not pinned to data intervals (range {r.id} [{r.start}, {r.end}) "
                f"was claimed where the ledger ended, by {describe(r.run)}: a batch without an interval "
                "or a streaming query); an interval's span would overlap such ranges; nothing was "
                "claimed. Run interval-bound batches on another pipeline")
    if not pinned and position.pinned_range is not None:
        r = position.pinned_range
        interval = ("" if r.interval is None
                    else f" of interval {r.interval[0].isoformat()} to {r.interval[1].isoformat()}")
        return (f"{where}: its history is pinned to data intervals (range {r.id} [{r.start}, {r.end})"
                f"{interval}); a batch without an interval or a streaming query claims where the ledger "
                "ends and would take an interval's offsets; nothing was claimed. Read it into another "
                "pipeline")
    return None
