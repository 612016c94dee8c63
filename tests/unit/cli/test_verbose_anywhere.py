"""``-v`` is accepted before or after the command, like every common flag (docs/cli.md): a newcomer
typing ``streamledger batch run … -v`` got "unrecognized arguments" (issue 33's friction list)."""

from __future__ import annotations

import pytest

from streamledger.cli import build_parser, main


@pytest.mark.parametrize("argv", [["-v", "status"], ["status", "-v"], ["status", "--verbose"],
                                  ["ledger", "ranges", "-v"], ["-v", "ledger", "audit", "--verbose"]])
def test_verbose_is_a_flag_before_or_after_the_command(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).verbose is True


def test_without_the_flag_it_is_off_wherever_the_command() -> None:
    assert build_parser().parse_args(["ledger", "ranges"]).verbose is False


def test_a_verbose_command_that_fails_still_exits_with_its_own_code(tmp_path: object) -> None:
    # a ledger that is not there: exit 3 (unreachable), not 2 (a usage error about -v)
    assert main(["status", "--ledger", "sqlite:////nonexistent-dir/x.db", "-v"]) == 3
