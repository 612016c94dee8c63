"""`streamledger ledger ...`: exit codes, JSON, HTML, and clear errors (SQLite; PostgreSQL and a real
broker in tests/integration/ledger/test_cli_pg.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamledger.cli import main
from streamledger.ledger import Ledger
from tests.unit.ledger.util import SRC, raw, run


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["ledger", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def make_history(url: str) -> Ledger:
    ledger = Ledger(url)
    for n, end in enumerate((10, 20, 30), start=1):
        r = ledger.claim("p", SRC, end, run(n), initial_start=0)
        ledger.commit(r.id, records=1, first_seen=r.start, last_seen=r.start, output=f"/out/{n}")
    return ledger


def test_upgrade_audit_ranges_release(
    capsys: pytest.CaptureFixture[str], sqlite_url: str, tmp_path: Path
) -> None:
    rc, out, _ = cli(capsys, "upgrade", "--db", sqlite_url)
    assert rc == 0 and "empty -> 0020_source_seen_chunk" in out
    rc, out, _ = cli(capsys, "upgrade", "--db", sqlite_url)
    assert rc == 0 and "0020_source_seen_chunk -> 0020_source_seen_chunk" in out
    ledger = make_history(sqlite_url)

    rc, out, _ = cli(capsys, "audit", "--db", sqlite_url, "--no-outputs")
    assert rc == 0 and "CLEAN" in out
    rc, out, _ = cli(capsys, "ranges", "--db", sqlite_url, "--json")
    rows = json.loads(out)
    assert rc == 0 and [(r["start"], r["end"], r["status"]) for r in rows] == [
        (0, 10, "committed"),
        (10, 20, "committed"),
        (20, 30, "committed"),
    ]
    rc, out, err = cli(capsys, "ranges", "--db", sqlite_url, "--pipeline", "p")
    assert rc == 0 and re.search(r"\[10, 20\)\s+committed ", out) and "3 range(s)" in err

    middle = rows[1]["id"]
    raw(ledger, "DELETE FROM streamledger_range WHERE id = :id", id=middle)
    html = tmp_path / "audit.html"
    rc, out, _ = cli(capsys, "audit", "--db", sqlite_url, "--json", "--html", str(html), "--no-outputs")
    report = json.loads(out)
    assert rc == 1 and report["clean"] is False and report["violations"][0]["kind"] == "gap"
    assert "gap [10, 20)" in html.read_text()
    # the top-level --json counts too
    rc = main(["--json", "ledger", "audit", "--db", sqlite_url, "--no-outputs"])
    out = capsys.readouterr().out
    assert rc == 1 and json.loads(out)["violation_counts"] == {"gap": 1}

    ledger.claim("p", SRC, 40, run(9), initial_start=0)
    rc, out, err = cli(capsys, "release-stale", "--db", sqlite_url, "--older-than", "0")
    assert rc == 0 and "[30, 40) failed" in out and "1 stale claim(s) released" in err
    rc, out, err = cli(capsys, "audit", "--db", sqlite_url, "--pipeline", "nobody", "--no-outputs")
    assert rc == 2 and "'nobody'" in err  # issue 43: an unknown pipeline is bad input, not a clean audit
    rc, out, _ = cli(capsys, "downgrade", "--db", sqlite_url, "--revision", "base")
    assert rc == 0 and "-> empty" in out
    ledger.close()


def test_errors_are_one_line_without_secrets(capsys: pytest.CaptureFixture[str], sqlite_url: str) -> None:
    # docs/cli.md: a missing file, an empty database (no ledger in either) or an unreachable server is exit 3
    rc, _out, err = cli(capsys, "audit", "--db", sqlite_url)
    assert rc == 3 and "does not exist" in err and err.count("\n") == 1
    Path(sqlite_url.removeprefix("sqlite:///")).touch()
    rc, _out, err = cli(capsys, "audit", "--db", sqlite_url)
    assert rc == 3 and err.startswith("streamledger: error: no ledger schema") and err.count("\n") == 1
    rc, _out, err = cli(capsys, "audit", "--db", "postgresql://alice:s3cret@127.0.0.1:1/x")
    assert rc == 3 and "s3cret" not in err and "***" in err and err.count("\n") == 1


def test_installed_entry_point(sqlite_url: str) -> None:
    exe = Path(sys.executable).with_name("streamledger")
    proc = subprocess.run(
        [str(exe), "ledger", "upgrade", "--db", sqlite_url], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [str(exe), "ledger", "audit", "--db", sqlite_url, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["clean"] is True


def test_unreachable_broker_is_a_clear_error(capsys: pytest.CaptureFixture[str], sqlite_url: str) -> None:
    assert main(["ledger", "upgrade", "--db", sqlite_url]) == 0
    capsys.readouterr()
    rc, _out, err = cli(
        capsys, "audit", "--db", sqlite_url, "--broker-url", "rabbitmq-stream://u:pw1234@127.0.0.1:1/"
    )
    assert rc == 3 and err.startswith("streamledger: error:") and "pw1234" not in err


def test_recorded_names_of_one_broker_in_the_audit_and_rename_broker_clears_them(
    capsys: pytest.CaptureFixture[str], sqlite_url: str
) -> None:
    """Without outputs and without a broker: two recorded names that both hold a history fail the
    audit (the offsets both read); `rename-broker OLD NEW` of a recorded name without a history
    makes it one name with NEW and clears its record, the others' stay."""
    from streamledger.ledger import SourceRef

    cli(capsys, "upgrade", "--db", sqlite_url)
    ledger = make_history(sqlite_url)
    other = SourceRef("rabbitmq://west/%2F", SRC.stream)
    r = ledger.claim("p", other, 5, run(9), initial_start=0)
    ledger.commit(r.id, records=1, first_seen=0, last_seen=0, output="/out/w")
    ledger.record_same_broker("p", SRC.stream, [SRC.broker, other.broker], "found")
    rc, out, _ = cli(capsys, "audit", "--db", sqlite_url, "--no-outputs", "--json")
    assert rc == 1 and json.loads(out)["violation_counts"] == {"overlap": 1}, out
    third = "rabbitmq://north/%2F"
    ledger.record_same_broker("p", SRC.stream, [SRC.broker, third], "refused")
    rc, out, _ = cli(capsys, "rename-broker", "--db", sqlite_url, third, SRC.broker)
    assert rc == 0 and "0 source(s) moved" in out
    assert sorted(x.other for x in ledger.same_broker("p")) == [SRC.broker, other.broker]
    ledger.close()


