"""`streamledger mewbase publish|read` against the emulated server (TEST DOUBLE, not mewbase)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bson
import pyarrow.parquet as pq
import pytest

from streamledger.cli import main
from tests.support.mewbase_emulator import MewbaseServerEmulator

ROOT = Path(__file__).resolve().parents[3]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse refused the input (exit 2)
        rc = int(exc.code or 0)
    captured = capsys.readouterr()
    out = json.loads(captured.out) if rc == 0 else {}
    return rc, out, captured.err


def test_publish_then_read_jsonl_round_trip(
    emulator: MewbaseServerEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = emulator.url()
    rc, out, _ = run(
        capsys, "mewbase", "publish", "orders", "--count", "120", "--size", "80", "--mewbase-url", url
    )
    assert rc == 0 and out["published"] == out["confirmed"] == 120 and out["channel"] == "orders"
    truth = emulator.events("orders")
    assert all(len(bson.encode(doc)) == 80 for _, _, doc in truth)
    # A range with both ends in gaps: exactly the events inside it.
    start, end = truth[10][0] + 1, truth[50][0] - 1
    target = tmp_path / "part.jsonl"
    rc, out, _ = run(
        capsys,
        "mewbase",
        "read",
        "orders",
        "--start",
        str(start),
        "--end",
        str(end),
        "--output",
        str(target),
        "--mewbase-url",
        url,
    )
    expected = [t for t in truth if start <= t[0] < end]
    assert rc == 0 and out["records"] == len(expected) == 39
    assert (out["start"], out["end"], out["first_pos"], out["last_pos"]) == (
        start,
        end,
        expected[0][0],
        expected[-1][0],
    )
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(r["pos"], r["timestamp"], r["event"]) for r in rows] == expected
    assert not (tmp_path / "part.jsonl.part").exists()


def test_read_whole_channel_to_parquet(
    emulator: MewbaseServerEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i, pos in enumerate((5, 9, 200)):
        emulator.append("p", {"i": i, "blob": bytes([i]) * 3}, pos=pos, timestamp=1_700_000_000_000 + i)
    target = tmp_path / "all.parquet"
    rc, out, _ = run(
        capsys,
        "mewbase",
        "read",
        "p",
        "--start",
        "first",
        "--end",
        "tail",
        "--output",
        str(target),
        "--mewbase-url",
        emulator.url(),
    )
    assert rc == 0 and out["records"] == 3 and (out["start"], out["end"]) == (5, 201)
    table = pq.read_table(target)
    assert table.column_names == ["channel", "pos", "timestamp", "event", "event_json"]
    assert table.column("pos").to_pylist() == [5, 9, 200]
    assert [bson.decode(b) for b in table.column("event").to_pylist()] == [
        {"i": i, "blob": bytes([i]) * 3} for i in range(3)
    ]
    assert json.loads(table.column("event_json")[2].as_py())["blob"] == {
        "$binary": {"base64": "AgIC", "subType": "00"}
    }
    assert table.column("timestamp")[0].as_py().timestamp() == 1_700_000_000


def test_cli_subprocess_with_the_url_from_the_environment(make_emulator, tmp_path: Path) -> None:
    emu = make_emulator(users={"alice": "s3cret-pw"})
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "STREAMLEDGER_MEWBASE_URL": emu.url("alice", "s3cret-pw"),
    }
    cmd = [sys.executable, "-m", "streamledger.cli", "mewbase"]
    done = subprocess.run(
        [*cmd, "publish", "env", "--count", "5"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["confirmed"] == 5
    target = tmp_path / "env.jsonl"
    done = subprocess.run(
        [*cmd, "read", "env", "--start", "0", "--end", "tail", "--output", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["records"] == 5 and len(target.read_text().splitlines()) == 5
    # Wrong password: one line on stderr, exit status 1, no password anywhere.
    env["STREAMLEDGER_MEWBASE_URL"] = emu.url("alice", "not-the-pw")
    done = subprocess.run(
        [*cmd, "publish", "env", "--count", "1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "AUTHENTICATION_FAILED" in done.stderr
    assert "not-the-pw" not in done.stderr and "s3cret-pw" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "needle", "status"),
    [  # docs/cli.md: bad input 2, a refusal by the server 1
        (["read", "c", "--start", "0", "--end", "5", "--output", "x.csv"], "must end in .parquet or .jsonl",
         2),
        (["read", "c", "--start", "soon", "--end", "5", "--output", "x.jsonl"], "'soon' is not a position",
         2),
        (["publish", "c", "--count", "-1"], "must not be negative", 2),
        (
            ["read", "missing", "--start", "0", "--end", "tail", "--output", "x.jsonl"],
            "'missing' does not exist", 1,
        ),
        (
            ["read", "c", "--start", "0", "--end", "999999", "--output", "x.jsonl", "--timeout", "0.3"],
            "end 999999 lies beyond what the server holds", 1,
        ),
    ],
)
def test_cli_errors_are_one_line(
    emulator: MewbaseServerEmulator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    needle: str,
    status: int,
) -> None:
    emulator.append("c", {"n": 1}, pos=3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STREAMLEDGER_MEWBASE_URL", emulator.url("u", "pw-secret"))
    rc, _, err = run(capsys, "mewbase", *argv)
    assert rc == status and err.startswith("streamledger") and "error: " in err and err.count("\n") == 1
    assert needle in err and "pw-secret" not in err
    assert list(tmp_path.iterdir()) == []  # no partial output left behind


def test_cli_without_a_server_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STREAMLEDGER_MEWBASE_URL", raising=False)
    rc, _, err = run(capsys, "mewbase", "publish", "c", "--count", "1")
    assert rc == 2 and "pass --broker-url or set $STREAMLEDGER_MEWBASE_URL" in err
