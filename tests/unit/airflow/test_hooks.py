"""Hooks: connection -> URL mapping (pure), connections from Airflow env vars, and test_connection
against the real broker."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from streamledger.hooks.ledger import OffsetLedgerHook, default_ledger_url, ledger_url_from_connection
from streamledger.hooks.rabbitmq_stream import RabbitMQStreamHook, connection_url
from streamledger.hooks.tubemq import TubeMQHook, parse_masters
from streamledger.protocol.rabbitmq import parse_url


def test_plain_connection_url_round_trips_through_the_client_parser() -> None:
    url = connection_url(host="broker.internal", port=5552, login="svc", password="p@ss/word",
                         vhost="prod/eu", extra={})
    params = parse_url(url)
    assert (params.host, params.port, params.username, params.password, params.vhost, params.tls) == (
        "broker.internal", 5552, "svc", "p@ss/word", "prod/eu", False)


def test_a_clusters_other_nodes_from_extra_become_the_clients_fallbacks() -> None:
    url = connection_url(host="rabbit-1", port=5552, login="svc", password="pw", vhost=None,
                         extra={"nodes": "rabbit-2:5552,[fd00::3]:5552"})
    params = parse_url(url)
    assert params.addresses == [("rabbit-1", 5552), ("rabbit-2", 5552), ("fd00::3", 5552)]
    assert "pw" not in repr(params)


def test_tls_options_from_extra() -> None:
    url = connection_url(host="localhost", port=None, login="guest", password="guest", vhost=None,
                         extra={"tls": "true", "ca_file": "/pki/ca.pem", "cert_file": "/pki/c.pem",
                                "key_file": "/pki/c.key", "verify": False, "sasl_mechanism": "external"})
    params = parse_url(url)
    assert params.tls and params.port == 5551 and params.vhost == "/"
    assert (params.ca_file, params.cert_file, params.key_file) == ("/pki/ca.pem", "/pki/c.pem", "/pki/c.key")
    assert params.verify is False and params.auth == "external"


def test_external_auth_without_tls_is_refused() -> None:
    with pytest.raises(ValueError, match="EXTERNAL needs tls"):
        connection_url(host="h", port=1, login=None, password=None, vhost=None,
                       extra={"sasl_mechanism": "EXTERNAL"})


def test_hook_reads_airflow_connection_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_MY_STREAM", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": "10.0.0.5", "port": 5552, "login": "u", "password": "secret",
         "schema": "v1", "extra": {"timeout": 3}}))
    hook = RabbitMQStreamHook("my_stream")
    assert parse_url(hook.get_url()).vhost == "v1"
    assert hook.timeout == 3.0
    from streamledger.batch import broker_identity  # the address form (no connection made here)

    assert broker_identity(hook.get_url()) == "rabbitmq://10.0.0.5:5552/v1"
    assert "secret" not in broker_identity(hook.get_url())


def test_uri_form_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_BY_URI", "rabbitmq-stream://guest:guest@127.0.0.1:5552/")
    hook = RabbitMQStreamHook("by_uri")
    params = parse_url(hook.get_url())
    assert (params.host, params.port, params.vhost) == ("127.0.0.1", 5552, "/")


def test_test_connection_against_the_real_broker(monkeypatch: pytest.MonkeyPatch, rabbitmq_url: str) -> None:
    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_REAL", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": params.password, "schema": params.vhost}))
    ok, message = RabbitMQStreamHook("real").test_connection()
    assert ok, message
    assert "Connected to RabbitMQ" in message and params.password not in message


def test_test_connection_reports_a_wrong_password_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch, rabbitmq_url: str
) -> None:
    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_BAD", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": "definitely-wrong-pw", "schema": params.vhost}))
    ok, message = RabbitMQStreamHook("bad").test_connection()
    assert not ok
    assert "definitely-wrong-pw" not in message


def test_ledger_urls() -> None:
    assert ledger_url_from_connection(host=None, port=None, login=None, password=None,
                                      schema="/data/l.db", extra={}) == "sqlite:////data/l.db"
    assert ledger_url_from_connection(host="db", port=5432, login="u", password="p w", schema="sl",
                                      extra={}) == "postgresql+psycopg://u:p%20w@db:5432/sl"
    assert ledger_url_from_connection(host="x", port=None, login=None, password=None, schema=None,
                                      extra={"url": "sqlite:///x.db"}) == "sqlite:///x.db"
    with pytest.raises(ValueError, match="ledger connection needs"):
        ledger_url_from_connection(host=None, port=None, login=None, password=None, schema=None, extra={})


def test_default_ledger_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STREAMLEDGER_LEDGER_URL", raising=False)
    monkeypatch.setenv("STREAMLEDGER_HOME", str(tmp_path / "sl"))  # created 0700 on first use
    # One default for the hook, the library and the CLI (issue 10, item 7): the audit without
    # --ledger reads what the DAGs wrote.
    import argparse

    from streamledger.cli.options import ledger_url

    assert default_ledger_url() == f"sqlite:///{tmp_path}/sl/ledger.sqlite"
    assert ledger_url(argparse.Namespace(ledger=None)) == default_ledger_url()
    assert ledger_url(argparse.Namespace()) == default_ledger_url()
    monkeypatch.setenv("STREAMLEDGER_LEDGER_URL", "postgresql+psycopg://h/db")
    assert OffsetLedgerHook().get_url() == "postgresql+psycopg://h/db"
    assert OffsetLedgerHook(ledger_url="sqlite:///a.db").get_url() == "sqlite:///a.db"


def test_parse_masters() -> None:
    assert parse_masters("m1:8715, m2:9000,m3") == [("m1", 8715), ("m2", 9000), ("m3", 8715)]
    with pytest.raises(ValueError, match="not host:port"):
        parse_masters("m1:abc")
    with pytest.raises(ValueError, match="no masters"):
        parse_masters(" , ")


def test_tubemq_test_connection_sees_a_listening_master(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            dead = closed.getsockname()[1]
        monkeypatch.setenv("AIRFLOW_CONN_TUBE", json.dumps(
            {"conn_type": "tubemq", "host": f"127.0.0.1:{dead},127.0.0.1:{port}", "extra": {"timeout": 2}}))
        ok, message = TubeMQHook("tube").test_connection()
    assert ok, message
    assert f"127.0.0.1:{port}" in message


def test_tubemq_hook_client_registers_with_the_emulated_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook's client against the TubeMQ master emulator (the test double of tests/support)."""
    from tests.support.tubemq_emulator import TubeMQMasterEmulator

    with TubeMQMasterEmulator(users={"alice": "s3cret"}) as master:
        host, port = master.address
        monkeypatch.setenv("AIRFLOW_CONN_TUBE_AUTH", json.dumps(
            {"conn_type": "tubemq", "host": f"{host}:{port}", "login": "alice", "password": "s3cret",
             "extra": {"timeout": 2}}))
        with TubeMQHook("tube_auth").get_client(background_heartbeat=False) as client:
            registration = client.register_producer(["demo"])
            assert registration.master == master.address_str
            assert [p.key for p in registration.partitions("demo")]
        assert master.producers == {}