def test_distinct_brokers_records_the_verdict_and_the_audit_is_clean(
    capsys: pytest.CaptureFixture[str], sqlite_url: str
) -> None:
    """`distinct-brokers NAME1 NAME2` records that two recorded names are two brokers (mirrors a chunk
    print cannot tell apart): the audit that failed on the record is clean after it; one line, JSON too."""
    from streamledger.ledger import SourceRef

    cli(capsys, "upgrade", "--db", sqlite_url)
    ledger = make_history(sqlite_url)
    other = SourceRef("rabbitmq://west/%2F", SRC.stream)
    r = ledger.claim("p", other, 5, run(9), initial_start=0)
    ledger.commit(r.id, records=1, first_seen=0, last_seen=0, output="/out/w")
    ledger.record_same_broker("p", SRC.stream, [SRC.broker, other.broker], "found")
    rc, out, _ = cli(capsys, "audit", "--db", sqlite_url, "--no-outputs")
    assert rc == 1 and "distinct-brokers" in out, out
    rc, out, _ = cli(capsys, "distinct-brokers", "--db", sqlite_url, SRC.broker, other.broker,
                     "--pipeline", "p", "--stream", SRC.stream, "--reason", "mirrored clusters")
    assert rc == 0 and out.count("\n") == 1 and "1 stream(s)" in out, out
    assert [(x.distinct, x.why) for x in ledger.same_broker("p")] == 2 * [(True, "mirrored clusters")]
    rc, out, _ = cli(capsys, "audit", "--db", sqlite_url, "--no-outputs", "--json")
    assert rc == 0 and json.loads(out)["violation_counts"] == {}, out
    rc, _out, err = cli(capsys, "distinct-brokers", "--db", sqlite_url, SRC.broker, "rabbitmq://x/%2F",
                        "--pipeline", "q")
    assert rc != 0 and "nothing to judge" in err and err.count("\n") == 1, err
    ledger.close()
