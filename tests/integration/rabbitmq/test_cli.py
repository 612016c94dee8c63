"""The CLI round trip on each broker: full on 4.3 and 4.0; on 3.10 the commands the broker lacks
fail with one clear line and a non-zero exit, and everything else still works."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from streamledger.cli import main
from tests.support.rabbitmq import Broker, StreamNames

pytestmark = pytest.mark.rabbitmq


def run(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    rc = main(["--url", url, *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_round_trip(any_broker: Broker, stream_name: StreamNames, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    url = any_broker.url
    name = stream_name("cli")
    assert run(capsys, url, "stream", "create", name, "--max-age", "1h")[0] == 0
    rc, out, _ = run(capsys, url, "publish", name, "--count", "3000", "--size", "100")
    assert rc == 0 and "published 3000 messages" in out and "msgs/s" in out
    rc, out, _ = run(capsys, url, "--json", "publish", name, "--count", "500", "--size", "20", "--raw")
    assert rc == 0 and json.loads(out)["confirmed"] == 500

    rc, out, err = run(capsys, url, "--json", "stream", "stats", name)
    if any_broker.version == "3.10":
        assert rc == 1 and out == ""
        assert err.strip() == (
            "streamledger: error: StreamStats is not supported by RabbitMQ 3.10.8; "
            "StreamStats appeared in RabbitMQ 3.12"
        )
    else:
        assert rc == 0
        stats = json.loads(out)
        assert stats["committed_tail"] == 3500 and stats["first_offset"] == 0

    parquet = tmp_path / "range.parquet"
    rc, out, _ = run(capsys, url, "read", name, "--start", "10", "--end", "2990", "--output", str(parquet))
    assert rc == 0
    assert json.loads(out) | {"output": None} == {
        "stream": name, "start": 10, "end": 2990, "records": 2980, "first_offset": 10, "last_offset": 2989,
        "output": None,
    }
    table = pq.read_table(parquet)
    assert table.column_names == ["stream", "offset", "chunk_timestamp", "body", "properties",
                                  "application_properties"]
    assert table.column("offset").to_pylist() == list(range(10, 2990))
    assert table.column("body").to_pylist()[0].startswith(b"10:")

    jsonl = tmp_path / "tail.jsonl"
    rc, out, _ = run(capsys, url, "read", name, "--start", "2995", "--end", "tail", "--output", str(jsonl))
    assert rc == 0 and json.loads(out)["records"] == 505
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["offset"] for r in rows] == list(range(2995, 3500))
    assert rows[-1]["body"] == "499:xxxxxxxxxxxxxxxx"

    assert run(capsys, url, "offset", "store", name, "app", "1234")[0] == 0
    assert run(capsys, url, "offset", "query", name, "app")[1].strip() == "1234"
    rc, out, _ = run(capsys, url, "--json", "offset", "query", name, "nobody")
    assert rc == 0 and json.loads(out)["offset"] is None

    rc, _, err = run(capsys, url, "read", name, "--start", "0", "--end", "999999",
                     "--output", str(tmp_path / "x.jsonl"))
    assert rc == 1 and "range end 999999 is beyond the committed tail" in err and err.count("\n") == 1
    assert not (tmp_path / "x.jsonl").exists()

    super_name = stream_name.super_stream("clis")
    rc, out, err = run(capsys, url, "superstream", "create", super_name, "--partitions", "2")
    if any_broker.version == "3.10":
        assert rc == 1 and "CreateSuperStream is not supported by RabbitMQ 3.10.8" in err
        rc, _, err = run(capsys, url, "superstream", "delete", super_name)
        assert rc == 1 and "DeleteSuperStream is not supported by RabbitMQ 3.10.8" in err
    else:
        assert rc == 0
        rc, out, _ = run(capsys, url, "--json", "superstream", "partitions", super_name)
        assert json.loads(out)["partitions"] == [f"{super_name}-0", f"{super_name}-1"]
        assert run(capsys, url, "superstream", "delete", super_name)[0] == 0
        rc, _, err = run(capsys, url, "superstream", "partitions", super_name)
        assert rc == 1 and "STREAM_DOES_NOT_EXIST" in err

    assert run(capsys, url, "stream", "delete", name)[0] == 0
    rc, _, err = run(capsys, url, "stream", "delete", name)
    assert rc == 1 and err.startswith("streamledger: error: Delete on stream") and err.count("\n") == 1


def test_cli_errors_never_show_the_password(broker_43: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    url = broker_43.url.replace("guest:guest@", "guest:Hunter2Secret@")
    rc, out, err = run(capsys, url, "stream", "stats", "whatever")
    assert rc == 1 and "AUTHENTICATION_FAILURE" in err
    assert "Hunter2Secret" not in out + err
    rc, _, err = run(capsys, "rabbitmq-stream://guest:Hunter2Secret@127.0.0.1:1/", "stream", "stats", "x",
                     "--timeout", "2")
    assert rc == 3 and "cannot connect to 127.0.0.1:1" in err and "Hunter2Secret" not in err  # unreachable
