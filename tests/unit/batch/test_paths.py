"""Issue 19, item 4: names as path components (``streamledger.paths``) and the output layout built
from them (``batch.plan``): one component per name, reversible, injective, never ``.``/``..``."""

from __future__ import annotations

import posixpath
import string

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from streamledger.batch import BatchConfig, BatchError, plan
from streamledger.batch.config import RunId
from streamledger.paths import MAX_COMPONENT_BYTES, decode_component, encode_component, name_problem

# Any text with a UTF-8 form (lone surrogates have none), short and long, with the characters that
# matter here made likely.
names = st.text(st.one_of(st.sampled_from("./_~%-:@\x00aA0"), st.characters(exclude_categories=["Cs"])),
                max_size=120) | st.text(st.sampled_from("é/.~x"), min_size=80, max_size=300)


def is_one_harmless_component(c: str) -> bool:
    return (
        bool(c) and c not in (".", "..") and "/" not in c and "\\" not in c
        and len(c.encode()) <= MAX_COMPONENT_BYTES and c.isascii()
        and not c.startswith((".", "_")) and not set(c) & set("*?[]{}%:\x00")
    )


@given(names)
@example("..")
@example(".")
@example("")
@example("a/../b")
@example("_staging")
def test_every_name_becomes_one_harmless_component_that_decodes_back(name: str) -> None:
    for keep_dots in (True, False):
        c = encode_component(name, keep_dots=keep_dots)
        assert is_one_harmless_component(c), c
        if "~~" not in c:  # not hashed
            assert decode_component(c, keep_dots=keep_dots) == name
        if not keep_dots:
            assert "." not in c


@given(names, names)
@example("a/b", "a_b")
@example("~2F", "/")
@example("x" * 300, "x" * 301)
def test_distinct_names_never_share_a_component(a: str, b: str) -> None:
    if a != b:
        assert encode_component(a) != encode_component(b)
        assert encode_component(a, keep_dots=False) != encode_component(b, keep_dots=False)


def test_ordinary_names_keep_their_directory_and_the_rest_is_escaped() -> None:
    for name in ("events-0", "p-exactly-once", "orders.v2", "a_b", "Z9"):
        assert encode_component(name) == name
    assert encode_component("a/b") == "a~2Fb" and encode_component("~") == "~7E"
    assert encode_component("..") == "~2E." and encode_component("_staging") == "~5Fstaging"
    assert encode_component("é") == "~C3~A9" and encode_component("") == "~"
    assert encode_component("a.b", keep_dots=False) == "a~2Eb"


def test_a_long_name_is_hashed_within_the_limit_and_only_the_ledger_can_name_it() -> None:
    long = "é" * 100  # 200 bytes of UTF-8, 600 encoded
    c = encode_component(long)
    assert len(c) <= MAX_COMPONENT_BYTES and c.startswith("~C3~A9") and "~~" in c  # no half escape
    assert encode_component(long + "x") != c
    with pytest.raises(ValueError, match="ledger holds the name"):
        decode_component(c)


@pytest.mark.parametrize("bad", ["", ".", "..", "~2", "~2f", "a/b", "~41", ".x", "~2E~2E", "é", "a%2Fb",
                                 "~FF"])
def test_decode_refuses_what_encode_never_writes(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_component(bad)


def test_names_no_ledger_or_file_system_holds_are_refused_in_one_line() -> None:
    assert name_problem("stream", "events-0") is None and name_problem("stream", "../../x") is None
    assert "NUL" in str(name_problem("stream", "a\x00b"))
    assert "U+000A" in str(name_problem("stream", "a\nb"))
    assert "not valid Unicode" in str(name_problem("stream", "a\udcffb"))
    assert "non-empty" in str(name_problem("stream", ""))
    with pytest.raises(BatchError, match=r"^stream 'a\\x00b' holds NUL"):
        BatchConfig(pipeline="p", url="rabbitmq-stream://h:5552/", output_root="/o", stream="a\x00b")
    with pytest.raises(BatchError, match=r"^super stream 'a\\x1bb' holds the control character U\+001B"):
        BatchConfig(pipeline="p", url="rabbitmq-stream://h:5552/", output_root="/o", super_stream="a\x1bb")
    with pytest.raises(BatchError, match=r"^pipeline 'p\\udcff' is not valid Unicode"):
        BatchConfig(pipeline="p\udcff", url="rabbitmq-stream://h:5552/", output_root="/o", stream="s")


@given(st.lists(names, min_size=3, max_size=3), st.lists(names, min_size=3, max_size=3))
def test_staging_prefixes_of_distinct_runs_never_match_each_other(a: list[str], b: list[str]) -> None:
    ra, rb = RunId(a[0], a[1], a[2]), RunId(b[0], b[1], b[2])
    pa = plan.staging_prefix("/o", "p", "rabbitmq://c/%2F", ra)
    pb = plan.staging_prefix("/o", "p", "rabbitmq://c/%2F", rb)
    sa = plan.staging_dir("/o", "p", "rabbitmq://c/%2F", ra, "tok")
    assert sa.startswith(pa) and len(posixpath.basename(sa)) <= MAX_COMPONENT_BYTES
    if ra.key() != rb.key():
        assert not sa.startswith(pb)


def test_output_dir_stays_under_the_root_and_apart_per_pipeline_broker_and_stream() -> None:
    seen = set()
    for pipeline in ("a/b", "a_b", ".."):
        for broker in ("rabbitmq://east/%2F", "rabbitmq://west/%2F"):
            for stream in ("../../x", "x", "/", string.punctuation):
                d = plan.output_dir("/out", pipeline, broker, stream, 0, 5)
                assert posixpath.normpath(d) == d and d.startswith("/out/") and d.count("/") == 5
                seen.add(d)
    assert len(seen) == 3 * 2 * 4


@pytest.mark.parametrize("where", ["output_root", "table"])
def test_credentials_in_an_object_store_location_are_refused_masked(where: str) -> None:
    """``s3://KEY:SECRET@bucket/...`` was taken: the batch went on to name ``KEY:SECRET`` as the
    bucket (pyarrow's error, with the secret, reached the user), and a Delta table location
    refused for it later was shown unmasked. Refused now, before anything is claimed, masked."""
    secret = "s3://AKIAX:sl-secret-do-not-show@bucket/lake"
    kwargs = {"output_root": secret} if where == "output_root" else {"output_root": "/o", "sink": "delta",
                                                                      "table": secret}
    with pytest.raises(BatchError) as refused:
        BatchConfig(pipeline="p", url="rabbitmq-stream://h:5552/", stream="s", **kwargs)  # type: ignore[arg-type]
    said = str(refused.value)
    assert "sl-secret-do-not-show" not in said and "credentials in the URI" in said
