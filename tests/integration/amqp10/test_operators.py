"""The create/delete operators with the connection extra ``topology: amqp10`` on 4.3: same results
and idempotence as over the stream protocol, checked through the stream protocol itself."""

from __future__ import annotations

import json

import pytest

from streamledger.hooks.rabbitmq_stream import amqp10_url
from streamledger.protocol.amqp10 import parse_amqp_url
from streamledger.protocol.rabbitmq import StreamClient
from tests.integration.amqp10.conftest import Names
from tests.support.rabbitmq import Broker

pytestmark = [pytest.mark.rabbitmq, pytest.mark.airflow]


def test_amqp10_url_from_connection_parts() -> None:
    url = amqp10_url(
        host="broker.internal", login="svc", password="p@ss/word", vhost="prod/eu", extra={"amqp_port": 5682}
    )
    p = parse_amqp_url(url)
    assert (p.host, p.port, p.username, p.password, p.vhost, p.tls) == (
        "broker.internal",
        5682,
        "svc",
        "p@ss/word",
        "prod/eu",
        False,
    )
    tls = parse_amqp_url(
        amqp10_url(
            host="h",
            login="u",
            password="x",
            vhost=None,
            extra={
                "tls": True,
                "ca_file": "/ca.pem",
                "cert_file": "/c.pem",
                "key_file": "/c.key",
                "sasl_mechanism": "EXTERNAL",
            },
        )
    )
    assert (tls.port, tls.tls, tls.auth, tls.ca_file) == (5671, True, "external", "/ca.pem")


def test_operators_manage_topology_over_amqp10(
    monkeypatch: pytest.MonkeyPatch, broker_43: Broker, names: Names
) -> None:
    from streamledger.operators.streams import (
        CreateStreamOperator,
        CreateSuperStreamOperator,
        DeleteStreamOperator,
        DeleteSuperStreamOperator,
        StreamShapeMismatch,
    )

    monkeypatch.setenv(
        "AIRFLOW_CONN_RMQ_AMQP10",
        json.dumps(
            {
                "conn_type": "rabbitmq_stream",
                "host": broker_43.host,
                "port": broker_43.stream_port,
                "login": "guest",
                "password": "guest",
                "extra": {"topology": "amqp10", "amqp_port": broker_43.amqp_port},
            }
        ),
    )
    conn = {"rabbitmq_stream_conn_id": "rmq_amqp10"}
    from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook

    ok, message = RabbitMQStreamHook("rmq_amqp10").test_connection()
    assert ok, message
    assert message.endswith(f"; AMQP 1.0 topology via amqp://guest:***@127.0.0.1:{broker_43.amqp_port}/")
    stream = names.queue("op")
    create = CreateStreamOperator(task_id="c", stream=stream, max_age="2D", **conn)
    assert create.execute({}) == {"stream": stream, "created": True}  # type: ignore[arg-type]
    assert create.execute({}) == {"stream": stream, "created": False}  # type: ignore[arg-type]
    with pytest.raises(StreamShapeMismatch, match="inequivalent arg 'x-max-age'"):
        CreateStreamOperator(task_id="c2", stream=stream, max_age="3D", **conn).execute({})  # type: ignore[arg-type]
    with StreamClient.connect(broker_43.url) as client:
        assert client.stream_exists(stream)
    delete = DeleteStreamOperator(task_id="d", stream=stream, **conn)
    assert delete.execute({}) == {"stream": stream, "deleted": True}  # type: ignore[arg-type]
    assert delete.execute({}) == {"stream": stream, "deleted": False}  # type: ignore[arg-type]

    ss = names.super_stream("ss", partitions=2)
    op = CreateSuperStreamOperator(task_id="s", super_stream=ss, partitions=2, **conn)
    out = op.execute({})  # type: ignore[arg-type]
    assert out == {"super_stream": ss, "partitions": [f"{ss}-0", f"{ss}-1"], "created": True}
    assert op.execute({})["created"] is False  # type: ignore[arg-type]
    with pytest.raises(StreamShapeMismatch, match="more than 1 partitions"):
        CreateSuperStreamOperator(task_id="s1", super_stream=ss, partitions=1, **conn).execute({})  # type: ignore[arg-type]
    with StreamClient.connect(broker_43.url) as client:
        assert client.partitions(ss) == [f"{ss}-0", f"{ss}-1"]
    DeleteSuperStreamOperator(task_id="ds", super_stream=ss, **conn).execute({})  # type: ignore[arg-type]
    with StreamClient.connect(broker_43.url) as client:
        assert not client.stream_exists(f"{ss}-0") and not client.stream_exists(f"{ss}-1")
