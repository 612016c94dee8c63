"""Issue 43, item 7: two attempts of one range publishing on a file system without an atomic rename
(an object store, simulated by ``LocalFS(atomic_rename=False)``), and the local rename's window.

* A stalled attempt whose publish lease moved on while it was inside its manifest PUT (after its last
  guard) overwrote the manifest of the attempt that published meanwhile: a real window on object
  stores. The manifest is now written create-only (``OutputFS.create_file``: an exclusive create
  here, ``If-None-Match: *`` on S3, tests/integration/batch/test_s3_publish_race.py), so the loser's
  write is refused; it removes what it copied that the winner's manifest does not list and fails in
  one line naming the range.
* ``LocalFS.rename`` checks that the destination does not exist, then renames: in between, POSIX
  rename replaces an *empty* directory only (a non-empty one fails with ENOTEMPTY), and an empty
  directory holds no output, so nothing published can be lost there (asserted below).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamledger import fs as filesystems
from streamledger.batch.outputs import PublishedByAnother, publish, read_manifest


def _staging(root: Path, name: str, range_id: int) -> str:
    where = root / f"_staging-{name}"
    where.mkdir(parents=True)
    (where / f"part-{name}.parquet").write_bytes(b"rows of " + name.encode())
    manifest = {"range_id": range_id, "files": [f"part-{name}.parquet"], "written_at": name}
    (where / "_manifest.json").write_text(json.dumps(manifest))
    return str(where)


def test_an_attempt_stalled_in_its_manifest_put_leaves_the_winners_manifest(tmp_path: Path) -> None:
    store = filesystems.LocalFS(atomic_rename=False)
    final = str(tmp_path / "p" / "b" / "s" / "0-100")
    a, b = _staging(tmp_path, "a", 7), _staging(tmp_path, "b", 7)
    checks = {"n": 0}

    def stalled_guard() -> None:  # A's lease check before each file; before its manifest, it stalls
        checks["n"] += 1
        if checks["n"] == 3:  # the lease moved on: B re-read the range and publishes it meanwhile
            publish(b, final, 7, store)

    with pytest.raises(PublishedByAnother) as lost:
        publish(a, final, 7, store, guard=stalled_guard)
    manifest = read_manifest(final, store)
    assert manifest is not None
    present = sorted(p.name for p in Path(final).iterdir() if not p.name.startswith("_"))
    assert manifest["files"] == present, (manifest, present)
    assert manifest["written_at"] == "b"
    said = str(lost.value)
    assert "\n" not in said and said.startswith("range 7: ") and final in said, said


def test_a_loser_that_copied_into_the_winners_directory_leaves_it_as_the_winner_published_it(
    tmp_path: Path,
) -> None:
    """The winner publishes while the stalled attempt is between its lease check and its first
    copy: the loser copies its data file next to the winner's, then its manifest is refused (an
    exclusive create on the local file system); it removes its own file and fails, and the directory
    is byte for byte what the winner published."""
    store = filesystems.LocalFS(atomic_rename=False)
    final = str(tmp_path / "p" / "b" / "s" / "0-100")
    a, b = _staging(tmp_path, "a", 7), _staging(tmp_path, "b", 7)
    checks = {"n": 0}
    published_by_b: dict[str, bytes] = {}

    def stalled_guard() -> None:
        checks["n"] += 1
        if checks["n"] == 2:  # after A's first check, before its first copy: B publishes
            publish(b, final, 7, store)
            published_by_b.update({p.name: p.read_bytes() for p in Path(final).iterdir()})

    with pytest.raises(PublishedByAnother, match=r"^range 7: another attempt published .* first"):
        publish(a, final, 7, store, guard=stalled_guard)
    assert {p.name: p.read_bytes() for p in Path(final).iterdir()} == published_by_b
    assert sorted(published_by_b) == ["_manifest.json", "part-b.parquet"]
    assert Path(a).is_dir() and not Path(b).exists()  # the loser's staging is its own to sweep


def test_two_attempts_publishing_one_staging_copy_both_succeed(tmp_path: Path) -> None:
    """Both attempts copy the same staging copy (the one the ledger names): the loser's manifest is
    refused, but the one in place is its own byte for byte, so nothing is removed and it returns."""
    store = filesystems.LocalFS(atomic_rename=False)
    final = str(tmp_path / "final")
    a = _staging(tmp_path, "a", 7)
    twin = tmp_path / "twin"
    import shutil

    shutil.copytree(a, twin)
    checks = {"n": 0}

    def stalled_guard() -> None:
        checks["n"] += 1
        if checks["n"] == 3:  # before A's manifest: the twin copy is published
            publish(str(twin), final, 7, store)

    publish(a, final, 7, store, guard=stalled_guard)
    assert sorted(p.name for p in Path(final).iterdir()) == ["_manifest.json", "part-a.parquet"]
    assert json.loads((Path(final) / "_manifest.json").read_text())["files"] == ["part-a.parquet"]


def test_the_local_create_is_exclusive_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "d" / "_manifest.json"
    filesystems.LOCAL.create_file(str(target), b"first")
    with pytest.raises(FileExistsError, match="exists: not replaced"):
        filesystems.LOCAL.create_file(str(target), b"second")
    with pytest.raises(FileExistsError):
        filesystems.ArrowFS().create_file(target.as_uri(), b"third")
    assert target.read_bytes() == b"first"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no temp file left


def test_the_local_rename_never_replaces_a_directory_with_content(tmp_path: Path) -> None:
    staging = Path(_staging(tmp_path, "a", 7))
    final = tmp_path / "final"
    final.mkdir()
    (final / "_manifest.json").write_text("{}")
    with pytest.raises(OSError):
        filesystems.LOCAL.rename(str(staging), str(final))
    assert (final / "_manifest.json").read_text() == "{}"
    import os

    with pytest.raises(OSError):  # past the exists-check, the kernel refuses a non-empty destination too
        os.rename(staging, final)
    assert staging.is_dir() and (final / "_manifest.json").read_text() == "{}"


def _with_dead_letters(staging: str) -> str:
    """A staging copy whose range set records aside (a transform's ``_dead_letter`` directory: not a
    data file, so not in the manifest's ``files``)."""
    dead = Path(staging) / "_dead_letter"
    dead.mkdir()
    (dead / "part-dl.parquet").write_bytes(b"records set aside")
    return staging


def test_a_loser_of_the_same_staging_copy_leaves_the_winners_dead_letters(tmp_path: Path) -> None:
    """Both attempts publish the staging copy the ledger names: the loser copied the ``_dead_letter``
    file, stalled, and the winner published the same copy (and deleted it); the loser's next copy
    fails, it finds the range published and withdraws. What it copied is the winner's own output
    (same paths, same bytes): nothing of it may go."""
    store = filesystems.LocalFS(atomic_rename=False)
    final = str(tmp_path / "final")
    s = _with_dead_letters(_staging(tmp_path, "a", 7))
    checks = {"n": 0}

    def stalled_guard() -> None:
        checks["n"] += 1
        if checks["n"] == 3:  # after the dead letters were copied, before the data file: B publishes
            publish(s, final, 7, store)

    publish(s, final, 7, store, guard=stalled_guard)
    assert (Path(final) / "_dead_letter" / "part-dl.parquet").read_bytes() == b"records set aside"
    assert sorted(str(p.relative_to(final)) for p in Path(final).rglob("*") if p.is_file()) == [
        "_dead_letter/part-dl.parquet", "_manifest.json", "part-a.parquet"]


def test_a_loser_refused_its_own_manifest_leaves_the_dead_letters_of_that_copy(tmp_path: Path) -> None:
    """Two byte-identical copies (the twin stands for the same staging copy published by another
    attempt): the loser's manifest is refused, the one in place is its own, so nothing it copied is
    foreign and the dead letters stay."""
    import shutil

    store = filesystems.LocalFS(atomic_rename=False)
    final = str(tmp_path / "final")
    a = _with_dead_letters(_staging(tmp_path, "a", 7))
    twin = tmp_path / "twin"
    shutil.copytree(a, twin)
    checks = {"n": 0}

    def stalled_guard() -> None:
        checks["n"] += 1
        if checks["n"] == 3:  # before A's manifest: the twin copy is published
            publish(str(twin), final, 7, store)

    publish(a, final, 7, store, guard=stalled_guard)
    assert (Path(final) / "_dead_letter" / "part-dl.parquet").read_bytes() == b"records set aside"


def test_an_attempt_stalled_before_moving_a_foreign_directory_aside_leaves_the_winners_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A foreign directory (a partial copy of another staging copy, left by a re-read that crashed)
    is at the range's place. A finds it foreign, looks (not published), and stalls before moving it
    aside; its lease moves on and B moves the foreign directory aside and publishes. A's move aside
    must not take B's output with it."""
    from streamledger.batch import outputs

    clock = iter(range(1_000, 2_000))
    monkeypatch.setattr(outputs.time, "time", lambda: float(next(clock)))  # a stall: another second

    final = tmp_path / "final"
    final.mkdir()
    (final / "part-crashed.parquet").write_bytes(b"a crashed re-read's partial copy")
    a, b = _staging(tmp_path, "a", 7), _staging(tmp_path, "b", 7)
    lost = {"lease": False}

    class Stalling(filesystems.LocalFS):
        def rename(self, src: str, dst: str) -> None:
            if src == str(final) and not lost["lease"]:  # A, about to move the foreign directory aside
                lost["lease"] = True
                publish(b, str(final), 7, filesystems.LocalFS(atomic_rename=False))
            super().rename(src, dst)

    def guard() -> None:
        if lost["lease"]:
            raise RuntimeError("the publish lease was taken over")

    with pytest.raises(outputs.PublishedByAnother, match="range 7: another attempt published"):
        publish(a, str(final), 7, Stalling(atomic_rename=False), guard=guard)
    manifest = read_manifest(str(final), filesystems.LOCAL)
    assert manifest is not None and manifest["written_at"] == "b", manifest


def test_withdrawing_a_dead_losers_leftovers_takes_only_its_own_unlisted_files(tmp_path: Path) -> None:
    """``withdraw_leftovers`` (a retry sweeping an earlier attempt's staging): of the files in the
    published directory, only those the dead loser's copy has and the winner's manifest does not list
    go; a file of no known attempt stays (the audit names it), and a copy whose manifest is the one
    published (the same staging copy) takes nothing."""
    from streamledger.batch.outputs import withdraw_leftovers

    store = filesystems.LocalFS(atomic_rename=False)
    final = tmp_path / "final"
    attempt = tmp_path / "_staging" / "attempt-t1"
    a, b = _staging(attempt, "a", 7), _staging(tmp_path, "b", 7)
    for copy in (a, b):  # staging manifests name the range's final place, as the batch writes them
        data = json.loads((Path(copy) / "_manifest.json").read_text())
        (Path(copy) / "_manifest.json").write_text(json.dumps({**data, "output": str(final)}))
    publish(b, str(final), 7, store)
    (final / "part-a.parquet").write_bytes((Path(a) / "part-a.parquet").read_bytes())  # the dead loser's copy
    (final / "part-unknown.parquet").write_bytes(b"nobody's")
    assert withdraw_leftovers(str(attempt), store) == 1
    assert sorted(p.name for p in final.iterdir()) == [
        "_manifest.json", "part-b.parquet", "part-unknown.parquet"]

    same = tmp_path / "_staging" / "attempt-t2"
    (same / "copy").mkdir(parents=True)
    (same / "copy" / "_manifest.json").write_bytes((final / "_manifest.json").read_bytes())
    (same / "copy" / "part-unknown.parquet").write_bytes(b"nobody's")
    assert withdraw_leftovers(str(same), store) == 0
    assert (final / "part-unknown.parquet").exists()


class _InFlight(filesystems.LocalFS):
    """A store answering a create with a conflict while a PUT of the key is in flight (S3's 409, with
    nothing to read yet): ``lands`` (when not None) is what that PUT writes, 0.2 s after the first
    create; until then every create is refused. With ``lands`` None the in-flight PUT fails: only
    the first create is refused."""

    def __init__(self, lands: bytes | None) -> None:
        super().__init__(atomic_rename=False)
        self.lands, self.until = lands, None

    def create_file(self, uri: str, data: bytes) -> None:
        import threading
        import time

        if self.until is None:
            self.until = time.monotonic() + 0.2
            if self.lands is not None:
                threading.Timer(0.2, filesystems.LOCAL.create_file, (uri, self.lands)).start()
            raise FileExistsError(f"{uri} exists: not replaced (ConditionalRequestConflict)")
        if self.lands is not None and self.read_bytes(uri) is None:
            raise FileExistsError(f"{uri} exists: not replaced (ConditionalRequestConflict)")
        super().create_file(uri, data)


@pytest.mark.parametrize(("lands", "ours"), [(b"ours", True), (b"theirs", False), (None, True)],
                         ids=["our-first-try-lands", "another-put-lands", "nothing-lands"])
def test_a_create_refused_while_a_put_is_in_flight_waits_for_what_lands(
    tmp_path: Path, lands: bytes | None, ours: bool,
) -> None:
    """A refusal with nothing to read yet is asked again: our own in-flight first try landing is
    ours, another's is not, and when nothing lands the create is tried again (and succeeds)."""
    from streamledger.batch.outputs import create_manifest

    store = _InFlight(lands)
    assert create_manifest(str(tmp_path / "d"), b"ours", store) is ours
    assert (tmp_path / "d" / "_manifest.json").read_bytes() == (lands or b"ours")