def test_mapped_task_index_zero_keeps_its_identity() -> None:
    """Issue 10, item 5: map index 0 is the first mapped task, not -1 (unmapped)."""
    from types import SimpleNamespace

    from streamledger.operators.batch import run_identity

    def ti(index: int | None) -> SimpleNamespace:
        return SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=index, try_number=2)

    assert run_identity(ti(0)).map_index == 0
    assert run_identity(ti(-1)).map_index == -1
    assert run_identity(ti(None)).map_index == -1
    assert len({run_identity(ti(i)).key() for i in (-1, 0, 1)}) == 3


def test_tls_test_connection_against_the_real_broker(  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch, rabbitmq_tls
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RMQ_TLS", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": rabbitmq_tls.host, "port": rabbitmq_tls.port,
         "login": "guest", "password": "guest", "schema": "/",
         "extra": {"tls": True, "ca_file": str(rabbitmq_tls.ca_file)}}))
    ok, message = RabbitMQStreamHook("rmq_tls").test_connection()
    assert ok, message
    assert "Connected to RabbitMQ 4.3" in message
    monkeypatch.setenv("AIRFLOW_CONN_RMQ_TLS_WRONG_CA", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": rabbitmq_tls.host, "port": rabbitmq_tls.port,
         "login": "guest", "password": "guest",
         "extra": {"tls": True, "ca_file": str(rabbitmq_tls.wrong_ca_file)}}))
    ok, message = RabbitMQStreamHook("rmq_tls_wrong_ca").test_connection()
    assert not ok and "certificate" in message.lower(), message


def test_ledger_test_connection_on_sqlite_never_migrates(  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    import sqlite3

    from streamledger.ledger import Ledger

    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_FILE", json.dumps({"conn_type": "streamledger_ledger",
                                                                 "schema": str(path)}))
    sqlite3.connect(path).close()
    ok, message = OffsetLedgerHook("ledger_file").test_connection()
    assert not ok and "no ledger schema" in message and "streamledger ledger upgrade" in message
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
    Ledger(f"sqlite:///{path}", create=True).close()
    ok, message = OffsetLedgerHook("ledger_file").test_connection()
    assert ok and "audit clean" in message, message


def test_ledger_test_connection_on_postgresql(monkeypatch: pytest.MonkeyPatch, postgres_url: str) -> None:
    from sqlalchemy.engine import make_url

    from streamledger.ledger import Ledger

    url = make_url(postgres_url)
    fields = {"conn_type": "streamledger_ledger", "host": url.host, "port": url.port, "login": url.username,
              "password": url.password, "schema": url.database}
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_PG", json.dumps(fields))
    ok, message = OffsetLedgerHook("ledger_pg").test_connection()
    assert not ok and "no ledger schema" in message, message
    Ledger(postgres_url, create=True).close()
    ok, message = OffsetLedgerHook("ledger_pg").test_connection()
    assert ok and "audit clean" in message, message
    if url.password:
        assert url.password not in message
    # the test server trusts loopback, so a wrong password would pass: a missing database fails instead
    bad = {**fields, "password": "wrong-pg-secret", "schema": "sl_no_such_database"}
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_PG_BAD", json.dumps(bad))
    ok, message = OffsetLedgerHook("ledger_pg_bad").test_connection()
    assert not ok and "sl_no_such_database" in message and "wrong-pg-secret" not in message, message
