"""Issue 41 item 5: a table sink whose library is not installed (pyiceberg for ``iceberg``, deltalake
for ``delta``) is one line naming the extra to install (docs/install.md), from every face, before
anything is claimed: ``run_batch`` (under every face), ``streamledger batch run`` (exit 2, as every
missing optional library), the Airflow operator's ``execute``; the Dagster asset factory and the
component say it when the definitions load (``tests/unit/dagster``). The audit of such a table says
it too.

The library is hidden as where it is not installed: importing it finds nothing (``None`` in
``sys.modules``, its submodules other tests imported dropped for the test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamledger.batch import BatchError, run_batch
from streamledger.ledger import Ledger
from streamledger.protocol.rabbitmq import StreamClient, parse_url
from tests.integration.batch.helpers import CountingRunner, config, rid
from tests.integration.spark.helpers import create_stream

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(120)]

PIPE = "p-no-extra"
SINKS = [("iceberg", "pyiceberg", "iceberg"), ("delta", "deltalake", "delta")]


def hide(monkeypatch: pytest.MonkeyPatch, library: str) -> None:
    """``library`` as where it is not installed, for this test."""
    for name in [m for m in sys.modules if m == library or m.startswith(f"{library}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, library, None)


def advice(library: str, extra: str) -> str:
    return f'{library} is not installed: pip install "streamledger[{extra}]"'


def no_job(**_kw: Any) -> Any:
    raise AssertionError("a refused batch must not reach the job")


@pytest.mark.parametrize(("sink", "library", "extra"), SINKS)
def test_run_batch_and_the_cli_refuse_a_sink_without_its_library_in_one_line_before_any_claim(
    sink: str, library: str, extra: str, ledger: Ledger, client: StreamClient, rabbitmq_url: str,
    stream_name: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from streamledger.cli import main

    s = stream_name(f"noextra-{sink}")
    create_stream(rabbitmq_url, s, 10)
    hide(monkeypatch, library)
    with pytest.raises(BatchError) as caught:
        run_batch(config(rabbitmq_url, tmp_path, s, pipeline=PIPE, sink=sink), run=rid("t"), ledger=ledger,
                  broker=client, runner=no_job)
    said = str(caught.value)
    assert advice(library, extra) in said and "\n" not in said, said
    assert ledger.ranges(PIPE) == []

    capsys.readouterr()
    argv = ["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", PIPE, "--ledger", ledger.url,
            "--output-root", str(tmp_path), "--sink", sink]
    assert main(argv) == 2  # docs/cli.md: a missing optional dependency is bad input
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("streamledger: error: "), err
    assert advice(library, extra) in err[0], err
    assert ledger.ranges(PIPE) == []
    assert client.query_offset(s, PIPE) is None


@pytest.mark.parametrize(("sink", "library", "extra"), SINKS)
def test_the_batch_operator_fails_a_sink_without_its_library_in_one_line_before_any_claim(
    sink: str, library: str, extra: str, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the worker, where the batch runs: the DAG may be parsed where the extra is not installed."""
    from streamledger.operators import StreamBatchOperator

    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": params.password, "schema": params.vhost}))
    s = stream_name(f"noextra-op-{sink}")
    create_stream(rabbitmq_url, s, 10)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    hide(monkeypatch, library)
    op = StreamBatchOperator(task_id="read", pipeline=PIPE, stream=s, ledger_url=ledger_url,
                             output_root=str(tmp_path / "out"), sink=sink)  # parsing needs no library
    ti = SimpleNamespace(dag_id="dag", run_id="manual__1", task_id="read", map_index=-1, try_number=1)
    with pytest.raises(BatchError) as caught:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    said = str(caught.value)
    assert advice(library, extra) in said and "\n" not in said, said
    assert Ledger(ledger_url).ranges(PIPE) == []


