"""The manifest read after a spark-submit run when the object store stops answering (issue 35).

A private moto server (not the shared one) is paused with SIGSTOP: its socket still accepts, but no
request is answered, as when a store hangs. The read must fail in one line naming the manifest and
the reason (a StreamledgerError: the try fails and is retried), never a raw ``OSError``.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamledger.errors import StreamledgerError
from streamledger.spark import runners
from tests.support.s3 import HOST, _answers, _moto_server

pytestmark = pytest.mark.timeout(300)

Server = tuple[str, subprocess.Popen[bytes]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@pytest.fixture
def private_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    port = _free_port()
    log = open(tmp_path / "moto.log", "ab")  # noqa: SIM115 - the server keeps it open
    proc = subprocess.Popen([_moto_server(), "-H", HOST, "-p", str(port)], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not _answers(port):
            assert proc.poll() is None and time.monotonic() < deadline, "moto_server did not start"
            time.sleep(0.2)
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA" + secrets.token_hex(8).upper())
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sl-secret-" + secrets.token_hex(16))
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{HOST}:{port}")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        yield f"http://{HOST}:{port}", proc
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=30)
        log.close()


def test_manifest_read_from_a_paused_store_is_one_line(private_s3: Server) -> None:
    import pyarrow.fs as pafs

    endpoint, proc = private_s3
    bucket = f"sl-{uuid.uuid4().hex[:12]}"
    store = pafs.S3FileSystem(access_key=os.environ["AWS_ACCESS_KEY_ID"],
                              secret_key=os.environ["AWS_SECRET_ACCESS_KEY"], scheme="http",
                              endpoint_override=endpoint.split("://", 1)[1], region="us-east-1",
                              allow_bucket_creation=True)
    store.create_dir(bucket)
    with store.open_output_stream(f"{bucket}/out/_manifest.json") as f:
        f.write(b'{"range_id": 1}')
    output = f"s3://{bucket}/out"
    assert runners.read_manifest(output) == {"range_id": 1}  # the store answers: read as before

    os.killpg(proc.pid, signal.SIGSTOP)
    with pytest.raises(StreamledgerError) as caught:
        runners.read_manifest(output)
    text = str(caught.value)
    assert "\n" not in text, text
    assert f"{output}/_manifest.json" in text, text
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in text
