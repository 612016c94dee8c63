"""Issue 33: the broker's directory in the output tree is one a person can read (the cluster's short
name, the vhost only when it is not ``/``), and still one harmless component, reversible to the ledger's
identity and injective, never one an older release wrote for another broker."""

from __future__ import annotations

from urllib.parse import quote

from hypothesis import example, given
from hypothesis import strategies as st

from streamledger.batch import plan
from streamledger.paths import broker_component, decode_broker_component, encode_component
from streamledger.sources import canonical_identity
from tests.unit.batch.test_paths import is_one_harmless_component, names

hosts = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True) | st.sampled_from(["::1", "10.0.0.7"])
ports = st.integers(1, 65535)
vhosts = st.sampled_from(["", "/", "%2F", "%2f"]) | names.map(lambda v: quote(v, safe=""))
# Identities as LogKind.identity writes them: a cluster name or host:port, a vhost; a mewbase server;
# and, since plan functions take any string, anything at all.
written = st.one_of(
    st.builds(lambda n, v: f"rabbitmq://{quote(n, safe='@._-')}/{v}", names.filter(bool), vhosts),
    st.builds(lambda h, p, v: f"rabbitmq://{h}:{p}/{v}", hosts, ports, vhosts),
    st.builds(lambda n: f"mewbase://{quote(n, safe='@._-')}", names.filter(bool)),
    st.builds(lambda h, p: f"mewbase://{h}:{p}", hosts, ports),
)
identities = written | names


def test_the_broker_directory_is_its_short_name_and_the_vhost_only_when_not_the_default() -> None:
    # '@' escaped too: a file:// URI quotes it as %40, which pyiceberg does not unquote
    assert broker_component("rabbitmq://rabbit43@vm/%2F") == "rabbit43~40vm"
    assert broker_component("rabbitmq://rabbit43@vm/") == "rabbit43~40vm"  # any spelling of the default
    assert broker_component("rabbitmq://c1/orders") == "c1~vorders"
    assert broker_component("rabbitmq://127.0.0.1:5552/%2F") == "127.0.0.1~3A5552"  # no ':' for Hadoop
    out = plan.output_dir("/out", "p", "rabbitmq://rabbit43@vm/%2F", "events", 0, 10)
    assert out == "/out/p/rabbit43~40vm/events/000000000000-000000000010"


@given(identities)
@example("rabbitmq://rabbit@host/%2F")
@example("rabbitmq://[::1]:5552/a%2Fb")
@example("mewbase://m")
@example("rabbitmq://x/%FF")  # a vhost that is no UTF-8 once decoded
@example("rabbitmq://x/%2F#epoch2")
@example("~u")
def test_every_identity_is_one_harmless_component_that_decodes_to_its_canonical_spelling(
    identity: str,
) -> None:
    c = broker_component(identity)
    assert is_one_harmless_component(c), c
    if "~~" not in c:  # not a long name's hash
        assert decode_broker_component(c) == canonical_identity(identity)


@given(identities, identities)
@example("rabbitmq://a/%2F", "mewbase://a")
@example("rabbitmq://a:1/%2F", "rabbitmq://a%3A1/%2F")
@example("rabbitmq://a/b", "rabbitmq://a~vb/%2F")
@example("rabbitmq://a/%2F", "a")
def test_distinct_brokers_never_share_a_directory(a: str, b: str) -> None:
    if canonical_identity(a) != canonical_identity(b):
        assert broker_component(a) != broker_component(b)


@given(identities, written)
@example("rabbitmq://rabbitmq:5552/%2F", "rabbitmq://rabbitmq/%2F")
def test_no_new_directory_is_one_an_older_release_wrote_for_another_broker(a: str, b: str) -> None:
    """Old layouts stay in the output tree (the ledger names their paths): a new range of one broker
    never lands in the directory the old encoding gave another (old releases wrote only identities of
    a log kind, in any spelling)."""
    if canonical_identity(a) != canonical_identity(b):
        assert broker_component(a) != encode_component(b)
