"""The table audit's row rule (issue 30 defect 7): rows are matched to a range by its broker, its
source's epoch, its stream and its span; rows without the columns (a table's history from before
they existed) count for a range only when none of its own are there."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from streamledger.batch.sinks import check_table
from streamledger.ledger import OffsetRange, RangeStatus, RunIdentity, SourceRef

T = "delta:/lake/t"
B = "rabbitmq://h:5552/%2F"


def rng(rid: int, broker: str, start: int, end: int) -> OffsetRange:
    return OffsetRange(id=rid, pipeline="p", source=SourceRef(broker, "s"), start=start, end=end,
                       status=RangeStatus.COMMITTED, run=RunIdentity("d", "r", "t"), records=end - start,
                       first_seen=start, last_seen=end - 1, output=None, offset_stored=True,
                       offset_verified=True, error=None, claimed_at=datetime.now(UTC),
                       committed_at=datetime.now(UTC), sink_table=T, sink_commit=None)


def rows(*groups: tuple[str | None, int | None, range]) -> pa.Table:
    b, e, o = [], [], []
    for broker, epoch, offsets in groups:
        for off in offsets:
            b.append(broker), e.append(epoch), o.append(off)
    return pa.table({"stream": ["s"] * len(o), "offset": pa.array(o, pa.int64()),
                     "broker": pa.array(b, pa.string()), "epoch": pa.array(e, pa.int64())})


RETIRED, LIVE = rng(1, f"{B}#epoch0", 0, 40), rng(2, B, 0, 25)
EPOCHS = {(f"{B}#epoch0", "s"): 0, (B, "s"): 1}


def test_each_epoch_counts_its_own_rows() -> None:
    assert check_table(T, "p", [RETIRED, LIVE], None, rows((B, 0, range(40)), (B, 1, range(25))),
                       epochs=EPOCHS) == []


def test_unstamped_rows_are_the_history_from_before_the_columns() -> None:
    assert check_table(T, "p", [RETIRED, LIVE], None, rows((None, None, range(40)), (B, 1, range(25))),
                       epochs=EPOCHS) == []


def test_a_range_missing_its_rows_or_doubled_is_still_found() -> None:
    found = check_table(T, "p", [RETIRED, LIVE], None, rows((B, 0, range(40)), (B, 0, range(25))),
                        epochs=EPOCHS)
    assert [(v.range_id, "duplicate" in v.detail) for v in found] == [(1, True), (1, False), (2, False)]
    other = check_table(T, "p", [LIVE], None, rows(("rabbitmq://other:5552/%2F", 1, range(25))),
                        epochs=EPOCHS)
    assert [v.range_id for v in other] == [2] and "holds 0 rows" in other[0].detail


def test_an_unstamped_second_copy_of_a_stamped_range_is_found() -> None:
    """LIVE's 25 rows are in the table twice: stamped (its own append) and unstamped (the same files
    appended again without the columns, e.g. by a writer from before them). No range of the
    pipeline counts the unstamped copy (RETIRED's span has its own stamped rows too): it is a
    finding of each range whose span holds it, not a table whose readers see 25 rows twice passing."""
    doubled = rows((B, 0, range(40)), (B, 1, range(25)), (None, None, range(25)))
    found = check_table(T, "p", [RETIRED, LIVE], None, doubled, epochs=EPOCHS)
    assert [(v.range_id, "25 row(s) without broker and epoch" in v.detail) for v in found] == [
        (1, True), (2, True)], [v.detail for v in found]
