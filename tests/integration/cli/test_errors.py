"""docs/cli.md's exit status and one-line errors, on the real command (issue 33; issue 30 defect 10):
bad input exits 2 before any server is contacted, an unreachable server or store exits 3, every error
is one line without a traceback, a closed pipe is not an error, and a read-only command creates
nothing. Servers that must *not* answer are addresses nothing listens on (port 1 on loopback)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from streamledger.ledger import Ledger
from tests.integration.cli.helpers import cli, tree
from tests.support.s3 import Bucket

NOBODY_BROKER = "rabbitmq-stream://guest:guest@127.0.0.1:1/"
NOBODY_PG = "postgresql+psycopg://alice:s3cr3t@127.0.0.1:1/ledger"


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    Ledger(url, create=True).close()
    return url


def test_version() -> None:
    from importlib.metadata import version

    r = cli("--version")
    assert r.rc == 0, r.err
    assert r.out.strip() == f"streamledger {version('streamledger')}"


@pytest.mark.parametrize("command", [["ledger", "audit"], ["ledger", "ranges"], ["ledger", "release-stale",
                                     "--older-than", "60"], ["ledger", "downgrade", "--revision", "base"]])
def test_a_missing_sqlite_ledger_is_not_created(tmp_path: Path, command: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'nowhere' / 'x.db'}"
    r = cli(*command, "--db", url)
    assert r.rc == 3, r.err
    line = r.one_error_line()
    assert "x.db" in line and "does not exist" in line
    assert tree(tmp_path) == []  # neither the directory nor the file


def test_the_ledger_flag_and_its_variable_on_a_read_only_command(tmp_path: Path, sqlite_ledger: str) -> None:
    assert cli("ledger", "ranges", "--ledger", sqlite_ledger).rc == 0
    assert cli("ledger", "ranges", env={"STREAMLEDGER_LEDGER_URL": sqlite_ledger}).rc == 0
    missing = f"sqlite:///{tmp_path / 'missing.sqlite'}"
    assert cli("ledger", "ranges", env={"STREAMLEDGER_LEDGER_URL": missing}).rc == 3
    assert not (tmp_path / "missing.sqlite").exists()


def test_an_unreachable_postgres_ledger_is_one_line_and_exit_3() -> None:
    r = cli("ledger", "audit", "--db", NOBODY_PG)
    assert r.rc == 3, r.err
    line = r.one_error_line()
    assert "s3cr3t" not in line and "sqlalche.me" not in line and "Background" not in line
    assert "127.0.0.1:1" in line


def test_an_at_sign_in_the_password_never_shows_any_of_it() -> None:
    r = cli("ledger", "audit", "--db", "postgresql+psycopg://alice:s3cr3t@tail9@127.0.0.1:1/ledger")
    line = r.one_error_line()
    assert "s3cr3t" not in line and "tail9" not in line
    assert r.rc == 2  # refused as input: the @ must be written %40


def test_a_closed_stdout_is_not_a_traceback(sqlite_ledger: str) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written, as with `| head -0`
    with os.fdopen(write_end, "w") as out:
        r = cli("ledger", "ranges", "--json", "--db", sqlite_ledger, stdout=out)
    assert "Traceback" not in r.err and "BrokenPipe" not in r.err, r.err
    assert r.err.strip() == "" or "range(s)" in r.err
    assert r.rc == 141


def test_an_html_report_that_cannot_be_written(sqlite_ledger: str) -> None:
    r = cli("ledger", "audit", "--db", sqlite_ledger, "--html", "/proc/x.html")
    assert r.rc == 2, r.err
    assert "/proc/x.html" in r.one_error_line()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["read", "s", "--start", "abc", "--end", "next", "--output", "{tmp}/x.jsonl"], "--start"),
        (["read", "s", "--start", "first", "--end", "-4", "--output", "{tmp}/x.jsonl"], "--end"),
        (["publish", "s", "--count", "abc"], "--count"),
        (["batch", "run", "--stream", "s", "--pipeline", "p", "--output-root", "{tmp}/out",
          "--max-offsets", "-3"], "--max-offsets"),
        (["batch", "run", "--stream", "s", "--pipeline", "p", "--output-root", "{tmp}/out",
          "--remote", "http://foo"], "--remote"),
        (["batch", "run", "--stream", "s", "--pipeline", "p", "--output-root", "{tmp}/out",
          "--initial-position", "sometime"], "--initial-position"),
        (["batch", "run", "--stream", "s", "--pipeline", "p", "--output-root", "{tmp}/out",
          "--splits", "0"], "--splits"),
        (["batch", "run", "--stream", "s", "--pipeline", "p", "--output-root", "{tmp}/out",
          "--on-data-loss", "ignore"], "--on-data-loss"),
        (["batch", "run", "--stream", "s", "--pipeline", "p", "--output-root", "{tmp}/out",
          "--interval-start", "yesterday"], "--interval-start"),
        (["batch", "run", "--stream", "s", "--pipeline", "p", "--output-root", "{tmp}/out",
          "--conf", "novalue"], "--conf"),
        (["batch", "run", "--stream", "s", "--pipeline", "p", "--output-root", "{tmp}/out",
          "--interval-start", "2026-01-02T00:00:00Z"], "interval"),
    ],
)
def test_bad_input_exits_2_before_anything_is_contacted_or_created(
    tmp_path: Path, argv: list[str], named: str
) -> None:
    ledger = tmp_path / "ledger" / "new.sqlite"
    r = cli("--broker-url", NOBODY_BROKER, *[a.replace("{tmp}", str(tmp_path)) for a in argv],
            env={"STREAMLEDGER_LEDGER_URL": f"sqlite:///{ledger}"})
    assert r.rc == 2, r.err
    assert named in r.one_error_line()
    assert tree(tmp_path) == []  # no ledger, no output root


@pytest.mark.parametrize("url", ["rabbitmq-stream://guest:guest@127.0.0.1:abc/", "http://foo/"])
def test_a_broker_url_that_does_not_parse_exits_2(url: str) -> None:
    r = cli("stream", "stats", "s", "--broker-url", url)
    assert r.rc == 2, r.err
    assert "ValueError" not in r.one_error_line()


@pytest.mark.parametrize("argv", [["stream", "stats", "s", "--json"],
                                  ["offset", "query", "s", "ref", "--json"],
                                  ["publish", "s", "--count", "1", "--json"]])
def test_an_unreachable_broker_exits_3_and_json_is_accepted(argv: list[str]) -> None:
    r = cli(*argv, "--broker-url", NOBODY_BROKER)
    assert r.rc == 3, r.err
    assert "127.0.0.1:1" in r.one_error_line()


def test_the_old_flag_names_still_work(sqlite_ledger: str) -> None:
    r = cli("--url", NOBODY_BROKER, "stream", "stats", "s")
    assert r.rc == 3 and "127.0.0.1:1" in r.one_error_line()
    r = cli("stream", "stats", "s", "--url", NOBODY_BROKER)
    assert r.rc == 3
    assert cli("ledger", "ranges", "--db", sqlite_ledger).rc == 0
    helptext = cli("ledger", "ranges", "--help").out
    assert "--ledger" in helptext and not re.search(r"--db\b", helptext)


def test_check_says_what_does_not_work_and_creates_nothing(tmp_path: Path) -> None:
    r = cli("check", "--broker-url", NOBODY_BROKER, "--ledger", f"sqlite:///{tmp_path / 'no' / 'x.db'}",
            "--output-root", str(tmp_path / "out"))
    assert r.rc == 3, r.out + r.err
    lines = dict(line.split(None, 1) for line in r.out.splitlines())
    assert lines["broker"].startswith("FAIL") and "127.0.0.1:1" in lines["broker"]
    assert lines["ledger"].startswith("ok") and "does not exist yet" in lines["ledger"]  # batch run makes it
    assert lines["output"].startswith("ok")
    assert tree(tmp_path) == []
    r = cli("check", "--broker-url", NOBODY_BROKER, "--ledger", NOBODY_PG)
    assert r.rc == 3
    assert dict(line.split(None, 1) for line in r.out.splitlines())["ledger"].startswith("FAIL")


def test_check_tries_an_s3_output_root_and_never_prints_its_secret(s3_bucket: Bucket, tmp_path: Path) -> None:
    """``check --output-root s3://...`` said "ok ... reached through Spark (not checked)" for any
    object-store URI, and printed it as given: ``s3://KEY:SECRET@bucket`` showed the secret key on
    stdout, and a bucket that does not exist passed although ``batch run`` refuses it. It now makes
    the batch's own check (one metadata call: nothing created) and masks the URI."""
    env = {"AWS_ACCESS_KEY_ID": s3_bucket.access_key, "AWS_SECRET_ACCESS_KEY": s3_bucket.secret_key,
           "AWS_ENDPOINT_URL": s3_bucket.endpoint, "AWS_REGION": "us-east-1",
           "STREAMLEDGER_BROKER_URL": "rabbitmq-stream://127.0.0.1:1/"}
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"

    def output_line(root: str) -> str:
        r = cli("check", "--ledger", ledger, "--output-root", root, env=env, timeout=120)
        assert s3_bucket.secret_key not in r.out + r.err
        return next(line for line in r.out.splitlines() if line.startswith("output"))

    assert output_line(s3_bucket.uri("out")).split()[:2] == ["output", "ok"]
    assert output_line(f"s3://{s3_bucket.name}-missing/out").split()[:2] == ["output", "FAIL"]
    with_secret = f"s3://{s3_bucket.access_key}:{s3_bucket.secret_key}@{s3_bucket.name}/out"
    assert output_line(with_secret).split()[:2] == ["output", "FAIL"]
    assert s3_bucket.keys() == []  # nothing created


@pytest.fixture(params=["sqlite", "postgres"])
def schemaless_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database that answers but holds no ledger: an empty SQLite file, an empty PostgreSQL database."""
    if request.param == "sqlite":
        (tmp_path / "empty.sqlite").touch()
        return f"sqlite:///{tmp_path / 'empty.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.mark.parametrize("command", [["ledger", "audit"], ["ledger", "ranges"], ["status"]])
def test_no_ledger_in_a_database_exits_3_with_the_cli_hint(schemaless_ledger: str,
                                                           command: list[str]) -> None:
    from streamledger.ledger import migrate
    from streamledger.ledger.engine import make_engine

    r = cli(*command, "--ledger", schemaless_ledger)
    line = r.one_error_line()
    assert r.rc == 3, r.err
    assert "streamledger ledger upgrade" in line and "create=True" not in line, line
    engine = make_engine(schemaless_ledger, create=False)
    try:
        assert migrate.current(engine) is None  # a reading command created no schema
    finally:
        engine.dispose()
