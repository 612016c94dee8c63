"""The one shape a batch is reported in (``streamledger.batch.lineage``), on results as the batch
builds them: every range on its own, and the per-stream maps lossless when a stream has several."""

from __future__ import annotations

import json

from streamledger.batch import BatchResult, PartitionResult
from streamledger.batch.config import PartitionStatus, StartFrom
from streamledger.batch.lineage import lineage_of

COMMITTED = PartitionStatus.COMMITTED


def _piece(stream: str, start: int, end: int, rid: int | None, stored: int | None = None,
           epoch: int = 0) -> PartitionResult:
    records = end - start
    return PartitionResult(stream, start, end, StartFrom.NEW, range_id=rid, records=records,
                           first_offset=start if records else None, last_offset=end - 1 if records else None,
                           output=f"/out/{stream}/{start}-{end}" if records else None, status=COMMITTED,
                           offset_stored=stored, epoch=epoch)


def test_one_piece_per_stream_keeps_the_old_shape() -> None:
    result = BatchResult("p", "rabbitmq://c1/%2F", "ev",
                         [_piece("ev-1", 0, 6, 8, 5), _piece("ev-0", 0, 5, 7, 4)])
    got = lineage_of(result)
    assert got.outputs() == {"ev-0": "/out/ev-0/0-5", "ev-1": "/out/ev-1/0-6"}
    assert got.range_ids() == {"ev-0": 7, "ev-1": 8}
    assert got.stored_offsets() == {"ev-0": 4, "ev-1": 5}
    assert [p.stream for p in got.pieces] == ["ev-0", "ev-1"]
    assert json.loads(json.dumps(got.to_dict())) == got.to_dict()


def test_several_pieces_of_a_stream_are_all_reported() -> None:
    """A pinned retry's rounds: the upper piece first in the result, stored offsets in round order."""
    result = BatchResult("p", "rabbitmq://c1/%2F", None,
                         [_piece("s", 100, 150, 12, 149), _piece("s", 0, 50, 11, 99),
                          _piece("t", 4, 4, None)])
    got = lineage_of(result)
    mine = [(p.start, p.end, p.range_id) for p in got.pieces if p.stream == "s"]
    assert mine == [(0, 50, 11), (100, 150, 12)]
    assert got.outputs() == {"s": ["/out/s/0-50", "/out/s/100-150"]}
    assert got.range_ids() == {"s": [11, 12]}
    assert got.stored_offsets() == {"s": 149}
    assert got.ends() == {"s": 150, "t": 4}
    extra = got.to_dict()
    assert extra["ranges"] == {"s": [0, 50, 100, 150], "t": [4, 4]}
    assert [p["range_id"] for p in extra["pieces"]] == [11, 12, None]


def test_the_newest_epoch_decides_where_a_stream_ends() -> None:
    """A re-created stream's offsets start again: its end and stored offset are the new epoch's."""
    result = BatchResult("p", "rabbitmq://c1/%2F", None, [_piece("s", 0, 3, 21, 2, epoch=1),
                                                           _piece("s", 100, 150, 20, 149, epoch=0)])
    got = lineage_of(result)
    assert got.ends() == {"s": 3} and got.stored_offsets() == {"s": 2}
    assert [(p.epoch, p.start) for p in got.pieces] == [(0, 100), (1, 0)]
