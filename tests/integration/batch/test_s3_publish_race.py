"""Issue 43, item 7 on a real S3 server (moto on loopback): two attempts of one range publishing to
``s3://`` through ``ArrowFS``, the way the batch does on a store without rename.

The attempt stalled inside its manifest PUT (after its last lease check) must not replace the manifest
of the attempt that published meanwhile: the manifest PUT carries ``If-None-Match: *`` (seen on the
wire through a recording proxy), the server refuses the second one (412), and the loser removes the
objects it copied that the winner's manifest does not list, then fails in one line naming the range.
The local-file-system form of the same races is tests/unit/batch/test_publish_races.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamledger import fs
from streamledger.batch.outputs import PublishedByAnother, create_manifest, publish, read_manifest
from tests.support.s3 import Bucket

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]


def _proxied(bucket: Bucket, seen: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> Iterator[Path]:
    proxy = subprocess.Popen([sys.executable, "-m", "tests.support.s3_proxy", bucket.endpoint, str(seen),
                              *flags], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout is not None
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.stdout.readline().strip())
        yield seen
    finally:
        proxy.kill()
        proxy.wait(timeout=30)


@pytest.fixture
def wire(s3_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The bucket reached through a proxy noting each request's method, path and If-None-Match."""
    yield from _proxied(s3_bucket, tmp_path / "requests.jsonl", monkeypatch)


