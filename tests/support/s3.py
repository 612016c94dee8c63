"""An S3-compatible server on loopback: moto's server mode (the one s3fs's own tests run against).

* ``s3_server`` (session): starts ``moto_server`` on 127.0.0.1:55960 once, under an ``fcntl`` lock in
  ``$STREAMLEDGER_HOME`` so parallel pytest processes share one server, and leaves it running for the
  next run (like the brokers and PostgreSQL). Returns its endpoint URL. The server is in memory: a
  restart forgets every bucket, which no test relies on.
* ``s3_bucket``: a fresh bucket per test, and this process's environment set to reach it the way a
  user's would be (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_ENDPOINT_URL``/
  ``AWS_REGION``). The secret is random per test, so a test can look for it in captured output.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HOST = "127.0.0.1"
PORT = int(os.environ.get("STREAMLEDGER_S3_PORT", "55960"))


def _home() -> Path:
    return Path(os.environ.get("STREAMLEDGER_HOME", "/var/tmp/streamledger"))


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _moto_server() -> str:
    """The ``moto_server`` script next to this interpreter (the dev extra installs it)."""
    candidate = Path(sys.executable).with_name("moto_server")
    if not candidate.exists():
        raise RuntimeError("moto_server is not installed next to this Python; install the dev extra "
                           "(pip install -e '.[dev]', which has moto[server])")
    return str(candidate)


@pytest.fixture(scope="session")
def s3_server() -> str:
    return start_server()


def start_server() -> str:
    """The shared server's endpoint, started if none answers (the benchmarks use it too)."""
    home = _home()
    home.mkdir(parents=True, exist_ok=True)
    endpoint = f"http://{HOST}:{PORT}"
    with open(home / ".s3-fixture.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            if not _answers(PORT):
                log = open(home / "moto-server.log", "ab")  # noqa: SIM115 - the server keeps it open
                subprocess.Popen([_moto_server(), "-H", HOST, "-p", str(PORT)], stdout=log, stderr=log,
                                 stdin=subprocess.DEVNULL, start_new_session=True, cwd=home)
                deadline = time.monotonic() + 60
                while not _answers(PORT):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"moto_server did not answer on {endpoint} within 60 s "
                                           f"(see {home / 'moto-server.log'})")
                    time.sleep(0.2)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    status = _status(endpoint)
    if status >= 500:  # e.g. a server left running by an installation that is gone: every call fails
        raise RuntimeError(f"the S3 server on {endpoint} answers HTTP {status} to a bucket listing; "
                           f"stop it (its log: {home / 'moto-server.log'}) or set STREAMLEDGER_S3_PORT")
    return endpoint


def _status(endpoint: str) -> int:
    """The HTTP status of a plain bucket listing (moto takes it unsigned)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{endpoint}/", timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@dataclass(frozen=True)
class Bucket:
    name: str
    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3://{self.name}", *parts])

    def filesystem(self) -> object:
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, scheme="http",
                                 endpoint_override=self.endpoint.split("://", 1)[1], region="us-east-1")

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` (no directory markers)."""
        import pyarrow.fs as pafs

        fs = self.filesystem()
        root = f"{self.name}/{prefix}".rstrip("/")
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))  # type: ignore[attr-defined]
        return sorted(i.path[len(self.name) + 1:] for i in infos if i.type == pafs.FileType.File)

    def environment(self) -> dict[str, str]:
        """The ``AWS_*`` settings a process reaching the bucket gets (its environment, never its
        command line)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}


#: Settings that would send a process elsewhere than the bucket's server: left out of its environment.
OTHER_SETTINGS = ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN")


def new_bucket(endpoint: str) -> Bucket:
    """A fresh bucket on the server at ``endpoint``, with random credentials (moto takes any)."""
    import pyarrow.fs as pafs

    bucket = Bucket(f"sl-{uuid.uuid4().hex[:12]}", endpoint, "AKIA" + secrets.token_hex(8).upper(),
                    "sl-secret-" + secrets.token_hex(16))
    fs = pafs.S3FileSystem(access_key=bucket.access_key, secret_key=bucket.secret_key, scheme="http",
                           endpoint_override=endpoint.split("://", 1)[1], region="us-east-1",
                           allow_bucket_creation=True)
    fs.create_dir(bucket.name)
    return bucket


@pytest.fixture
def s3_bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bucket]:
    for name in OTHER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    bucket = new_bucket(s3_server)
    for name, value in bucket.environment().items():
        monkeypatch.setenv(name, value)
    yield bucket
