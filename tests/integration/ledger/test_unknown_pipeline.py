"""A pipeline (or stream) the ledger has no record of is bad input, not a clean empty answer (issue 43,
item 5): `ledger audit`, `status` and `ledger ranges` exit 2 naming it, and a name too long to be a
pipeline exits 2 as well (docs/cli.md: 1 is the audit's findings). Both ledgers."""

from __future__ import annotations

import uuid

import pytest

from streamledger.cli import main
from streamledger.ledger import Ledger, SourceRef
from tests.unit.ledger.util import run

SRC = SourceRef("rabbitmq://c1/%2F", "s")


@pytest.mark.parametrize("command", [["ledger", "audit", "--no-outputs"], ["status"], ["ledger", "ranges"]])
def test_an_unknown_or_too_long_pipeline_is_exit_2_naming_it(
    any_ledger: Ledger, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    r = any_ledger.claim("p-known", SRC, 10, run(1), initial_start=0)
    any_ledger.commit(r.id, records=1, first_seen=0, last_seen=0, output="/out/known")
    capsys.readouterr()
    assert main([*command, "--db", any_ledger.url, "--pipeline", "p-known"]) == 0
    capsys.readouterr()
    assert main([*command, "--db", any_ledger.url, "--pipeline", "p-knwon"]) == 2
    err = capsys.readouterr().err
    assert "'p-knwon'" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as refused:  # argparse's refusal
        main([*command, "--db", any_ledger.url, "--pipeline", "p" * 300])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "255" in err and len(err.strip().splitlines()) == 1, err


def test_ranges_of_an_unknown_stream_is_exit_2_naming_it(
    any_ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    r = any_ledger.claim("p-known-s", SRC, 10, run(1), initial_start=0)
    any_ledger.commit(r.id, records=1, first_seen=0, last_seen=0, output="/out/known")
    argv = ["ledger", "ranges", "--db", any_ledger.url, "--pipeline", "p-known-s", "--stream"]
    assert main([*argv, "s"]) == 0
    capsys.readouterr()
    assert main([*argv, "nope"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and len(err.strip().splitlines()) == 1, err


def test_ranges_of_a_stream_no_pipeline_has_read_is_exit_2_naming_it(
    any_ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ledger ranges --stream X`` without ``--pipeline`` listed nothing and exited 0 when no pipeline
    has a history of X (a typo read as a clean, empty answer); now the same one-line refusal as with a
    pipeline. ``status`` takes no ``--stream``: argparse refuses the flag, also exit 2 in one line."""
    known, unknown = f"s-{uuid.uuid4().hex[:8]}", f"nope-{uuid.uuid4().hex[:8]}"
    r = any_ledger.claim("p-any-s", SourceRef("rabbitmq://c1/%2F", known), 10, run(1), initial_start=0)
    any_ledger.commit(r.id, records=1, first_seen=0, last_seen=0, output="/out/any")
    argv = ["ledger", "ranges", "--db", any_ledger.url, "--stream"]
    capsys.readouterr()
    assert main([*argv, known]) == 0
    assert "p-any-s" in capsys.readouterr().out
    assert main([*argv, unknown]) == 2
    captured = capsys.readouterr()
    assert f"'{unknown}'" in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    assert captured.out == ""
    with pytest.raises(SystemExit) as refused:
        main(["status", "--db", any_ledger.url, "--stream", unknown])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "--stream" in err and len(err.strip().splitlines()) == 1, err
