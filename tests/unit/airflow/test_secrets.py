"""Secrets: every form of a password is redacted by Airflow's real secret masker once a hook has read
it or a URL template field has been rendered, and the spark-submit command the provider's hook
builds carries only the path of the file holding the URL. (The whole path under ``airflow dags
test`` is tests/e2e/test_secrets.py.)"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from airflow.sdk._shared.secrets_masker import redact

import streamledger.spark.job as job
from streamledger.hooks.ledger import OffsetLedgerHook
from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook
from streamledger.operators.batch import SparkSubmitRunner, StreamBatchOperator
from streamledger.spark.planning import PlanningError

FORMS = sorted({"u1tR4/s3cr3t@%", quote("u1tR4/s3cr3t@%", safe=""), quote("u1tR4/s3cr3t@%")})


def _shown(text: str) -> list[str]:
    redacted = str(redact(text))
    return [form for form in FORMS if form in redacted]


def test_broker_hook_registers_the_encoded_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RMQ_SECRET", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": "h", "login": "svc", "password": FORMS[-1]}))
    url = RabbitMQStreamHook("rmq_secret").get_url()
    assert quote(FORMS[-1], safe="") in url
    assert _shown(f"connecting to {url}; user info {url.split('@')[0]}") == []


def test_ledger_hook_registers_the_password_of_a_given_url() -> None:
    url = f"postgresql+psycopg://sl:{quote('Ledg3r/pw@%', safe='')}@db:5432/ledger"
    assert OffsetLedgerHook(ledger_url=url).get_url() == url
    text = f"{url} | {url.split('@')[0]} | {quote('Ledg3r/pw@%')} | Ledg3r/pw@%"
    assert str(redact(text)) == "*** | postgresql+psycopg://sl:*** | *** | ***"


def test_a_rendered_ledger_url_is_registered_before_airflow_stores_it() -> None:
    from airflow.sdk.execution_time.task_runner import _serialize_rendered_fields

    secret = "R3nd3r/pw@%"
    op = StreamBatchOperator(task_id="read", pipeline="p", stream="s",
                             ledger_url="{{ params.scheme }}://sl:{{ params.pw | urlencode }}@db/ledger",
                             params={"scheme": "postgresql+psycopg", "pw": secret})
    op.render_template_fields({"params": op.params})
    assert quote(secret) in str(op.ledger_url)  # rendered for real (Jinja's urlencode keeps "/")
    stored = json.dumps(_serialize_rendered_fields(op))
    assert quote(secret, safe="") not in stored and quote(secret) not in stored and secret not in stored
    assert '"ledger_url": "***"' in stored
    assert str(redact(f"password {quote(secret)} / {quote(secret, safe='')}")) == "password *** / ***"


@pytest.mark.parametrize("mode", ["client", "cluster"])
def test_spark_submit_on_yarn_carries_the_url_file_not_the_url(
    mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN_T", json.dumps(
        {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": mode}}))
    url = f"rabbitmq-stream://svc:{quote(FORMS[-1], safe='')}@broker:5552/"
    runner = SparkSubmitRunner("spark_yarn_t", submit_kwargs={"files": "/etc/extra.conf"})
    with job.url_file(url) as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.read_text().strip() == url
        hook = runner.hook(path, ranges={"s": (0, 5)}, output=str(tmp_path), fmt="parquet", splits=1)
        command = hook._build_spark_submit_command(job.__file__)
    assert not path.parent.exists(), "the private directory outlives the submit"
    text = " ".join(command)
    assert not [form for form in FORMS if form in text], text
    assert command[command.index("--url-file") + 1] == str(path)
    assert "spark.yarn.appMasterEnv.SPARK_LOCAL_IP=127.0.0.1" in text  # env vars still go as --conf
    if mode == "cluster":
        assert command[command.index("--files") + 1] == f"/etc/extra.conf,{path}"
    else:
        assert command[command.index("--files") + 1] == "/etc/extra.conf"


def test_job_finds_a_shipped_url_file_in_its_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlanningError, match="no such file"):
        job.read_url_file("/nonexistent/streamledger-url")
    (tmp_path / "streamledger-url").write_text("rabbitmq-stream://a:b@h:5552/\n")
    assert job.read_url_file("/nonexistent/streamledger-url") == "rabbitmq-stream://a:b@h:5552/"


def test_job_cli_reads_the_url_file(tmp_path: Path) -> None:
    """``--url-file`` feeds the URL in (an unreachable broker: the error names it, redacted)."""
    import subprocess

    with job.url_file("rabbitmq-stream://svc:Cl1P4ss%2Fword@127.0.0.1:9/") as path:
        proc = subprocess.run(
            [sys.executable, job.__file__, "--url-file", str(path), "--ranges", '{"s": [0, 1]}',
             "--output", str(tmp_path / "o")], capture_output=True, text=True, timeout=120,
            env={**os.environ, "STREAMLEDGER_RABBITMQ_URL": ""}, check=False,
        )
    assert proc.returncode == 2, proc.stderr
    assert "127.0.0.1:9" in proc.stderr and "Cl1P4ss" not in proc.stderr, proc.stderr


def test_catalog_connection_registers_every_secret_of_its_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: an Iceberg catalog's properties come from a connection's extra; its REST credential,
    its storage key and the password in a SQL catalog's URI (every form) are masked once read."""
    from streamledger.hooks.catalog import CatalogConnectionError, catalog_properties

    pw = "Cat4log/pw@%"
    uri = f"postgresql+psycopg://cat:{quote(pw, safe='')}@db:5432/catalog"
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_SECRET", json.dumps({"conn_type": "generic", "extra": {
        "type": "sql", "uri": uri, "warehouse": "s3://lake/wh", "credential": "client:Cr3dential",
        "s3.secret-access-key": "S3cr3tKey/xyz"}}))
    props = catalog_properties("lake_secret")
    assert props["uri"] == uri and props["warehouse"] == "s3://lake/wh"
    text = f"{uri} | {pw} | {quote(pw, safe='')} | client:Cr3dential | S3cr3tKey/xyz | s3://lake/wh"
    assert str(redact(text)) == "*** | *** | *** | *** | *** | s3://lake/wh"
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_EMPTY", json.dumps({"conn_type": "generic"}))
    with pytest.raises(CatalogConnectionError, match="'lake_empty': its extra must be a JSON object"):
        catalog_properties("lake_empty")
