"""Dynamic task mapping: every mapped batch task keeps its own ledger identity, index 0 included."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streamledger.operators.batch import run_identity


def _ti(map_index: int | None, try_number: int | None = 1) -> SimpleNamespace:
    return SimpleNamespace(dag_id="d", run_id="r", task_id="read", map_index=map_index, try_number=try_number)


@pytest.mark.parametrize("map_index", [0, 1, 7])
def test_mapped_index_is_kept(map_index: int) -> None:
    assert run_identity(_ti(map_index)).map_index == map_index


def test_unmapped_task_is_minus_one() -> None:
    assert run_identity(_ti(-1)).map_index == -1
    assert run_identity(_ti(None)).map_index == -1
    assert run_identity(SimpleNamespace(dag_id="d", run_id="r", task_id="t", try_number=2)).map_index == -1


def test_identities_of_mapped_instances_are_distinct() -> None:
    ids = {run_identity(_ti(i)) for i in (-1, 0, 1, 2)}
    assert len(ids) == 4
