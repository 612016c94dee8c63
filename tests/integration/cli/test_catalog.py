"""``batch run --sink iceberg``'s catalog from the command line (issue 33): a catalog type pyiceberg does not
know is bad input (exit 2, docs/cli.md) refused before the ledger or the broker is touched; catalog secrets
come from ``--catalog-file`` and never show in the command's output, and a secret-looking property given
with ``--catalog`` is refused, since a command line is visible to every process on the machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli.helpers import cli, tree
from tests.integration.spark.helpers import create_stream

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(300)]

SECRET = "Sup3r-s3cret-4ccess"


def batch(rabbitmq_url: str, tmp_path: Path, stream: str, *extra: str) -> list[str]:
    return ["batch", "run", "--broker-url", rabbitmq_url, "--stream", stream, "--pipeline", "cat",
            "--ledger", f"sqlite:///{tmp_path / 'state' / 'ledger.sqlite'}",
            "--output-root", str(tmp_path / "out"), "--sink", "iceberg", *extra]


def test_an_unknown_catalog_type_is_bad_input(rabbitmq_url: str, stream_name: Any, tmp_path: Path) -> None:
    s = stream_name("cat-type")
    create_stream(rabbitmq_url, s, 5)
    r = cli(*batch(rabbitmq_url, tmp_path, s, "--catalog", "type=bogus", "--catalog", "uri=http://127.0.0.1:1"))
    assert r.rc == 2, r.err
    assert "bogus" in r.one_error_line() and "type" in r.one_error_line()
    assert tree(tmp_path) == []  # no ledger, no output


def test_catalog_properties_from_a_file_never_show_their_secret(
    rabbitmq_url: str, stream_name: Any, tmp_path: Path, spark_connect: str
) -> None:
    """The run that reaches the catalog runs its job on the suite's Spark Connect server (the catalog is
    loaded after the job): the secret's path is the same, without a cold local JVM."""
    s = stream_name("cat-file")
    create_stream(rabbitmq_url, s, 5)
    props = tmp_path / "catalog.properties"
    props.write_text(f"# the team's catalog\ntype = bogus\nuri=http://127.0.0.1:1\ncredential={SECRET}\n")
    r = cli(*batch(rabbitmq_url, tmp_path, s, "--catalog-file", str(props)))
    assert r.rc == 2 and "bogus" in r.one_error_line(), r.err  # the file was read
    assert SECRET not in r.out + r.err

    # pyiceberg's own errors quote the properties: here the URI it cannot infer a catalog type from
    props.write_text(f"uri=mysql://u:{SECRET}@127.0.0.1:1/db\ncredential={SECRET}\n")
    r = cli("-v", *batch(rabbitmq_url, tmp_path, s, "--catalog-file", str(props)),
            env={"STREAMLEDGER_SPARK_REMOTE": spark_connect})
    assert r.rc == 1 and "Could not infer the catalog type" in r.err, r.err
    assert SECRET not in r.out + r.err

    r = cli(*batch(rabbitmq_url, tmp_path, s, "--catalog-file", str(tmp_path / "missing.properties")))
    assert r.rc == 2 and "missing.properties" in r.one_error_line()


@pytest.mark.parametrize("given", [f"credential={SECRET}", f"s3.secret-access-key={SECRET}",
                                   f"token={SECRET}", f"uri=postgresql+psycopg://u:{SECRET}@127.0.0.1:1/db"])
def test_a_secret_on_the_command_line_is_refused(given: str, tmp_path: Path) -> None:
    nobody = "rabbitmq-stream://127.0.0.1:1/"
    r = cli(*batch(nobody, tmp_path, "s", "--catalog", "type=rest", "--catalog", given))
    assert r.rc == 2, r.err
    assert "--catalog-file" in r.one_error_line() and SECRET not in r.err
    assert tree(tmp_path) == []
