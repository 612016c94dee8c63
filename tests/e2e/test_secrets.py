"""Passwords under ``airflow dags test``: a batch submitted to YARN (client mode) with a broker password
and a templated ``ledger_url`` holding a database password must show neither password, in any form,
in the task logs, in Airflow's database (rendered template fields above all) or on the spark-submit
command line and environment.

The YARN cluster is the only stand-in: a ``spark-submit`` first on ``PATH`` records the argv and the
environment the provider's ``SparkSubmitHook`` gives it, then runs the real ``spark-submit`` with the
master ``yarn`` swapped for ``local[1]``. Everything else is real: the hook builds a YARN command, the
broker user and the PostgreSQL role have the password, the job reads and commits the range.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from tests.e2e.conftest import Scenario, connection_json
from tests.support.rabbitmq import Broker

pytestmark = [pytest.mark.airflow, pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.spark,
              pytest.mark.slow]

PASSWORD = "s3cr3t/p@ss%"  # "/", "@" and "%" all percent-encode
FORMS = sorted({PASSWORD, quote(PASSWORD, safe=""), quote(PASSWORD)})

WRAPPER = """#!{python}
import json, os, sys
with open({capture!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv, "env": dict(os.environ)}}) + "\\n")
args = sys.argv[1:]
args[args.index("--master") + 1] = "local[1]"
os.execv({real!r}, [{real!r}, *args])
"""


@pytest.fixture
def broker_user(broker_43: Broker) -> Iterator[str]:
    """A broker URL for a fresh user whose password is ``PASSWORD``."""
    user = f"sl-secret-{uuid.uuid4().hex[:8]}"
    broker_43.cli("rabbitmqctl", "-q", "add_user", user, PASSWORD)
    try:
        broker_43.cli("rabbitmqctl", "-q", "set_permissions", "-p", "/", user, ".*", ".*", ".*")
        yield f"rabbitmq-stream://{user}:{quote(PASSWORD, safe='')}@{broker_43.host}:{broker_43.stream_port}/"
    finally:
        broker_43.cli("rabbitmqctl", "-q", "delete_user", user)


@pytest.fixture
def ledger_role(postgres_url: str) -> Iterator[str]:
    """A ledger URL on a fresh database for a fresh role whose password is ``PASSWORD``."""
    import psycopg
    from psycopg import sql

    role = f"sl_secret_{uuid.uuid4().hex[:8]}"
    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role),
                                                                         sql.Literal(PASSWORD)))
        conn.execute(sql.SQL("GRANT ALL ON SCHEMA public TO {}").format(sql.Identifier(role)))
    parts = urlsplit(postgres_url)
    with psycopg.connect(admin.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("GRANT ALL ON DATABASE {} TO {}").format(sql.Identifier(parts.path[1:]),
                                                                      sql.Identifier(role)))
    try:
        where = f"{parts.hostname}:{parts.port}{parts.path}"
        yield f"postgresql+psycopg://{role}:{quote(PASSWORD, safe='')}@{where}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _leaks(where: str, text: str) -> list[str]:
    """Each form of the password found in ``text``, with what surrounds its first occurrence."""
    found = []
    for form in FORMS:
        at = text.find(form)
        if at >= 0:
            found.append(f"{where}: {form!r} in ...{text[max(0, at - 80):at + 40]!r}...")
    return found


@pytest.mark.timeout(900)
@pytest.mark.parametrize("scenario", [1], indirect=True)
def test_no_password_in_logs_rendered_fields_or_spark_submit_command(
    scenario: Scenario, broker_user: str, ledger_role: str, tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    capture = tmp_path / "spark-submit.jsonl"
    real = Path(sys.executable).with_name("spark-submit")
    wrapper = bin_dir / "spark-submit"
    wrapper.write_text(WRAPPER.format(python=sys.executable, capture=str(capture), real=str(real)))
    wrapper.chmod(0o755)

    scenario.create_super_stream()
    (end,) = scenario.publish_waves(waves=1, per_wave=20)
    env = {
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": connection_json(broker_user),
        "AIRFLOW_CONN_SPARK_YARN": json.dumps({"conn_type": "spark", "host": "yarn"}),
        "STREAMLEDGER_SPARK_CONN_ID": "spark_yarn",
        "AIRFLOW_VAR_STREAMLEDGER_LEDGER_URL": ledger_role,
        "STREAMLEDGER_DAG_LEDGER_URL": "{{ var.value.streamledger_ledger_url }}",
        "PATH": f"{bin_dir}:{real.parent}:{scenario.af.environ()['PATH']}",
    }
    output = scenario.dags_test("streamledger_backfill", end, extra=env)

    # It ran for real: the hook built a YARN command, the job committed the range in the role's ledger.
    submits = [json.loads(line) for line in capture.read_text().splitlines()]
    assert len(submits) == 1 and "yarn" in submits[0]["argv"], submits[0]["argv"] if submits else None
    scenario.assert_exactly_once(set(scenario.published))
    from streamledger.ledger import Ledger

    with Ledger(ledger_role) as ledger:
        assert [str(r.status) for r in ledger.ranges(scenario.pipeline)] == ["committed"]

    leaks = _leaks("dags test output", output)
    for log in sorted((scenario.af.home / "logs").rglob("*")):
        if log.is_file():
            leaks += _leaks(f"log {log.relative_to(scenario.af.home)}", log.read_text(errors="replace"))
    with sqlite3.connect(scenario.af.home / "airflow.db") as db:
        for (fields,) in db.execute("SELECT rendered_fields FROM rendered_task_instance_fields"):
            leaks += _leaks("rendered_task_instance_fields", str(fields))
        leaks += _leaks("airflow.db", "\n".join(db.iterdump()))
    leaks += _leaks("spark-submit argv", " ".join(submits[0]["argv"]))
    # The task's own environment defines the test's connections (AIRFLOW_CONN_*, AIRFLOW_VAR_*) and
    # spark-submit inherits it; what matters is what the runner adds.
    added = {k: v for k, v in submits[0]["env"].items()
             if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_"))}
    leaks += _leaks("spark-submit environment", json.dumps(added))
    assert not leaks, "the password leaked:\n" + "\n".join(leaks)
    # ... and the rendered ledger_url is there, masked
    with sqlite3.connect(scenario.af.home / "airflow.db") as db:
        rendered = [json.loads(f) for (f,) in db.execute(
            "SELECT rendered_fields FROM rendered_task_instance_fields "
            "WHERE dag_id = 'streamledger_backfill' AND task_id = 'read_interval'")]
    urls = [r["ledger_url"] for r in rendered if r.get("ledger_url") not in (None, "None", "")]
    assert urls and all("***" in str(u) for u in urls), rendered
