"""The output file-system layer without Spark: plain paths (exactly as before URIs), pyarrow's local
file system behind ``file://`` URIs, and the copy-based publish used where rename is not atomic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamledger import fs
from streamledger.batch import outputs, plan
from streamledger.batch.config import RunId


def test_uri_helpers_keep_plain_paths_as_before_and_join_uris_by_string() -> None:
    assert fs.scheme("/data/out") == "" and fs.scheme("file:///data") == "file"
    assert fs.scheme("s3a://bucket/x") == "s3a" and fs.scheme("relative/dir") == ""
    assert fs.join("/data/out", "p", "s") == str(Path("/data/out") / "p" / "s")
    assert fs.join("s3a://bucket/root/", "p", "s") == "s3a://bucket/root/p/s"
    assert fs.parent("s3a://bucket/root/p") == "s3a://bucket/root" and fs.name("s3a://b/r/p/") == "p"
    run = RunId("dag", "r 1", "t")
    b = "rabbitmq://c1/%2F"
    assert plan.output_dir("/out", "p", b, "s", 0, 10) == (
        "/out/p/c1/s/000000000000-000000000010")
    assert plan.output_dir("gs://b/out", "p/q", "mewbase://m", "s", 0, 10) == (
        "gs://b/out/p~2Fq/m~m/s/000000000000-000000000010")
    staging = plan.staging_dir("hdfs://nn:8020/out", "p", b, run, "abcd")
    assert staging == "hdfs://nn:8020/out/_staging/p/c1/dag.r~201.t.-1.t1.abcd"
    assert staging.startswith(plan.staging_prefix("hdfs://nn:8020/out", "p", b, run))


@pytest.fixture(params=["plain", "arrow-file-uri"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[fs.OutputFS, str]:
    if request.param == "plain":
        return fs.LOCAL, str(tmp_path)
    return fs.ArrowFS(), tmp_path.as_uri()


def test_every_operation_on_local_files(where: tuple[fs.OutputFS, str], tmp_path: Path) -> None:
    f, root = where
    d = fs.join(root, "a", "b")
    assert not f.exists(d) and f.listdir(d) == [] and f.files(d) == [] and f.read_bytes(d) is None
    f.mkdirs(d)
    assert f.is_dir(d) and f.renames_atomically(d)
    f.write_bytes(fs.join(d, "x.json"), b"one")
    f.write_bytes(fs.join(d, "x.json"), b"two")  # replaces atomically, leaves no temp file
    f.write_bytes(fs.join(d, "sub", "y"), b"y")
    assert f.read_bytes(fs.join(d, "x.json")) == b"two"
    assert f.listdir(d) == ["sub", "x.json"] and f.files(d) == ["sub/y", "x.json"]
    assert (tmp_path / "a" / "b" / "x.json").read_bytes() == b"two"
    f.copy_file(fs.join(d, "x.json"), fs.join(root, "c", "x.json"))
    with pytest.raises(FileExistsError):
        f.rename(d, fs.join(root, "c"))
    f.rename(d, fs.join(root, "e", "moved"))
    assert not f.exists(d) and f.files(fs.join(root, "e", "moved")) == ["sub/y", "x.json"]
    f.delete(fs.join(root, "e"))
    f.delete(fs.join(root, "e"))  # missing is fine
    assert not f.exists(fs.join(root, "e")) and f.read_bytes(fs.join(root, "c", "x.json")) == b"two"


def _staging(f: fs.OutputFS, root: str, range_id: int) -> str:
    staging = fs.join(root, "_staging", "attempt")
    for i in range(3):
        f.write_bytes(fs.join(staging, f"part-{i}.parquet"), f"data {i}".encode())
    outputs.write_manifest(staging, {"range_id": range_id}, f)
    return staging


@pytest.fixture(params=["os", "arrow"])
def copying(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[fs.OutputFS, str]:
    """A file system told its rename is not atomic (as on an object store), over local files."""
    if request.param == "os":
        return fs.LocalFS(atomic_rename=False), str(tmp_path)
    return fs.ArrowFS(atomic_rename=False), tmp_path.as_uri()


def test_publish_without_atomic_rename_copies_the_manifest_last_and_finishes_a_partial_copy(
    copying: tuple[fs.OutputFS, str], tmp_path: Path,
) -> None:
    """An object store's "rename" is a copy: a publish interrupted mid-copy leaves a destination
    without a manifest (so not published) and staging whole; the retry completes it."""
    f, root = copying
    staging, final = _staging(f, root, 7), fs.join(root, "p", "s", "0-3")
    f.copy_file(fs.join(staging, "part-0.parquet"), fs.join(final, "part-0.parquet"))  # killed here
    assert not outputs.published(final, 7, f)
    outputs.publish(staging, final, 7, f)
    assert outputs.published(final, 7, f) and not f.exists(staging)
    assert f.files(final) == ["_manifest.json", "part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert not list(tmp_path.glob("p/s/*.superseded-*"))
    outputs.publish(staging, final, 7, f)  # idempotent: published, staging gone, nothing happens
    assert outputs.published(final, 7, f)


def test_publish_moves_aside_what_is_not_a_copy_of_this_staging(tmp_path: Path) -> None:
    for i, f in enumerate((fs.LOCAL, fs.LocalFS(atomic_rename=False), fs.ArrowFS(atomic_rename=False))):
        root = str(tmp_path / str(i))
        staging, final = _staging(f, root, 3), fs.join(root, "p", "s", "0-3")
        f.write_bytes(fs.join(final, "foreign.parquet"), b"someone else's")
        outputs.publish(staging, final, 3, f)
        assert json.loads(f.read_bytes(fs.join(final, "_manifest.json")) or b"")["range_id"] == 3
        (aside,) = Path(root, "p", "s").glob("0-3.superseded-*")
        assert [p.name for p in aside.iterdir()] == ["foreign.parquet"]


def test_filesystem_for_keeps_plain_paths_local_and_asks_the_runner_for_uris(tmp_path: Path) -> None:
    class Runner:
        def __init__(self) -> None:
            self.asked: list[str] = []

        def filesystem(self, location: str) -> fs.OutputFS:
            self.asked.append(location)
            return fs.ArrowFS()

    runner = Runner()
    assert fs.filesystem_for(str(tmp_path), runner) is fs.LOCAL and runner.asked == []
    assert isinstance(fs.filesystem_for(tmp_path.as_uri(), runner), fs.ArrowFS)
    assert runner.asked == [tmp_path.as_uri()]
    assert fs.filesystem_for(tmp_path.as_uri(), object()) is fs.LOCAL
    assert isinstance(fs.filesystem_for("s3a://bucket/x", object()), fs.ArrowFS)
    with pytest.raises(ValueError, match="not a local path"):
        fs.local_path("s3a://bucket/x")


def test_store_access_comes_from_the_environment_and_never_shows_its_secrets() -> None:
    from streamledger.fs import StoreAccess

    env = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
           "AWS_DEFAULT_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    access = StoreAccess.from_environment("s3a://bucket/out", env)
    assert access is not None and access.secret_key == "s3cr3t-value" and access.region == "eu-west-1"
    assert "s3cr3t" not in repr(access) and "AKIAEXAMPLE" not in repr(access)
    assert StoreAccess.from_environment("gs://bucket/out", env) is None
    assert StoreAccess.from_environment("s3://bucket/out", {}) is None


def test_an_unknown_scheme_is_one_line_naming_the_location_without_its_password() -> None:
    import pytest

    from streamledger.fs import LocationError, check_location

    with pytest.raises(LocationError) as caught:
        check_location("nosuch://user:pw@host/out")
    text = str(caught.value)
    assert text.startswith("output nosuch://***@host/out: no file system for it here") and "\n" not in text
    assert "pw" not in text, text


def test_missing_s3_credentials_are_named_only_where_they_are_known_missing(tmp_path: Path) -> None:
    from streamledger.fs import credentials_missing

    none = {"AWS_EC2_METADATA_DISABLED": "true", "HOME": str(tmp_path)}
    assert credentials_missing("s3://b/out", {**none, "AWS_ACCESS_KEY_ID": "AKIA1"}) == (
        "AWS_ACCESS_KEY_ID is set but not AWS_SECRET_ACCESS_KEY")
    assert credentials_missing("s3a://b/out", {**none, "AWS_SECRET_ACCESS_KEY": "s"}) == (
        "AWS_SECRET_ACCESS_KEY is set but not AWS_ACCESS_KEY_ID")
    assert "no credentials for the store" in str(credentials_missing("s3://b/out", none))
    both = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    assert credentials_missing("s3://b/out", {**none, **both}) is None
    assert credentials_missing("s3://b/out", {**none, "AWS_PROFILE": "dev"}) is None
    assert credentials_missing("s3://b/out", {"HOME": str(tmp_path)}) is None  # a role may answer
    assert credentials_missing("gs://b/out", none) is None
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    assert credentials_missing("s3://b/out", none) is None


def test_a_create_on_s3_without_boto3_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyarrow.fs cannot send If-None-Match, so the manifest's create-only PUT on S3 goes through
    botocore; without it the publish fails in one line naming the extra, before any request."""
    import sys

    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    with pytest.raises(fs.LocationError) as refused:
        fs.ArrowFS().create_file("s3://bucket/out/p/_manifest.json", b"{}")
    said = str(refused.value)
    assert "\n" not in said and said.startswith("s3://bucket/out/p/_manifest.json: ")
    assert 'pip install "streamledger[s3]"' in said, said