@pytest.fixture
def lossy_wire(s3_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The same proxy, losing the answer to the first conditional PUT (which lands): botocore retries it."""
    yield from _proxied(s3_bucket, tmp_path / "requests.jsonl", monkeypatch,
                        "--lose-first-conditional-answer")


def staging(store: fs.ArrowFS, bucket: Bucket, name: str, range_id: int) -> str:
    where = bucket.uri("out", "_staging", name)
    store.write_bytes(fs.join(where, f"part-{name}.parquet"), b"rows of " + name.encode())
    manifest = {"range_id": range_id, "files": [f"part-{name}.parquet"], "written_at": name}
    store.write_bytes(fs.join(where, "_manifest.json"), json.dumps(manifest).encode())
    return where


def objects(bucket: Bucket, final: str) -> dict[str, bytes]:
    """Every object under ``final`` and its bytes, read without streamledger (pyarrow directly)."""
    prefix = final[len(bucket.uri()) + 1:]
    raw = bucket.filesystem()
    out = {}
    for key in bucket.keys(prefix):
        with raw.open_input_stream(f"{bucket.name}/{key}") as f:  # type: ignore[attr-defined]
            out[key[len(prefix) + 1:]] = f.read()
    return out


@pytest.mark.parametrize("stall", ["mid-manifest", "before-first-copy"])
def test_an_attempt_stalled_in_its_manifest_put_on_s3_leaves_the_winners_manifest(
    s3_bucket: Bucket, wire: Path, stall: str,
) -> None:
    """``mid-manifest``: the winner publishes while the loser is between its last lease check and its
    manifest PUT (the winner moves the loser's partial copy aside, as a foreign directory);
    ``before-first-copy``: the loser copies its data object next to the winner's first. Either way
    the loser's conditional manifest PUT is refused, the final prefix holds exactly the winner's
    objects, and the loser fails naming the range."""
    store = fs.ArrowFS()
    assert not store.renames_atomically(s3_bucket.uri("out"))
    final = s3_bucket.uri("out", "p", "b", "s", "0-100")
    a, b = staging(store, s3_bucket, "a", 7), staging(store, s3_bucket, "b", 7)
    checks = {"n": 0}
    winners: dict[str, bytes] = {}

    def stalled_guard() -> None:
        checks["n"] += 1
        if checks["n"] == (3 if stall == "mid-manifest" else 2):  # the lease moved on: B publishes
            publish(b, final, 7, fs.ArrowFS())
            winners.update(objects(s3_bucket, final))

    with pytest.raises(PublishedByAnother) as lost:
        publish(a, final, 7, store, guard=stalled_guard)
    said = str(lost.value)
    assert "\n" not in said and said.startswith("range 7: another attempt published ") and final in said
    assert s3_bucket.secret_key not in said
    assert objects(s3_bucket, final) == winners
    assert sorted(winners) == ["_manifest.json", "part-b.parquet"]
    manifest = read_manifest(final, store)
    assert manifest is not None and manifest["written_at"] == "b" and manifest["files"] == ["part-b.parquet"]

    requests = [json.loads(line) for line in wire.read_text().splitlines()]
    key = f"/{s3_bucket.name}/{final[len(s3_bucket.uri()) + 1:]}/_manifest.json"
    puts = [r["if_none_match"] for r in requests if r["method"] == "PUT" and r["path"].split("?")[0] == key]
    assert puts == ["*", "*"], requests  # the winner's and the refused one, both conditional


def test_the_s3_create_is_refused_by_the_store_when_the_key_exists(s3_bucket: Bucket) -> None:
    """``ArrowFS.create_file`` on ``s3://``: the first PUT lands, the second is refused by the store
    (412, raised as FileExistsError naming the location) and the object keeps its first bytes."""
    store = fs.ArrowFS()
    uri = s3_bucket.uri("x", "_manifest.json")
    store.create_file(uri, b"first")
    with pytest.raises(FileExistsError, match=r"exists: not replaced .*PreconditionFailed"):
        store.create_file(uri, b"second")
    assert store.read_bytes(uri) == b"first"
    with pytest.raises(FileExistsError):  # the Hadoop connector's name for the same store
        store.create_file(uri.replace("s3://", "s3a://", 1), b"third")
    assert store.read_bytes(uri) == b"first"


def test_a_retried_manifest_put_whose_first_try_landed_publishes_and_withdraws_nothing(
    s3_bucket: Bucket, lossy_wire: Path,
) -> None:
    """The manifest PUT lands but its answer is lost; botocore sends it again and the store refuses
    the retry (412: the key exists). The manifest in place is this attempt's own byte for byte, so
    the publish is this attempt's: it returns, its data object stays listed, its staging copy goes."""
    store = fs.ArrowFS()
    final = s3_bucket.uri("out", "p", "b", "s", "0-100")
    a = staging(store, s3_bucket, "a", 7)
    publish(a, final, 7, store)
    mine = {"range_id": 7, "files": ["part-a.parquet"], "written_at": "a"}
    assert objects(s3_bucket, final) == {"_manifest.json": json.dumps(mine).encode(),
                                         "part-a.parquet": b"rows of a"}
    assert store.files(a) == []  # the staging copy is gone, as after any publish

    requests = [json.loads(line) for line in lossy_wire.read_text().splitlines()]
    key = f"/{s3_bucket.name}/{final[len(s3_bucket.uri()) + 1:]}/_manifest.json"
    puts = [r.get("if_none_match") for r in requests
            if r.get("method") == "PUT" and r["path"].split("?")[0] == key]
    assert puts == ["*", "*"], requests  # the first landed (its answer lost), the retry was refused
    assert [r["lost_answer"] for r in requests if "lost_answer" in r] == [200], requests


def test_a_refused_create_is_ours_only_when_the_manifest_in_place_is_ours_byte_for_byte(
    s3_bucket: Bucket,
) -> None:
    """``create_manifest`` (the one rule of the batch's publish and the streaming micro-batch): a
    create refused by the store over the same bytes is ours (a retried PUT), over other bytes is not;
    the object keeps its first bytes either way."""
    store = fs.ArrowFS()
    where = s3_bucket.uri("y")
    assert create_manifest(where, b"ours", store)
    assert create_manifest(where, b"ours", store)  # what a retried PUT meets
    assert not create_manifest(where, b"theirs", store)
    assert store.read_bytes(fs.join(where, "_manifest.json")) == b"ours"
