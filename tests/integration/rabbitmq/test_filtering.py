"""Stream filtering (RabbitMQ 3.13+): filter values set by the publisher, chunks skipped by the broker's
Bloom filters, and range reads that stay exact at both ends while chunks are skipped."""

from __future__ import annotations

import pytest

from streamledger.protocol.rabbitmq import (
    OutboundMessage,
    ReadStats,
    StreamClient,
    UnsupportedByBroker,
)
from tests.support.rabbitmq import Broker, StreamNames, ensure_broker

pytestmark = pytest.mark.rabbitmq

REGIONS = ("eu", "us", "apac")


def _publish_regions(client: StreamClient, name: str, groups: int, per_group: int) -> dict[int, str | None]:
    """``groups`` publishes (one chunk each, confirmed before the next), region ``REGIONS[g % 3]``;
    group 4 is published without a filter value (no property: an unfiltered chunk). Returns each
    offset's region."""
    regions: dict[int, str | None] = {}
    offset = 0
    for g in range(groups):
        region = None if g == 4 else REGIONS[g % 3]
        props = None if region is None else {"region": region}
        messages = [OutboundMessage(b"g%d-%d" % (g, i), props) for i in range(per_group)]
        client.publish(name, messages, batch_size=per_group, filter_property="region")
        regions.update({offset + i: region for i in range(per_group)})
        offset += per_group
    return regions


def _publish_regions_in_chunks(client: StreamClient, name: str, groups: int, per_group: int
                               ) -> dict[int, str | None]:
    """:func:`_publish_regions` on a new stream, made again when the broker (busy) wrote a group as
    several chunks: the pruning the test counts is per chunk."""
    for _ in range(5):
        client.create_stream(name)
        regions = _publish_regions(client, name, groups, per_group)
        if all((h := client.chunk_at(name, g * per_group + per_group - 1)) is not None
               and h.first_offset == g * per_group for g in range(groups)):
            return regions
        client.delete_stream(name)
    raise AssertionError(f"the broker split a group into several chunks five times on {name}")


def _read(client: StreamClient, name: str, start: int, end: int, values: list[str] | None,
          ) -> tuple[dict[int, str | None], ReadStats]:
    stats = ReadStats()
    got: dict[int, str | None] = {}
    for batch in client.read_range(name, start, end, filter_values=values, stats=stats):
        assert batch.application_properties is not None
        for off, props in zip(batch.offsets, batch.application_properties, strict=True):
            got[off] = (props or {}).get("region")
    return got, stats


@pytest.mark.parametrize("version", ["4.3", "4.0"])
def test_a_filtered_read_skips_chunks_and_keeps_every_match(version: str, stream_name: StreamNames) -> None:
    broker = ensure_broker(version)
    name = stream_name("filt", broker=broker)
    with StreamClient.connect(broker.url) as client:
        assert client.supports_filtering
        regions = _publish_regions_in_chunks(client, name, groups=12, per_group=20)  # 240, ends with apac
        tail = client.committed_tail(name)
        assert tail == 240

        full, full_stats = _read(client, name, 0, tail, None)
        assert full == regions and not full_stats.filtered
        eu, eu_stats = _read(client, name, 0, tail, ["eu"])
        assert eu_stats.filtered
        # every eu record and every unfiltered one is delivered; post-filtering is the caller's
        assert {o for o, r in regions.items() if r in ("eu", None)} <= set(eu)
        assert all(full[o] == r for o, r in eu.items())  # and the records are the real ones
        # pruned: 4 eu chunks + 1 unfiltered of 12 (Bloom false positives may add a few)
        assert eu_stats.chunks < full_stats.chunks and eu_stats.chunk_bytes < full_stats.chunk_bytes
        assert eu_stats.chunks <= 8, eu_stats

        # ends inside skipped chunks, in both directions: exact, and the read still stops
        part, _ = _read(client, name, 25, 150, ["eu", "us"])
        assert min(part) >= 25 and max(part) < 150
        assert {o for o in range(25, 150) if regions[o] in ("eu", "us", None)} <= set(part)
        none, none_stats = _read(client, name, 200, 240, ["nowhere"])
        assert none == {} and none_stats.chunks <= 1, none_stats  # 200..239 are us, apac: nothing matches


def test_without_filtering_the_publisher_refuses_and_the_reader_reads_everything(
        broker_310: Broker, stream_name: StreamNames) -> None:
    name = stream_name("filt310", broker=broker_310)
    with StreamClient.connect(broker_310.url) as client:
        client.create_stream(name)
        assert not client.supports_filtering
        with pytest.raises(UnsupportedByBroker,
                           match=r"stream '.*filt310.*': stream filtering needs RabbitMQ 3.13 or later"):
            client.publish(name, [b"x"], application_properties={"region": "eu"}, filter_property="region")
        with pytest.raises(UnsupportedByBroker, match="filter values"):
            client.publish(name, [OutboundMessage(b"x", filter_value="eu")])
        for region in REGIONS:
            client.publish(name, [b"a", b"b"], application_properties={"region": region})
        assert client.committed_tail(name) == 6
        got, stats = _read(client, name, 0, 6, ["eu"])
        assert got == {0: "eu", 1: "eu", 2: "us", 3: "us", 4: "apac", 5: "apac"}
        assert not stats.filtered and stats.chunks == 3


def test_cli_publish_sets_filter_values_from_a_property(broker_43: Broker, broker_310: Broker,
                                                        stream_name: StreamNames,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from streamledger.cli import main

    name = stream_name("filtcli")
    with StreamClient.connect(broker_43.url) as client:
        client.create_stream(name)
        for region in ("eu", "us"):  # one chunk each, 50 messages carrying region=<value>
            rc = main(["--url", broker_43.url, "publish", name, "--count", "50",
                       "--filter-property", "region", "--filter-values", region])
            assert rc == 0, capsys.readouterr()
        got, stats = _read(client, name, 0, 100, ["us"])
        assert set(got.values()) == {"us"} and len(got) == 50 and stats.records == 50  # no eu chunk
    capsys.readouterr()
    assert main(["--url", broker_43.url, "publish", name, "--count", "1", "--filter-values", "eu"]) != 0
    assert "--filter-property and --filter-values go together" in capsys.readouterr().err

    old = stream_name("filtcli310", broker=broker_310)
    with StreamClient.connect(broker_310.url) as client:
        client.create_stream(old)
    rc = main(["--url", broker_310.url, "publish", old, "--count", "5", "--filter-property", "region",
               "--filter-values", "eu,us"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and err.count("\n") == 0 and "stream filtering needs RabbitMQ 3.13 or later" in err
