"""The progress line (docs/cli.md, "Output"): count against the plan, rate and ETA; lines at most every
$STREAMLEDGER_PROGRESS_SECONDS, always a closing one; a vanished stderr never fails the work."""

from __future__ import annotations

import io

import pytest

from streamledger.cli.progress import Progress


def test_the_line_names_count_rate_and_eta() -> None:
    p = Progress("read s [0, 1000)", total=1000, unit="offsets", stream=io.StringIO())
    p.count = 250
    line = p.line(now=p.started + 10.0)
    assert line == ("streamledger: read s [0, 1000): 250 / 1,000 offsets, 25%, 25 offsets/s, ETA 0:00:30, "
                    "elapsed 0:00:10")


def test_lines_are_throttled_and_the_last_one_is_always_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMLEDGER_PROGRESS_SECONDS", "3600")
    out = io.StringIO()
    p = Progress("read s", total=30, unit="offsets", stream=out)
    assert list(p.track([[1] * 10, [1] * 10, [1] * 10], size=len)) == [[1] * 10] * 3
    assert out.getvalue() == ""
    p.done(records=29)
    (line,) = out.getvalue().splitlines()
    assert "30 / 30 offsets, 100%" in line and line.endswith("; 29 records")


def test_a_closed_stderr_does_not_fail_the_work() -> None:
    closed = io.StringIO()
    closed.close()
    p = Progress("read s", total=None, stream=closed)
    p.advance(5)
    p.done()