@pytest.mark.spark
@pytest.mark.parametrize(("sink", "library", "extra"), SINKS)
def test_the_audit_of_a_table_without_its_library_is_one_line_naming_the_extra(
    sink: str, library: str, extra: str, ledger: Ledger, client: StreamClient, runner: CountingRunner,
    rabbitmq_url: str, stream_name: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The audit (``ledger audit``, ``LedgerAuditOperator``, the Dagster checks: all ``proof.audit``)
    of a pipeline that landed in a table, where the table's library is not installed: it cannot
    check the table and says why in one line (exit 2 from the command line), not a traceback."""
    from streamledger.batch.proof import audit
    from streamledger.cli import main

    s = stream_name(f"noextra-audit-{sink}")
    create_stream(rabbitmq_url, s, 10)
    run_batch(config(rabbitmq_url, tmp_path, s, pipeline=PIPE, sink=sink), run=rid("t"), ledger=ledger,
              broker=client, runner=runner)
    hide(monkeypatch, library)
    with pytest.raises(BatchError) as caught:
        audit(ledger, PIPE)
    said = str(caught.value)
    assert advice(library, extra) in said and "\n" not in said, said

    capsys.readouterr()
    assert main(["ledger", "audit", "--db", ledger.url, "--pipeline", PIPE]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("streamledger: error: "), err
    assert advice(library, extra) in err[0], err


@pytest.mark.parametrize("sink", ["directory", "iceberg"])
def test_an_s3_output_root_without_boto3_is_one_line_naming_the_extra_before_any_claim(
    sink: str, ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any, tmp_path: Path,
    s3_bucket: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A publish on S3 writes its manifest with a conditional PUT, which only boto3 sends (the ``s3``
    extra): without it the batch is refused before anything is claimed, not after its job."""
    from streamledger.cli import main

    s = stream_name(f"noboto-{sink}")
    create_stream(rabbitmq_url, s, 10)
    root = s3_bucket.uri("out")
    hide(monkeypatch, "boto3")
    hide(monkeypatch, "botocore")
    with pytest.raises(BatchError) as caught:
        run_batch(config(rabbitmq_url, root, s, pipeline=PIPE, sink=sink), run=rid("t"),
                  ledger=ledger, broker=client, runner=no_job)
    said = str(caught.value)
    assert advice("boto3", "s3") in said and "\n" not in said and s3_bucket.secret_key not in said, said
    assert ledger.ranges(PIPE) == []

    capsys.readouterr()
    argv = ["batch", "run", "--url", rabbitmq_url, "--stream", s, "--pipeline", PIPE, "--ledger", ledger.url,
            "--output-root", root, "--sink", sink]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and advice("boto3", "s3") in err[0], err
    assert ledger.ranges(PIPE) == [] and client.query_offset(s, PIPE) is None
    assert s3_bucket.keys() == []


class _Reached(Exception):
    """The job was reached: nothing refused the batch before it."""


class _HadoopPublishingRunner:
    """A classic-session runner as far as this rule goes: its ``filesystem`` is the session's Hadoop FS
    (a ``HadoopFS`` with ``hadoop-aws`` on the classpath, whose create-only write is Hadoop's
    ``create(overwrite=false)``: no boto3 anywhere; the local file system stands in for it here, as no
    hadoop-aws jar is on this machine). Its job stops the test."""

    def filesystem(self, location: str) -> Any:
        from streamledger.fs import LocalFS

        return LocalFS(atomic_rename=False)

    def __call__(self, **_kw: Any) -> Any:
        raise _Reached


def test_an_s3a_output_root_published_through_the_sessions_hadoop_fs_needs_no_boto3(
    ledger: Ledger, client: StreamClient, rabbitmq_url: str, stream_name: Any, s3_bucket: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = stream_name("noboto-hadoop")
    create_stream(rabbitmq_url, s, 10)
    root = s3_bucket.uri("out").replace("s3://", "s3a://", 1)
    hide(monkeypatch, "boto3")
    hide(monkeypatch, "botocore")
    with pytest.raises(_Reached):
        run_batch(config(rabbitmq_url, root, s, pipeline=PIPE), run=rid("t"), ledger=ledger, broker=client,
                  runner=_HadoopPublishingRunner())
