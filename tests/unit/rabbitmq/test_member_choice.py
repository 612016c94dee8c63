"""Which node a range read connects to (reader.candidates), from the Metadata answer a broker gives:
advertised replicas first, then the leader, the URL's node last; ``prefer`` changes the order."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamledger.protocol.rabbitmq import constants as c
from streamledger.protocol.rabbitmq.errors import ConnectionFailed
from streamledger.protocol.rabbitmq.reader import candidates
from streamledger.protocol.rabbitmq.stats import StreamMetadata, StreamStats
from streamledger.protocol.rabbitmq.url import ConnectionParams, parse_url


@dataclass
class Source:
    """A RangeSource whose Metadata answer is given (what a 3-node cluster advertises)."""

    answer: dict[str, StreamMetadata] | Exception
    params: ConnectionParams = field(
        default_factory=lambda: parse_url("rabbitmq-stream://u:p@lb.example:5552/")
    )
    timeout: float = 1.0

    def supports(self, key: int) -> bool:
        return True

    def stream_stats(self, name: str) -> StreamStats:
        raise NotImplementedError

    def committed_tail(self, name: str, *, stats: StreamStats | None = None) -> int:
        raise NotImplementedError

    def metadata(self, names: list[str]) -> dict[str, StreamMetadata]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def md(
    leader: tuple[str, int] | None, *replicas: tuple[str, int], code: int = c.OK
) -> dict[str, StreamMetadata]:
    return {"s": StreamMetadata("s", code, c.code_name(code), leader, list(replicas))}


def where(found: list[tuple[ConnectionParams, str]]) -> list[tuple[str, int, str]]:
    return [(p.host, p.port, role) for p, role in found]


def test_replicas_first_then_leader_then_the_url() -> None:
    src = Source(md(("10.0.0.1", 5552), ("10.0.0.2", 5552), ("10.0.0.3", 5552)))
    got = where(candidates(src, "s", "replica"))
    assert sorted(got[:2]) == [("10.0.0.2", 5552, "replica"), ("10.0.0.3", 5552, "replica")]
    assert got[2:] == [("10.0.0.1", 5552, "leader"), ("lb.example", 5552, "url")]
    # credentials and vhost go along to every member
    assert all(p.username == "u" and p.password == "p" for p, _ in candidates(src, "s", "replica"))


def test_prefer_leader_and_url() -> None:
    src = Source(md(("10.0.0.1", 5552), ("10.0.0.2", 5552)))
    assert where(candidates(src, "s", "leader")) == [
        ("10.0.0.1", 5552, "leader"),
        ("10.0.0.2", 5552, "replica"),
        ("lb.example", 5552, "url"),
    ]
    assert where(candidates(src, "s", "url")) == [("lb.example", 5552, "url")]


def test_single_node_advertising_the_url_itself_is_not_listed_twice() -> None:
    src = Source(md(("lb.example", 5552)))
    assert where(candidates(src, "s", "replica")) == [("lb.example", 5552, "leader")]


def test_no_usable_metadata_falls_back_to_the_url() -> None:
    for answer in (md(None, code=c.STREAM_DOES_NOT_EXIST), {}, ConnectionFailed("metadata failed")):
        assert where(candidates(Source(answer), "s", "replica")) == [("lb.example", 5552, "url")]
