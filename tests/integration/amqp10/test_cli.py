"""The CLI round trip over AMQP 1.0 on 4.3 and 4.0 (as a subprocess, the way users run it), and the
one clear error line on 3.10, whose AMQP port speaks 0-9-1 only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.amqp10.conftest import HttpApi, Names, amqp_url
from tests.support.rabbitmq import Broker

pytestmark = pytest.mark.rabbitmq
SRC = str(Path(__file__).resolve().parents[3] / "src")


def cli(
    *args: str, url: str | None = None, stream_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("STREAMLEDGER_AMQP_URL", None)
    if url is not None:
        env["STREAMLEDGER_AMQP_URL"] = url
    if stream_url is not None:  # the same broker's stream endpoint (the global --url)
        env["STREAMLEDGER_RABBITMQ_URL"] = stream_url
    return subprocess.run(
        [sys.executable, "-m", "streamledger.cli", "amqp", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_cli_stream_and_super_stream_round_trip(amqp_broker: Broker, http_api: HttpApi, names: Names) -> None:
    url = amqp_url(amqp_broker)
    name = names.queue("cli") + "/x"
    names.queues.append(name)
    r = cli(
        "stream",
        "create",
        name,
        "--max-age",
        "7D",
        "--max-length-bytes",
        "1000000000",
        "--max-segment-size-bytes",
        "10000000",
        "--initial-cluster-size",
        "1",
        "--leader-locator",
        "client-local",
        "--amqp-url",
        url,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"created stream {name} (leader rabbit")
    assert http_api.queue(name)["arguments"]["x-queue-leader-locator"] == "client-local"

    r = cli("stream", "info", name, "--json", url=url)  # broker from STREAMLEDGER_AMQP_URL
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    node = f"rabbit{amqp_broker.version.replace('.', '')}@localhost"
    assert info["leader"] == node and info["members"] == [node] and info["message_count"] == 0
    assert info["arguments"]["x-max-age"] == "7D" and info["type"] == "stream"
    r = cli("stream", "info", name, url=url)
    assert f"leader: {node}" in r.stdout and "message_count: 0" in r.stdout

    r = cli("stream", "purge", name, url=url)
    assert r.returncode == 1 and r.stdout == ""
    assert (
        r.stderr == f"streamledger: error: purge queue '{name}': 400: purge not supported by queue "
        f"'{name}' in vhost '/'\n"
    )

    assert cli("stream", "delete", name, url=url).returncode == 0
    r = cli("stream", "info", name, url=url)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "404" in r.stderr

    ss = names.super_stream("ss", partitions=2)
    r = cli("superstream", "create", ss, "--partitions", "2", "--max-age", "1D", "--json", url=url)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"super_stream": ss, "partitions": [f"{ss}-0", f"{ss}-1"]}
    with StreamClient.connect(amqp_broker.url) as client:
        assert client.partitions(ss) == [f"{ss}-0", f"{ss}-1"]
    r = cli("superstream", "delete", ss, url=url)
    assert r.returncode == 0 and r.stdout.strip() == f"deleted super stream {ss}: {ss}-0, {ss}-1"
    assert http_api.exchange(ss) is None

    keyed = names.super_stream("keys", keys=["a", "b/c"])
    assert cli("superstream", "create", keyed, "--binding-keys", "a,b/c", url=url).returncode == 0
    with StreamClient.connect(amqp_broker.url) as client:
        assert client.route(keyed, "b/c") == [f"{keyed}-b/c"]
    r = cli("superstream", "delete", keyed, "--binding-keys", "a,b/c", url=url)
    assert r.returncode == 0 and http_api.queue(f"{keyed}-b/c") is None


def test_cli_super_stream_delete_removes_keyed_partitions(
    amqp_broker: Broker, http_api: HttpApi, names: Names
) -> None:
    """Issue 20: a super stream made with --binding-keys loses its partition streams (and their
    data) on delete, as the stream protocol's DeleteSuperStream does; the exchange is not deleted
    alone."""
    url = amqp_url(amqp_broker)
    keyed = names.super_stream("regions", keys=["eu", "us"])
    assert cli("superstream", "create", keyed, "--binding-keys", "eu,us", url=url).returncode == 0
    with StreamClient.connect(amqp_broker.url) as client:
        client.publish(f"{keyed}-eu", [b"kept?"])
    r = cli("superstream", "delete", keyed, url=url, stream_url=amqp_broker.url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"deleted super stream {keyed}: {keyed}-eu, {keyed}-us"
    assert http_api.exchange(keyed) is None
    assert http_api.queue(f"{keyed}-eu") is None and http_api.queue(f"{keyed}-us") is None


def test_cli_amqp_delete_without_a_partition_list_refuses_and_keeps_everything(
    amqp_broker: Broker, http_api: HttpApi, names: Names
) -> None:
    """Without the stream port to ask (here: a port nothing listens on), a keyed super stream's
    partitions cannot be named over AMQP 1.0: the delete refuses before deleting the exchange."""
    url = amqp_url(amqp_broker)
    keyed = names.super_stream("nolist", keys=["eu", "us"])
    assert cli("superstream", "create", keyed, "--binding-keys", "eu,us", url=url).returncode == 0
    r = cli("superstream", "delete", keyed, url=url, stream_url="rabbitmq-stream://guest:guest@127.0.0.1:9/")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot list them; give its binding keys" in r.stderr
    assert http_api.exchange(keyed) is not None and http_api.queue(f"{keyed}-eu") is not None
    r = cli("superstream", "delete", keyed, "--binding-keys", "eu,us", url=url)
    assert r.returncode == 0 and http_api.queue(f"{keyed}-us") is None


def test_one_tree_with_the_transport_as_an_option(
    amqp_broker: Broker, http_api: HttpApi, names: Names
) -> None:
    """``streamledger superstream ... --transport amqp10`` is the same command as ``amqp
    superstream``; over the stream protocol the same re-create says the same line."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "streamledger.cli", "--url", amqp_broker.url, *args],
                              capture_output=True, text=True, env=env, timeout=60, check=False)

    keyed = names.super_stream("tree", keys=["eu", "us"])
    amqp = ("--transport", "amqp10", "--amqp-url", amqp_url(amqp_broker))
    assert run("superstream", "create", keyed, "--binding-keys", "eu,us", *amqp).returncode == 0
    r = run("--json", "superstream", "partitions", keyed, *amqp)
    assert r.returncode == 0 and json.loads(r.stdout)["partitions"] == [f"{keyed}-eu", f"{keyed}-us"]
    r = run("superstream", "delete", keyed, *amqp)
    assert r.stdout.strip() == f"deleted super stream {keyed}: {keyed}-eu, {keyed}-us", r.stderr
    assert http_api.queue(f"{keyed}-eu") is None

    name = names.queue("tree")
    assert run("stream", "create", name, "--max-age", "7D").returncode == 0
    r = run("stream", "create", name, "--max-age", "1D", "--exists-ok")
    assert r.returncode == 1 and r.stderr == (
        f"streamledger: error: stream {name!r} already exists with other arguments\n"
    )


