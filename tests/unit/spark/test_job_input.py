"""``python -m streamledger.spark.job --ranges``: bad offsets are one line naming ``ranges``, exit 2,
nothing written, no broker or JVM touched (issue 19, item 10)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamledger.spark.job import main
from streamledger.spark.planning import PlanningError, parse_bound, parse_ranges

BIG = "1" + "0" * 5000


@pytest.mark.parametrize(
    ("ranges", "why"),
    [
        ('{"s": ["\u0661\u0662", 20]}', "expected an integer offset"),  # Arabic-Indic digits
        ('{"s": [0, "\uff11\uff12"]}', "expected an integer offset"),  # full-width digits
        ('{"s": [0, "1_000"]}', "expected an integer offset"),
        ('{"s": [0, ' + BIG + "]}", "too many digits"),
        ('{"s": [0, "' + BIG + '"]}', "at most 2\\*\\*63-1, got 5001 digits"),
        ('{"s": [0, 9223372036854775808]}', "2\\*\\*63"),
    ],
)
def test_bad_ranges_through_the_job_entry_point(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ranges: str, why: str
) -> None:
    out_dir = tmp_path / "out"
    # The URL names a closed port: reaching the broker would be a different error.
    rc = main(["--url", "rabbitmq-stream://guest:guest@127.0.0.1:1/", "--ranges", ranges,
               "--output", str(out_dir)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(("error: ranges[s]", "error: ranges:")) and re.search(why, err), err
    assert not out_dir.exists()


def test_the_module_entry_point_prints_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "streamledger.spark.job", "--url", "rabbitmq-stream://127.0.0.1:1/",
         "--ranges", '{"s": [0, ' + BIG + "]}", "--output", str(tmp_path / "out")],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "ranges" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_largest_offset_is_accepted() -> None:
    assert parse_ranges('{"s": [0, 9223372036854775807]}') == {"s": (0, 2**63 - 1)}
    with pytest.raises(PlanningError, match="2\\*\\*63"):
        parse_bound(str(2**63), what="startingOffsets")
