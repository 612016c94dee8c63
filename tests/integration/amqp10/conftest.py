"""Fixtures: the AMQP 1.0 brokers (4.3 and 4.0), unique names cleaned up over AMQP 1.0, the HTTP API.

Names are removed with our own management client after each test (one request each) rather than
the broker CLI (about a second per call), which keeps these tests fast.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest

from streamledger.protocol.amqp10 import Management
from tests.support.rabbitmq import SCRIPT, Broker, port_open

AMQPS_PORT = 5671


def amqp_url(broker: Broker, *, user: str = "guest", password: str = "guest") -> str:
    return f"amqp://{user}:{password}@{broker.host}:{broker.amqp_port}/"


@pytest.fixture(params=["4.3", "4.0"])
def amqp_broker(request: pytest.FixtureRequest) -> Broker:
    """Each test using this runs against RabbitMQ 4.3 and 4.0 (the /management node is 4.0+)."""
    fixture = {"4.3": "broker_43", "4.0": "broker_40"}[request.param]
    broker: Broker = request.getfixturevalue(fixture)
    return broker


@pytest.fixture
def management(amqp_broker: Broker) -> Iterator[Management]:
    with Management.connect(amqp_url(amqp_broker)) as m:
        yield m


@dataclass
class Names:
    """Unique names for one test; deleted afterwards (queues, exchanges) over AMQP 1.0."""

    slug: str
    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)

    def queue(self, hint: str = "") -> str:
        name = "-".join(p for p in ("t-amqp", self.slug, hint, uuid.uuid4().hex[:8]) if p)
        self.queues.append(name)
        return name

    def super_stream(self, hint: str = "", keys: list[str] | None = None, partitions: int = 0) -> str:
        name = self.queue(hint)
        self.queues.pop()
        self.exchanges.append(name)
        self.queues += [f"{name}-{k}" for k in (keys if keys is not None else map(str, range(partitions)))]
        return name


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Iterator[Names]:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name.removeprefix("test_")).strip("-").lower()[:30]
    made = Names(slug)
    yield made
    brokers = [request.getfixturevalue(f) for f in ("broker_43", "broker_40") if f in request.fixturenames]
    if "amqp_broker" in request.fixturenames:
        brokers.append(request.getfixturevalue("amqp_broker"))
    for broker in {b.version: b for b in brokers}.values():
        try:
            with Management.connect(amqp_url(broker)) as m:
                for x in made.exchanges:
                    m.delete_exchange(x)
                for q in made.queues:
                    m.delete_queue(q)
        except Exception:
            pass


class HttpApi:
    """The management plugin's HTTP API on loopback (guest/guest): an independent view of topology."""

    def __init__(self, broker: Broker) -> None:
        self.base = f"http://{broker.host}:{broker.mgmt_port}/api"
        self.auth = "Basic " + base64.b64encode(b"guest:guest").decode()

    def get(self, *segments: str) -> Any:
        path = "/".join(quote(s, safe="") for s in segments)
        req = urllib.request.Request(f"{self.base}/{path}", headers={"Authorization": self.auth})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def queue(self, name: str) -> Any:
        return self.get("queues", "/", name)

    def exchange(self, name: str) -> Any:
        return self.get("exchanges", "/", name)

    def bindings_from(self, exchange: str) -> list[dict[str, Any]]:
        found = self.get("exchanges", "/", exchange, "bindings", "source")
        return sorted(found or [], key=lambda b: b["destination"])


@pytest.fixture
def http_api(amqp_broker: Broker) -> HttpApi:
    return HttpApi(amqp_broker)


@dataclass(frozen=True)
class Amqps:
    url: str
    external_url: str
    wrong_ca_url: str


@pytest.fixture(scope="session")
def amqps(broker_43: Broker) -> Amqps:
    """The 4.3 broker's AMQPS listener (5671) and the test PKI of scripts/tls.sh.

    ``rabbitmq.sh wait`` adds the listener to a node started from an older template and (re)creates
    the certificate user; it is idempotent and quick when everything is in place.
    """
    subprocess.run([str(SCRIPT), "wait", "4.3"], check=True, capture_output=True, timeout=300)
    assert port_open(broker_43.host, AMQPS_PORT), "AMQPS listener 5671 did not come up"
    from tests.support.rabbitmq import streamledger_home

    tls = streamledger_home() / "tls"
    base = f"localhost:{AMQPS_PORT}/?ca_file={tls}/ca.pem"
    return Amqps(
        url=f"amqps://guest:guest@{base}",
        external_url=f"amqps://{base}&auth=external&cert_file={tls}/client.pem&key_file={tls}/client.key",
        wrong_ca_url=f"amqps://guest:guest@localhost:{AMQPS_PORT}/?ca_file={tls}/wrong-ca.pem",
    )