def test_cli_recreating_a_stream_with_other_arguments_says_so(
    amqp_broker: Broker, names: Names
) -> None:
    """Issue 20: one line naming the stream and the reason, not the broker's raw 409 text."""
    url = amqp_url(amqp_broker)
    name = names.queue("args")
    assert cli("stream", "create", name, "--max-age", "7D", url=url).returncode == 0
    assert cli("stream", "create", name, "--max-age", "7D", url=url).returncode == 0  # same: fine
    r = cli("stream", "create", name, "--max-age", "1D", url=url)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"streamledger: error: stream {name!r} already exists with other arguments")
    assert r.stderr.count("\n") == 1 and "x-max-age" in r.stderr  # the broker's reason, as the detail


def test_cli_errors_are_one_line_without_password(broker_43: Broker) -> None:
    r = cli("stream", "info", "x", "--amqp-url", amqp_url(broker_43, password="s3cret-pw"))
    assert r.returncode == 1
    assert r.stderr == (
        "streamledger: error: amqp://guest:***@127.0.0.1:5672/: SASL PLAIN login refused "
        "(outcome auth; check user, password and vhost access)\n"
    )
    r = cli("superstream", "create", "x", url=amqp_url(broker_43))
    assert r.returncode == 2  # docs/cli.md: bad usage
    assert r.stderr == (
        "streamledger: error: amqp superstream create needs exactly one of --partitions N "
        "or --binding-keys a,b\n"
    )
    r = cli("stream", "create", "x", "--max-age", "7 days", url=amqp_url(broker_43))
    assert r.returncode == 2 and "not a RabbitMQ duration" in r.stderr and r.stderr.count("\n") == 1


def test_cli_on_310_says_why_in_one_line(broker_310: Broker) -> None:
    r = cli(
        "stream",
        "create",
        "x",
        "--amqp-url",
        f"amqp://guest:pw-310@{broker_310.host}:{broker_310.amqp_port}/",
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == (
        f"streamledger: error: 127.0.0.1:{broker_310.amqp_port} speaks AMQP 0-9-1 only, not "
        "AMQP 1.0 (RabbitMQ 3.x without AMQP 1.0; topology over AMQP 1.0 needs RabbitMQ 4.0 "
        "or later)\n"
    )


def test_help_stays_fast_and_lists_amqp() -> None:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "streamledger.cli", "amqp", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=60,
        check=True,
    )
    assert "stream" in r.stdout and "superstream" in r.stdout
    # the client is imported only when a command runs (the shared codec comes with the stream CLI)
    assert "streamledger.protocol.amqp10.connection" not in r.stderr
    assert "streamledger.protocol.amqp10.management" not in r.stderr
