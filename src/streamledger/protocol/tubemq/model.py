"""Typed values for what a TubeMQ master tells its clients, and the parsers of its string formats.

The master ships brokers, topic layouts and partition assignments as ``:``/``#``/``,``-separated
strings (spec section 9). Parsing them once, here, keeps the client and the CLI free of string
splitting and turns a malformed entry into a :class:`TubeMQProtocolError` that quotes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamledger.protocol.tubemq.errors import TubeMQProtocolError

__all__ = [
    "DEFAULT_BROKER_PORT",
    "DEFAULT_BROKER_TLS_PORT",
    "META_STORE_INS_BASE",
    "BrokerInfo",
    "ConsumerRegistration",
    "Partition",
    "ProducerRegistration",
    "SubscribeInfo",
    "TopicBrokerLayout",
    "TopicInfo",
    "parse_broker_info",
    "parse_subscribe_info",
    "parse_topic_info",
]

DEFAULT_BROKER_PORT = 8123
DEFAULT_BROKER_TLS_PORT = 8124
# Partition id = store index * 10000 + partition index.
META_STORE_INS_BASE = 10000


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A broker as ``id:host:port``."""

    broker_id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.broker_id}:{self.host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.broker_id, "host": self.host, "port": self.port}


def _int(text: str, what: str, raw: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise TubeMQProtocolError(f"bad {what} {text!r} in {raw!r}") from None


def parse_broker_info(raw: str, *, default_port: int = DEFAULT_BROKER_PORT) -> BrokerInfo:
    """Parse ``brokerId:host:port``; a blank port means the broker's default port."""
    parts = raw.split(":")
    if len(parts) != 3 or not parts[1].strip():
        raise TubeMQProtocolError(f"bad brokerInfo {raw!r} (expected id:host:port)")
    broker_id = _int(parts[0], "broker id", raw)
    port = default_port if not parts[2].strip() else _int(parts[2], "broker port", raw)
    if not 0 < port < 65536:
        raise TubeMQProtocolError(f"broker port {port} out of range in {raw!r}")
    return BrokerInfo(broker_id, parts[1].strip(), port)


@dataclass(frozen=True, slots=True)
class Partition:
    """One topic partition on one broker; ``key`` is the ``brokerId:topic:partitionId`` used by brokers."""

    broker: BrokerInfo
    topic: str
    partition_id: int

    @property
    def key(self) -> str:
        return f"{self.broker.broker_id}:{self.topic}:{self.partition_id}"

    def to_dict(self) -> dict[str, Any]:
        return {"broker": self.broker.to_dict(), "topic": self.topic, "partition": self.partition_id}


@dataclass(frozen=True, slots=True)
class TopicBrokerLayout:
    """How many partitions and stores a topic has on one broker."""

    broker_id: int
    partitions: int
    stores: int

    def partition_ids(self) -> list[int]:
        return [
            store * META_STORE_INS_BASE + index
            for store in range(self.stores)
            for index in range(self.partitions)
        ]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A published topic's layout: ``topic#brokerId:partNum:storeNum[,...]#maxMsgSize``."""

    topic: str
    layouts: tuple[TopicBrokerLayout, ...]
    max_msg_size: int | None

    def partitions(self, brokers: dict[int, BrokerInfo]) -> list[Partition]:
        """Expand the layout into partitions; brokers missing from ``brokers`` are skipped."""
        out: list[Partition] = []
        for layout in self.layouts:
            broker = brokers.get(layout.broker_id)
            if broker is None:
                continue
            out.extend(Partition(broker, self.topic, pid) for pid in layout.partition_ids())
        return out


def parse_topic_info(raw: str) -> TopicInfo:
    """Parse one ``topicInfos`` entry of a producer heartbeat response."""
    segments = raw.split("#")
    if len(segments) not in (2, 3) or not segments[0]:
        raise TubeMQProtocolError(f"bad topicInfo {raw!r} (expected topic#id:parts:stores,...#maxMsgSize)")
    layouts = []
    for item in filter(None, (s.strip() for s in segments[1].split(","))):
        fields = item.split(":")
        if len(fields) != 3:
            raise TubeMQProtocolError(f"bad broker layout {item!r} in topicInfo {raw!r}")
        broker_id, parts, stores = (_int(f, "layout number", raw) for f in fields)
        if parts < 0 or stores < 0:
            raise TubeMQProtocolError(f"negative partition/store count in topicInfo {raw!r}")
        layouts.append(TopicBrokerLayout(broker_id, parts, stores))
    size_text = segments[2].strip() if len(segments) == 3 else ""
    max_size = _int(size_text, "max message size", raw) if size_text else None
    return TopicInfo(segments[0], tuple(layouts), max_size)


@dataclass(frozen=True, slots=True)
class SubscribeInfo:
    """A consumer's partition assignment: ``consumerId@group#brokerId:host:port#topic:partitionId``."""

    consumer_id: str
    group: str
    partition: Partition

    def __str__(self) -> str:
        p = self.partition
        return f"{self.consumer_id}@{self.group}#{p.broker}#{p.topic}:{p.partition_id}"


def parse_subscribe_info(raw: str, *, default_port: int = DEFAULT_BROKER_PORT) -> SubscribeInfo:
    """Parse one SubscribeInfo string (``#``-separated, as the master's code writes it)."""
    segments = raw.split("#")
    if len(segments) != 3 or "@" not in segments[0]:
        raise TubeMQProtocolError(
            f"bad subscribeInfo {raw!r} (expected consumer@group#broker#topic:partition)"
        )
    consumer_id, group = segments[0].rsplit("@", 1)
    broker = parse_broker_info(segments[1], default_port=default_port)
    topic, sep, pid = segments[2].rpartition(":")
    if not sep or not topic:
        raise TubeMQProtocolError(f"bad topic:partition {segments[2]!r} in subscribeInfo {raw!r}")
    return SubscribeInfo(consumer_id, group, Partition(broker, topic, _int(pid, "partition id", raw)))


@dataclass(frozen=True)
class ProducerRegistration:
    """What a producer learned from the master: brokers and, per topic, the publishable partitions."""

    client_id: str
    master: str
    topics: tuple[str, ...]
    broker_checksum: int
    brokers: dict[int, BrokerInfo]
    topic_infos: dict[str, TopicInfo] = field(default_factory=dict)
    max_msg_size: int | None = None

    def partitions(self, topic: str | None = None) -> list[Partition]:
        """Publishable partitions of ``topic`` (all topics when None), from the last heartbeat."""
        infos = self.topic_infos.values() if topic is None else filter(None, [self.topic_infos.get(topic)])
        return [p for info in infos for p in info.partitions(self.brokers)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": "producer",
            "client_id": self.client_id,
            "master": self.master,
            "topics": list(self.topics),
            "broker_checksum": self.broker_checksum,
            "brokers": [b.to_dict() for b in sorted(self.brokers.values(), key=lambda b: b.broker_id)],
            "partitions": [p.to_dict() for p in self.partitions()],
            "max_msg_size": self.max_msg_size,
        }


@dataclass(frozen=True)
class ConsumerRegistration:
    """What a consumer learned: the partitions the master assigned to it (via rebalance events)."""

    client_id: str
    group: str
    master: str
    topics: tuple[str, ...]
    partitions: tuple[Partition, ...] = ()
    rebalance_id: int | None = None

    @property
    def brokers(self) -> dict[int, BrokerInfo]:
        """Brokers that host the assigned partitions."""
        return {p.broker.broker_id: p.broker for p in self.partitions}

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": "consumer",
            "client_id": self.client_id,
            "group": self.group,
            "master": self.master,
            "topics": list(self.topics),
            "brokers": [b.to_dict() for b in sorted(self.brokers.values(), key=lambda b: b.broker_id)],
            "partitions": [p.to_dict() for p in self.partitions],
            "rebalance_id": self.rebalance_id,
        }
