"""Spark settings from the command line (issue 33's red team): ``--conf`` on ``batch run`` and
``spark-server start`` refuses a secret-looking setting (an S3 secret key, a token), since a command
line is visible to every process on the machine; secrets come from ``--conf-file``, and the Connect
server receives them in a private properties file, never on its ``spark-submit`` command line."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from streamledger.spark import connect
from tests.integration.cli.helpers import cli, tree

SECRET = "Sp4rk-s3cret-v4lue"
NOBODY = "rabbitmq-stream://127.0.0.1:1/"


def batch(tmp_path: Path, *extra: str) -> list[str]:
    return ["batch", "run", "--broker-url", NOBODY, "--stream", "s", "--pipeline", "conf",
            "--ledger", f"sqlite:///{tmp_path / 'state' / 'ledger.sqlite'}",
            "--output-root", str(tmp_path / "out"), *extra]


@pytest.mark.parametrize("given", [f"spark.hadoop.fs.s3a.secret.key={SECRET}",
                                   f"spark.hadoop.fs.s3a.session.token={SECRET}"])
def test_a_secret_spark_setting_on_the_command_line_is_refused(given: str, tmp_path: Path) -> None:
    for argv in (batch(tmp_path, "--conf", given), ["spark-server", "start", "--conf", given]):
        r = cli(*argv, home=tmp_path / "home")
        assert r.rc == 2, r.err
        assert "--conf-file" in r.one_error_line() and SECRET not in r.out + r.err
    assert tree(tmp_path / "out") == [] and not (tmp_path / "state").exists()


def test_a_malformed_conf_file_is_bad_input_named_by_path_and_line(tmp_path: Path) -> None:
    conf = tmp_path / "spark.properties"
    conf.write_text(f"# s3\nspark.hadoop.fs.s3a.secret.key={SECRET}\nnot a setting\n")
    r = cli(*batch(tmp_path, "--conf-file", str(conf)))
    assert r.rc == 2 and "spark.properties" in r.one_error_line() and "line 3" in r.one_error_line(), r.err
    assert SECRET not in r.out + r.err
    r = cli(*batch(tmp_path, "--conf-file", str(tmp_path / "missing.properties")))
    assert r.rc == 2 and "missing.properties" in r.one_error_line()


def test_the_connect_server_gets_secrets_in_a_private_file_not_its_command_line(tmp_path: Path) -> None:
    settings = {"spark.hadoop.fs.s3a.secret.key": SECRET, "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9"}
    cmd = connect.server_command(4040, "local[1]", settings, root=tmp_path)
    assert SECRET not in " ".join(cmd)
    assert "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9" in cmd  # plain settings stay visible
    props = Path(cmd[cmd.index("--properties-file") + 1])
    assert props.parent == tmp_path and f"spark.hadoop.fs.s3a.secret.key={SECRET}" in props.read_text()
    assert stat.S_IMODE(props.stat().st_mode) == 0o600
