"""The source table: URL scheme -> log kind, client, Spark format and ledger identity."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamledger.batch import broker_identity
from streamledger.sources import (
    KINDS,
    UnsupportedSource,
    canonical_identity,
    log_kind,
    require_feature,
    source_identity,
    spark_format,
)


@pytest.mark.parametrize(
    ("url", "kind", "fmt", "decode"),
    [
        ("rabbitmq-stream://guest:guest@127.0.0.1:5552/", "rabbitmq", "rabbitmq_stream", "amqp"),
        ("rabbitmq-stream+tls://u:p@broker:5551/v1", "rabbitmq", "rabbitmq_stream", "amqp"),
        ("mewbase://alice:secret@127.0.0.1:7451", "mewbase", "mewbase", "bson"),
        ("MEWBASE://127.0.0.1:7451", "mewbase", "mewbase", "bson"),
    ],
)
def test_scheme_decides_the_log(url: str, kind: str, fmt: str, decode: str) -> None:
    assert log_kind(url).name == kind
    assert spark_format(url) == fmt
    assert log_kind(url).default_decode == decode


def test_schemes_match_the_protocol_packages() -> None:
    from streamledger.protocol.mewbase import conventions
    from streamledger.protocol.rabbitmq import url as rabbitmq_url

    schemes = {s for k in KINDS for s in k.schemes}
    assert schemes == {rabbitmq_url.SCHEME, rabbitmq_url.TLS_SCHEME, conventions.URL_SCHEME}


def test_identity_per_kind_without_credentials() -> None:
    assert source_identity("mewbase://alice:secret@10.0.0.7:7451") == "mewbase://10.0.0.7:7451"
    assert source_identity("mewbase://alice:secret@10.0.0.7:7451", "events-prod") == "mewbase://events-prod"
    assert source_identity("rabbitmq-stream://u:secret@10.0.0.5:5552/v1") == "rabbitmq://10.0.0.5:5552/v1"
    assert source_identity("rabbitmq-stream+tls://u:p@h/") == "rabbitmq://h:5551/%2F"
    assert source_identity("rabbitmq-stream://u:p@h:5552/", "rabbit@node1") == "rabbitmq://rabbit@node1/%2F"
    # the batch's identity is this one rule
    for url in ("mewbase://a:b@h:1", "rabbitmq-stream://u:p@h:5552/v"):
        assert broker_identity(url) == source_identity(url)
        assert broker_identity(url, "c") == source_identity(url, "c")


@pytest.mark.parametrize("vhost", ["/", "", "/%2F", "/%2f", "//"])
@pytest.mark.parametrize("name", [None, "rabbit@node1"])
def test_every_spelling_of_a_vhost_is_one_identity(vhost: str, name: str | None) -> None:
    """Issue 30, defect 8: the vhost is the broker's, not the URL's spelling of it."""
    where = "rabbit@node1" if name else "h:5552"
    assert source_identity(f"rabbitmq-stream://u:p@H:5552{vhost}", name) == f"rabbitmq://{where}/%2F"


def test_canonical_identity_decodes_the_vhost_and_normalises_host_and_port() -> None:
    assert source_identity("rabbitmq-stream://u:p@h:5552/pr%6Fd") == "rabbitmq://h:5552/prod"
    assert source_identity("rabbitmq-stream://u:p@h:5552/a%2fb") == "rabbitmq://h:5552/a%2Fb"
    assert source_identity("rabbitmq-stream://u:p@[::1]/") == "rabbitmq://[::1]:5552/%2F"
    # identities an earlier version recorded map to the one spelling (adopted by the next batch)
    assert canonical_identity("rabbitmq://::1:5552/%2F") == "rabbitmq://[::1]:5552/%2F"
    assert canonical_identity("rabbitmq://rabbit@c1/%2f") == "rabbitmq://rabbit@c1/%2F"
    assert canonical_identity("rabbitmq://rabbit@c1/%2f#epoch0") == "rabbitmq://rabbit@c1/%2F#epoch0"
    assert canonical_identity("rabbitmq://broker:5552/") == "rabbitmq://broker:5552/%2F"
    assert canonical_identity("mewbase://10.0.0.7:7451") == "mewbase://10.0.0.7:7451"
    for same in ("rabbitmq://rabbit@c1/%2F", "mewbase://events-prod", "s3://b/k", "x"):
        assert canonical_identity(same) == same
        assert canonical_identity(canonical_identity(same)) == same


def test_unknown_scheme_is_one_line_without_the_url() -> None:
    with pytest.raises(UnsupportedSource) as err:
        log_kind("kafka://user:hunter2@host:9092")
    text = str(err.value)
    assert "'kafka'" in text and "mewbase://" in text and "rabbitmq-stream://" in text
    assert "hunter2" not in text and "\n" not in text
    with pytest.raises(UnsupportedSource, match="no scheme"):
        log_kind("127.0.0.1:5552")
    with pytest.raises(UnsupportedSource):
        broker_identity("amqp://u:p@h:5672/")


def test_rabbitmq_only_features_refuse_mewbase_in_one_line() -> None:
    assert require_feature("rabbitmq-stream://h:5552/", "super streams").name == "rabbitmq"
    with pytest.raises(UnsupportedSource) as err:
        require_feature("mewbase://u:secret@h:7451", "super streams")
    assert str(err.value) == (
        "super streams is only available for rabbitmq sources; a mewbase:// URL names a mewbase channel"
    )


def test_importing_the_table_imports_no_client() -> None:
    code = (
        "import sys, streamledger.sources as s; s.log_kind('mewbase://h:1'); "
        "print(','.join(m for m in ('streamledger.protocol.mewbase', 'streamledger.protocol.rabbitmq', "
        "'bson', 'pyspark', 'sqlalchemy') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True)
    assert proc.stdout.strip() == ""


def test_batch_config_refuses_a_super_stream_of_channels() -> None:
    from streamledger.batch import BatchConfig, BatchError

    with pytest.raises(BatchError, match=r"super_stream is only available for rabbitmq.*give stream="):
        BatchConfig(pipeline="p", url="mewbase://u:s@h:7451", output_root="/tmp/x", super_stream="orders")
    BatchConfig(pipeline="p", url="mewbase://h:7451", output_root="/tmp/x", stream="orders")
    BatchConfig(pipeline="p", url="rabbitmq-stream://h:5552/", output_root="/tmp/x", super_stream="orders")
