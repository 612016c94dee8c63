"""Issue 43, item 7: two attempts of one range publishing on a file system without an atomic rename
(an object store, simulated by ``LocalFS(atomic_rename=False)``), and the local rename's window.

* A stalled attempt whose publish lease moved on while it was inside its manifest PUT (after its last
  guard) overwrites the manifest of the attempt that published meanwhile: a real window on object
  stores, which offer no PUT-if-absent through the file-system layer. Reproduced here (strict xfail:
  the fix needs a conditional write, ``If-None-Match: *``, which ``streamledger.fs`` does not have).
* ``LocalFS.rename`` checks that the destination does not exist, then renames: in between, POSIX
  rename replaces an *empty* directory only (a non-empty one fails with ENOTEMPTY), and an empty
  directory holds no output, so nothing published can be lost there (asserted below).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamledger import fs as filesystems
from streamledger.batch.outputs import publish, read_manifest


def _staging(root: Path, name: str, range_id: int) -> str:
    where = root / f"_staging-{name}"
    where.mkdir(parents=True)
    (where / f"part-{name}.parquet").write_bytes(b"rows of " + name.encode())
    manifest = {"range_id": range_id, "files": [f"part-{name}.parquet"], "written_at": name}
    (where / "_manifest.json").write_text(json.dumps(manifest))
    return str(where)


@pytest.mark.xfail(strict=True, reason="issue 43 item 7: an attempt stalled inside its manifest PUT after "
                   "its last lease check overwrites the winner's manifest on a store without conditional "
                   "writes; needs PUT-if-absent in streamledger.fs")
def test_an_attempt_stalled_in_its_manifest_put_leaves_the_winners_manifest(tmp_path: Path) -> None:
    store = filesystems.LocalFS(atomic_rename=False)
    final = str(tmp_path / "p" / "b" / "s" / "0-100")
    a, b = _staging(tmp_path, "a", 7), _staging(tmp_path, "b", 7)
    checks = {"n": 0}

    def stalled_guard() -> None:  # A's lease check before each file; before its manifest, it stalls
        checks["n"] += 1
        if checks["n"] == 3:  # the lease moved on: B re-read the range and publishes it meanwhile
            publish(b, final, 7, store)

    publish(a, final, 7, store, guard=stalled_guard)
    manifest = read_manifest(final, store)
    assert manifest is not None
    present = sorted(p.name for p in Path(final).iterdir() if not p.name.startswith("_"))
    assert manifest["files"] == present, (manifest, present)


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
