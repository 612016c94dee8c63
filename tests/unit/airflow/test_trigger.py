"""The backlog trigger's run loop against the real broker and a real SQLite ledger."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from streamledger.protocol.rabbitmq import StreamClient, parse_url
from streamledger.triggers.backlog import StreamBacklogTrigger


@pytest.fixture
def conn_env(monkeypatch: pytest.MonkeyPatch, rabbitmq_url: str) -> str:
    params = parse_url(rabbitmq_url)
    monkeypatch.setenv("AIRFLOW_CONN_BACKLOG_RMQ", json.dumps(
        {"conn_type": "rabbitmq_stream", "host": params.host, "port": params.port,
         "login": params.username, "password": params.password, "schema": params.vhost}))
    return "backlog_rmq"


async def _first_event(trigger: StreamBacklogTrigger, timeout: float = 60) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            payload: dict[str, Any] = event.payload
            return payload
        raise AssertionError("trigger ended without an event")

    return await asyncio.wait_for(first(), timeout)


def test_fires_when_the_backlog_is_reached(conn_env: str, rabbitmq_url: str, stream_name: Any,
                                           tmp_path: Path) -> None:
    stream = stream_name("backlog")
    with StreamClient.connect(rabbitmq_url) as client:
        client.create_stream(stream)
        client.publish(stream, [b"x"] * 5)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"

    ready = StreamBacklogTrigger(pipeline="p", min_backlog=5, stream=stream, rabbitmq_stream_conn_id=conn_env,
                                 ledger_url=ledger_url, poll_interval=0.2)
    event = asyncio.run(_first_event(ready))
    assert event == {"status": "ready", "backlog": 5, "streams": {stream: 5}}

    def publish_later() -> None:
        with StreamClient.connect(rabbitmq_url) as client:
            client.publish(stream, [b"y"] * 10)

    waiting = StreamBacklogTrigger(pipeline="p", min_backlog=12, stream=stream,
                                   rabbitmq_stream_conn_id=conn_env, ledger_url=ledger_url, poll_interval=0.2)
    timer = threading.Timer(1.0, publish_later)
    timer.start()
    try:
        event = asyncio.run(_first_event(waiting))
    finally:
        timer.join()
    assert event["status"] == "ready" and event["backlog"] >= 12


def test_reports_errors_as_an_event(conn_env: str, tmp_path: Path) -> None:
    trigger = StreamBacklogTrigger(pipeline="p", min_backlog=1, stream="no-such-stream-for-backlog",
                                   rabbitmq_stream_conn_id=conn_env,
                                   ledger_url=f"sqlite:///{tmp_path / 'l.db'}", poll_interval=0.2)
    event = asyncio.run(_first_event(trigger))
    assert event["status"] == "error"
    assert "no-such-stream-for-backlog" in event["message"]
