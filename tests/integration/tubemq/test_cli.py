"""`streamledger tubemq ...` against the emulated master (TEST DOUBLE, not a real TubeMQ server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streamledger.cli import main
from streamledger.protocol.tubemq.rpc import Method
from tests.support.tubemq_emulator import TubeMQMasterEmulator


def test_register_producer_json(
    master_pair: tuple[TubeMQMasterEmulator, TubeMQMasterEmulator], capsys: pytest.CaptureFixture[str]
) -> None:
    standby, active = master_pair
    masters = f"{standby.address_str},{active.address_str}"
    rc = main(["tubemq", "register-producer", "--masters", masters, "--topic", "demo", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["role"] == "producer" and out["master"] == active.address_str
    assert out["brokers"] == [
        {"id": 1, "host": "127.0.0.1", "port": 8130},
        {"id": 2, "host": "127.0.0.2", "port": 8123},
    ]
    assert len(out["partitions"]) == 5
    # Closed again before exiting.
    assert active.producers == {} and len(active.calls_of(Method.PRODUCER_CLOSE)) == 1


def test_register_consumer_text_with_global_json_flag_position(
    master: TubeMQMasterEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "tubemq",
        "register-consumer",
        "--masters",
        master.address_str,
        "--group",
        "grp",
        "--topic",
        "demo",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "consumer" in text and "partitions (5):" in text and "registration closed" in text
    assert master.consumers == {}
    assert main(["--json", *argv]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["group"] == "grp" and len(out["partitions"]) == 5 and out["rebalance_id"] is not None


def test_cli_errors_are_one_line(
    auth_master: TubeMQMasterEmulator, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["tubemq", "register-producer", "--masters", "nohostport", "--topic", "demo"]) == 2  # input
    assert "master address 'nohostport' is not host:port" in capsys.readouterr().err
    monkeypatch.setenv("STREAMLEDGER_TUBEMQ_PASSWORD", "wrong-password")
    argv = ["tubemq", "register-producer", "--masters", auth_master.address_str, "--topic", "demo"]
    assert main([*argv, "--user", "alice"]) == 1
    err = capsys.readouterr().err
    assert "errCode 415" in err and "wrong-password" not in err
    monkeypatch.setenv("STREAMLEDGER_TUBEMQ_PASSWORD", "s3cret")
    assert main([*argv, "--user", "alice", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["master"] == auth_master.address_str


def test_cli_as_a_subprocess(master: TubeMQMasterEmulator) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    args = ["tubemq", "register-producer", "--masters", master.address_str, "--topic", "demo", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "streamledger.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["partitions"]) == 5
